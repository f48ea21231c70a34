#!/usr/bin/env bash
# lm-evaluation-harness on a small local multiple-choice task (bench/lm_eval: 52 general-knowledge
# questions, 4 choices, scored by loglikelihood), run twice on the same GGUF model:
#   1. lm-eval's `hf` model on the model transformers dequantises from the GGUF (float32), saved
#      once by bench/hf_reference.py --save-dir;
#   2. lm-eval's `local-completions` model against `mhsa serve --dtype f32` (127.0.0.1 only), whose
#      /v1/completions answers `echo: true, logprobs: 1, max_tokens: 1` with the prompt's log-probs.
# Prints both accuracies (acc, acc_norm); they should agree within one question (exit status 1 if not).
# lm-eval 0.4.13's local-completions sends max_tokens 1 (not 0) and drops the last log-prob
# (token_logprobs[ctxlen:-1]); mhsa serve takes one prompt per request, hence --batch_size 1.
# Measured (SmolLM2-135M-Instruct Q4_1): hf acc 0.5577 (29/52), acc_norm 0.5577; mhsa the same,
# the same answers on every question, loglikelihoods within 1.1e-4; about 5 minutes on 2 cores.
#
# Usage (from anywhere; needs build/mhsa, pip install "lm_eval[api]" transformers torch gguf accelerate):
#   bench/lm_eval_default_model.sh [GGUF]
# Environment: HF_DIR (the dequantised model, default /tmp/smollm2-135m-instruct-f32), PORT (8123),
#   OUT (lm-eval's results, default /tmp/mhsa_lm_eval), LIMIT_S (each step's time limit, default 1800).
set -euo pipefail
cd "$(dirname "$0")/.."

export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
gguf=${1:-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
hf_dir=${HF_DIR:-/tmp/smollm2-135m-instruct-f32}
port=${PORT:-8123}
out=${OUT:-/tmp/mhsa_lm_eval}
limit=${LIMIT_S:-1800}
task=mhsa_general_knowledge
say() { printf 'lm_eval_default_model.sh: %s\n' "$*"; }

[ -x build/mhsa ] || { say "build/mhsa not found: build it first (scripts/build.sh)"; exit 2; }
if [ ! -f "$hf_dir/model.safetensors" ]; then
  say "saving transformers' float32 dequantisation of $gguf to $hf_dir"
  timeout "$limit" python3 bench/hf_reference.py --gguf "$gguf" --save-dir "$hf_dir"
fi
rm -rf "$out"

say "lm-eval, hf model ($hf_dir)"
timeout "$limit" lm_eval --model hf --model_args "pretrained=$hf_dir,dtype=float32" --device cpu --batch_size 8 \
  --include_path bench/lm_eval --tasks "$task" --output_path "$out/hf" --log_samples

say "mhsa serve --model $gguf --dtype f32 on 127.0.0.1:$port"
timeout "$limit" build/mhsa serve --model "$gguf" --dtype f32 --host 127.0.0.1 --port "$port" \
  >"$out/serve.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || { say "mhsa serve exited:"; cat "$out/serve.log"; exit 1; }
  sleep 1
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { say "mhsa serve not ready after 120 s"; exit 1; }

say "lm-eval, local-completions model (mhsa serve)"
# tokenized_requests=False: lm-eval tokenizes with the saved tokenizer only to find where each
# continuation starts, and sends the text; the server tokenizes it again (its GGUF tokenizer).
timeout "$limit" lm_eval --model local-completions \
  --model_args "model=$(basename "$gguf"),base_url=http://127.0.0.1:$port/v1/completions,tokenizer=$hf_dir,tokenizer_backend=huggingface,tokenized_requests=False,num_concurrent=1,max_retries=1,timeout=300" \
  --batch_size 1 --include_path bench/lm_eval --tasks "$task" --output_path "$out/mhsa" --log_samples

kill "$server" 2>/dev/null || true
wait "$server" 2>/dev/null || true
trap - EXIT

python3 - "$out" "$task" <<'EOF'
import glob, json, sys
out, task = sys.argv[1:]
acc = {}
for name in ("hf", "mhsa"):
    path = sorted(glob.glob(f"{out}/{name}/**/results_*.json", recursive=True))[-1]
    r = json.load(open(path))["results"][task]
    n = json.load(open(path))["n-samples"][task]["effective"]
    acc[name] = (r["acc,none"], r["acc_norm,none"])
    print(f"{name:5s} acc {r['acc,none']:.4f} ({round(r['acc,none'] * n)}/{n}), "
          f"acc_norm {r['acc_norm,none']:.4f} ({round(r['acc_norm,none'] * n)}/{n})")
# per question: which answers differ
docs = {}
for name in ("hf", "mhsa"):
    path = sorted(glob.glob(f"{out}/{name}/**/samples_{task}_*.jsonl", recursive=True))[-1]
    docs[name] = {s["doc_id"]: s for s in map(json.loads, open(path))}
diff = [d for d in docs["hf"] if docs["hf"][d]["acc"] != docs["mhsa"][d]["acc"]]
worst = 0.0
for d in docs["hf"]:
    a = [x[0] for x in docs["hf"][d]["filtered_resps"]]
    b = [x[0] for x in docs["mhsa"][d]["filtered_resps"]]
    worst = max(worst, max(abs(float(x) - float(y)) for x, y in zip(a, b)))
print(f"questions answered differently (acc): {diff or 'none'}; "
      f"largest |loglikelihood difference| over all choices: {worst:.2e}")
sys.exit(0 if len(diff) <= 1 else 1)
EOF
