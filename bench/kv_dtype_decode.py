#!/usr/bin/env python3
"""Decode speed of one model at a long context with several KV cache types, in paired rounds in
one process: the model is loaded once per type (Model.load(kv_dtype=T)), each cache prefilled with
the same random prompt, then every round decodes `--tokens` tokens with each type in turn (order
rotated, so that no type always goes first), timing each. Prints every round and, per type, the
median tokens/s and the median of its paired ratios to the first type with their range: on a
shared host whose speed drifts within minutes only measurements seconds apart compare.

  PYTHONPATH=build/python OMP_NUM_THREADS=1 python3 bench/kv_dtype_decode.py [--model smollm2]
      [--types f32,f16,q8_0] [--context 4000] [--tokens 16] [--rounds 8]
"""
import argparse
import statistics
import time

import numpy as np

import mhsa


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a model directory, GGUF file or name (default: the default model)")
    ap.add_argument("--types", default="f32,f16,q8_0", help="KV types, the first the baseline")
    ap.add_argument("--context", type=int, default=4000, help="prompt tokens before decoding")
    ap.add_argument("--tokens", type=int, default=16, help="tokens decoded per type per round")
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    types = a.types.split(",")
    models, caches, last = {}, {}, {}
    for kv in types:
        m = mhsa.Model.load(a.model, kv_dtype=kv)
        prompt = np.random.default_rng(0).integers(0, m.config["vocab_size"], size=a.context)
        c = m.new_cache(1, a.context + a.tokens * a.rounds + 8)
        t = time.perf_counter()
        logits = m.extend(c, prompt[None, :], last_only=True)
        print(f"prefill {kv}: {time.perf_counter() - t:.1f} s", flush=True)
        models[kv], caches[kv], last[kv] = m, c, int(np.argmax(logits))
    rates = {kv: [] for kv in types}
    for r in range(a.rounds):
        for kv in types[r % len(types):] + types[:r % len(types)]:
            m, c = models[kv], caches[kv]
            t = time.perf_counter()
            for _ in range(a.tokens):
                last[kv] = int(np.argmax(m.extend(c, np.array([[last[kv]]]), last_only=True)))
            rates[kv].append(a.tokens / (time.perf_counter() - t))
        load = open("/proc/loadavg").read().split()[0]
        print(f"round {r}: " + "  ".join(f"{kv} {rates[kv][-1]:.1f}" for kv in types) + f" tokens/s (load {load})",
              flush=True)
    for kv in types:
        ratio = [x / y for x, y in zip(rates[kv], rates[types[0]])]
        print(f"{kv}: median {statistics.median(rates[kv]):.1f} tokens/s ({min(rates[kv]):.1f}-{max(rates[kv]):.1f}); "
              f"vs {types[0]} median {statistics.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f})")


if __name__ == "__main__":
    main()
