#!/usr/bin/env python3
"""GPT-2 124M (fp32, random weights) through mhsa and llama.cpp in one run: prompt processing of
512 tokens (pp512) and decoding of 128 (tg128), as llama-bench defines them.

Runs `mhsa bench --filter gpt2` and bench/llama_cpp_peer.sh alternately (mhsa, llama.cpp, mhsa,
...), so that both see the same machine, and prints each one's best and median with the ratios.
Usage: python3 bench/compare_llama_cpp.py [--rounds 2] [--threads 2]
The first run builds llama.cpp from PyPI's llama-cpp-python sdist (several minutes); later runs
reuse it (see bench/llama_cpp_peer.sh).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mhsa_run(cli, threads):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        subprocess.run([str(cli), "bench", "--filter", "gpt2", "--min-seconds", "2", "--json", f.name], check=True,
                       env=env, stdout=sys.stderr)
        data = json.load(open(f.name))
    rates = {c["name"]: c["tokens"] / c["seconds"] for c in data["cases"]}
    return data, rates["gpt2_124M_pp512"], rates["gpt2_124M_tg128"]


def peer_run(threads):
    env = dict(os.environ, MHSA_PEER_THREADS=str(threads))
    out = subprocess.run(["bash", str(ROOT / "bench" / "llama_cpp_peer.sh")], check=True, env=env,
                         capture_output=True, text=True)
    line = [l for l in out.stdout.splitlines() if l.strip().startswith("{")][-1]
    j = json.loads(line)
    return j, j["pp512_tokens_per_s"], j["tg128_tokens_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cli", default=str(ROOT / "build" / "mhsa"))
    args = ap.parse_args()
    ours, peer, info = {"pp": [], "tg": []}, {"pp": [], "tg": []}, {}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}: mhsa", file=sys.stderr)
        data, pp, tg = mhsa_run(args.cli, args.threads)
        ours["pp"].append(pp), ours["tg"].append(tg)
        info["mhsa"] = data
        print(f"round {r + 1}/{args.rounds}: llama.cpp", file=sys.stderr)
        j, pp, tg = peer_run(args.threads)
        peer["pp"].append(pp), peer["tg"].append(tg)
        info["llama.cpp"] = j
    peak, bw = info["mhsa"]["fma_peak_gflops"], info["mhsa"]["read_bandwidth_gbs"]
    print(f"GPT-2 124M fp32, {args.threads} threads, {args.rounds} rounds; "
          f"llama.cpp {info['llama.cpp'].get('llama_cpp_version', '?')}; last measured peak {peak:.1f} GFLOP/s, "
          f"read bandwidth {bw:.1f} GB/s")
    print(f"{'test':8} {'mhsa best':>10} {'median':>8} {'llama.cpp best':>15} {'median':>8} {'ratio (best)':>13}")
    for key, name in (("pp", "pp512"), ("tg", "tg128")):
        a, b = ours[key], peer[key]
        print(f"{name:8} {max(a):10.1f} {statistics.median(a):8.1f} {max(b):15.1f} {statistics.median(b):8.1f} "
              f"{max(a) / max(b):12.2f}x")


if __name__ == "__main__":
    main()
