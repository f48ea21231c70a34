#!/usr/bin/env bash
# scripts/web_chat_screenshots.sh — takes the screenshots of docs/web-chat.md (docs/images/web-chat*.png)
# by running the web chat's browser tests with MHSA_WEB_CHAT_SCREENSHOTS set: the pictures are the
# states the tests check. Needs build/mhsa, the default model (scripts/setup.sh) and Chromium with
# Playwright (scripts/setup.sh --test). The PNGs are then cut to 256 colours (Pillow): less than half
# the bytes, no difference to see (the heat maps' scale has 256 colours).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p docs/images
MHSA_REQUIRE_BROWSER=1 MHSA_WEB_CHAT_SCREENSHOTS="$PWD/docs/images" \
  python3 -m pytest -q tests/python/test_web_chat.py -k "browser or markdown"
python3 - docs/images/web-chat*.png <<'PY'
import sys
from PIL import Image
for path in sys.argv[1:]:
    image = Image.open(path).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)
PY
ls -l docs/images/web-chat*.png
