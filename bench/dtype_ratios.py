#!/usr/bin/env python3
"""Decode (tg128) or prompt (pp512) speed of one model directory in several weight types, in the
same run: `mhsa bench --model DIR --dtype D --filter tg128` for each D in turn, round after round,
the order rotating so that no type always goes first. Prints every round's tokens/s and, per
type, the median of its paired ratios to the first type (f32 by default) with their range: the
numbers issue 14 asks for ("bf16 tg128 >= 1.8x its own fp32"), taken on a host whose speed drifts
by tens of percent within minutes, where only measurements a minute apart can be compared. Each
run also reports the read bandwidth mhsa bench measured as it started; where a host's memory
flips between states within a round (a 2-core Zen 5 flipped between ~45 and ~85 GB/s every few
seconds), the ratios are also given over the rounds whose runs all measured the memory within
15% of each other.

  dtype_ratios.py --model DIR [--dtypes f32,bf16,q8_0,q4_k] [--test tg128] [--rounds 6] [-t 2]
                  [--min-seconds 1] [--cli build/mhsa]

Not a test: it passes or fails nothing.
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


def rate(cli, model, dtype, test, threads, min_seconds):
    """(tokens/s, GB/s): tokens / the median of mhsa bench's timed runs of the one case, and the
    read bandwidth it measured before them."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        subprocess.run([str(cli), "bench", "--model", str(model), "--dtype", dtype, "--filter", test, "-t",
                        str(threads), "--min-seconds", str(min_seconds), "--json", f.name],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        result = json.load(open(f.name))
    cases = [c for c in result["cases"] if c["name"].endswith("_" + test)]
    if len(cases) != 1:
        raise SystemExit(f"dtype_ratios: mhsa bench gave {len(cases)} cases ending in _{test} for --dtype {dtype}")
    return cases[0]["tokens"] / cases[0]["median_seconds"], result.get("read_bandwidth_gbs", float("nan"))


def same_state(bandwidths, tolerance=0.15):
    """Whether every run of a round measured the memory within `tolerance` of the others."""
    return max(bandwidths) <= (1 + tolerance) * min(bandwidths)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="a model directory (bench/random_hf_model.py)")
    ap.add_argument("--dtypes", default="f32,bf16,q8_0", help="comma-separated; ratios are to the first")
    ap.add_argument("--test", default="tg128", choices=("tg128", "pp512"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--cli", type=Path, default=ROOT / "build" / "mhsa")
    a = ap.parse_args()
    dtypes = [d for d in a.dtypes.split(",") if d]
    if len(dtypes) < 2:
        ap.error(f"--dtypes: expected two or more, got {a.dtypes!r}")
    if a.rounds < 1:
        ap.error(f"--rounds: expected >= 1, got {a.rounds}")
    rows, memory = [], []  # per round: tokens/s and GB/s by type
    for r in range(a.rounds):
        k = r % len(dtypes)
        row, gbs = {}, {}
        for d in dtypes[k:] + dtypes[:k]:
            row[d], gbs[d] = rate(a.cli, a.model, d, a.test, a.threads, a.min_seconds)
        rows.append(row)
        memory.append(gbs)
        print(f"round {r + 1}: " + "  ".join(f"{d} {row[d]:.1f}" for d in dtypes) + " tokens/s; " +
              "  ".join(f"{d}/{dtypes[0]} {row[d] / row[dtypes[0]]:.2f}" for d in dtypes[1:]) +
              "; memory " + " ".join(f"{gbs[d]:.0f}" for d in dtypes) + " GB/s", flush=True)
    print(f"{a.model.name} {a.test}, {a.threads} threads, {a.rounds} rounds: " +
          "; ".join(f"{d} median {statistics.median(r[d] for r in rows):.1f} tokens/s" for d in dtypes))
    steady = [i for i, g in enumerate(memory) if same_state([g[d] for d in dtypes])]
    for d in dtypes[1:]:
        ratios = [r[d] / r[dtypes[0]] for r in rows]
        line = (f"  {d} / {dtypes[0]}: median of paired ratios {statistics.median(ratios):.2f}x "
                f"(range {min(ratios):.2f}-{max(ratios):.2f})")
        if steady:
            kept = [ratios[i] for i in steady]
            line += (f"; over the {len(kept)} rounds whose runs measured the memory alike "
                     f"{statistics.median(kept):.2f}x (range {min(kept):.2f}-{max(kept):.2f})")
        else:
            line += "; no round's runs measured the memory alike"
        print(line)


if __name__ == "__main__":
    sys.exit(main())
