#!/usr/bin/env bash
# Reproduces the embedded default model (models/default): a byte-level GPT trained by `mhsa train`
# on the King James Bible as Debian's bible-kjv-text package holds it (public domain), extracted
# with the package's own `bible` program. About 45 minutes on 2 cores. See docs/default-model.md.
#   scripts/train_default_model.sh [OUT]      (default OUT: build/default-model; then
#   python3 scripts/export_default_model.py OUT models/default  stores it as F16 for the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/default-model}
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
command -v bible >/dev/null || $sudo apt-get install -y -qq --no-install-recommends bible-kjv bible-kjv-text >/dev/null
mkdir -p build
COLUMNS=80 bible -l80 "gen1:1-rev22:21" > build/kjv.txt   # 4,298,239 bytes, md5 f6da5ed3dff9e3ebfbb4fe1fcf5bd5ea
OMP_NUM_THREADS=2 build/mhsa train --data build/kjv.txt --out "$out" \
  --layers 4 --heads 4 --embd 256 --context 512 --batch 8 --steps 2000 --warmup 100 --lr 1.5e-3 \
  --weight-decay 0.1 --clip 1 --seed 1 --val-fraction 0.05 --eval-every 100 --checkpoint-every 100 "${@:2}"
