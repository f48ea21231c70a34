#!/usr/bin/env bash
# scripts/web_chat_screenshots.sh — takes the screenshots of docs/web-chat.md (docs/images/web-chat*.png)
# by running the web chat's browser tests with MHSA_WEB_CHAT_SCREENSHOTS set: the pictures are the
# states the tests check. Needs build/mhsa, the default model (scripts/setup.sh) and Chromium with
# Playwright (scripts/setup.sh --test). The PNGs are then shrunk losslessly when optipng is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p docs/images
MHSA_REQUIRE_BROWSER=1 MHSA_WEB_CHAT_SCREENSHOTS="$PWD/docs/images" \
  python3 -m pytest -q tests/python/test_web_chat.py -k "browser or markdown"
if command -v optipng >/dev/null; then optipng -quiet -o2 docs/images/web-chat*.png; fi
ls -l docs/images/web-chat*.png
