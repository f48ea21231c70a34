#!/usr/bin/env python3
"""A model with random fp32 weights through mhsa and llama.cpp in one run: prompt processing of
512 tokens (pp512) and decoding of 128 (tg128), as llama-bench defines them. GPT-2 124M by default
(mhsa's built-in random GPT-2 against a converted random GPT2LMHeadModel); with --arch smollm2 or
--model-dir DIR, the same Hugging Face directory for both engines: mhsa loads DIR, llama.cpp runs
the F32 GGUF that its own convert_hf_to_gguf.py makes of DIR (--arch smollm2 writes a random
SmolLM2-135M-shaped LlamaForCausalLM there first, bench/random_hf_model.py).

Decode speed on these shared hosts is bimodal (memory bandwidth has swung between 38 and 76 GB/s
within minutes), so a ratio of two numbers taken minutes apart, or of one engine's best against
the other's mean, says more about the moment than about the engines. This script therefore
- runs the two in paired rounds, alternating which goes first (mhsa, llama.cpp; llama.cpp, mhsa;
  ...), so each round's two measurements are minutes apart at most and neither always goes first;
- takes the same statistic from both: the median of each engine's timed repetitions in a round
  (mhsa bench's median_seconds; the median of llama-bench's per-repetition samples);
- prints every round's ratio, and summarises with the median of the paired ratios and their
  range (min–max).

Usage: python3 bench/compare_llama_cpp.py [--rounds 6] [--threads 2] [--arch gpt2|smollm2 | --model-dir DIR |
                                          --gguf FILE [--peer-gguf FILE]]
                                         [--dtype f32|bf16|f16|q8_0|q4_k [--peer-outtype f32|f16|bf16|q8_0]] [--only pp|tg]
With a model directory, mhsa runs `mhsa bench --model DIR --filter pp512,tg128` and reads the cases
whose names end in _pp512 and _tg128. --dtype compares another precision: mhsa loads DIR with
`--dtype`, llama.cpp runs the GGUF its converter writes with `--outtype` the same (or
--peer-outtype: f16 where llama.cpp's 16-bit path is faster than its bf16 one); it needs a model
directory. --gguf FILE: a GGUF file for both engines, as it is (no conversion): mhsa loads it with
--dtype, llama.cpp runs it (or --peer-gguf FILE: e.g. a Q8_0 copy against mhsa's q8_0 of a Q4_1 file).
--only runs one of the two tests.
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
TESTS = (("pp", "gpt2_124M_pp512", "pp512"), ("tg", "gpt2_124M_tg128", "tg128"))


def mhsa_run(cli, threads, model_dir, dtype="f32"):
    """tokens/s of each test: tokens / the median of mhsa bench's timed runs (3 or more, 2 s at least)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        if model_dir:
            select = ["--model", str(model_dir), "--dtype", dtype,
                      "--filter", ",".join(label for _, _, label in TESTS)]
        else:
            select = ["--filter", ",".join(name for _, name, _ in TESTS)]
        subprocess.run([str(cli), "bench", *select, "--min-seconds", "2", "--json", f.name], check=True, env=env,
                       stdout=sys.stderr)
        data = json.load(open(f.name))
    rates = {}
    for key, name, label in TESTS:
        case = [c for c in data["cases"] if (c["name"].endswith("_" + label) if model_dir else c["name"] == name)]
        if len(case) != 1:
            raise SystemExit(f"mhsa bench gave {len(case)} cases for {label}: {[c['name'] for c in data['cases']]}")
        rates[key] = case[0]["tokens"] / case[0]["median_seconds"]
    return data, rates


def peer_run(threads, reps, model_dir, outtype="f32", gguf=None):
    """tokens/s of each test: the median of llama-bench's per-repetition samples."""
    env = dict(os.environ, MHSA_PEER_THREADS=str(threads), MHSA_PEER_REPS=str(reps), MHSA_PEER_OUTTYPE=outtype)
    if gguf:
        env["MHSA_PEER_GGUF"] = str(gguf)
    elif model_dir:
        env["MHSA_PEER_HF_DIR"] = str(model_dir)
    out = subprocess.run(["bash", str(ROOT / "bench" / "llama_cpp_peer.sh")], check=True, env=env,
                         capture_output=True, text=True)
    j = json.loads([l for l in out.stdout.splitlines() if l.strip().startswith("{")][-1])
    rates = {}
    for key, _, label in TESTS:
        samples = j.get(f"{label}_samples") or [j[f"{label}_tokens_per_s"]]
        rates[key] = statistics.median(samples)
    return j, rates


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="paired rounds (default 6)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5, help="llama-bench repetitions per round")
    ap.add_argument("--cli", default=str(ROOT / "build" / "mhsa"))
    ap.add_argument("--arch", choices=("gpt2", "smollm2"), default="gpt2",
                    help="the random model (default gpt2: mhsa's built-in GPT-2 124M)")
    ap.add_argument("--model-dir", type=Path, help="a Hugging Face model directory for both engines")
    ap.add_argument("--gguf", type=Path, help="a GGUF file for both engines (as it is: no conversion)")
    ap.add_argument("--peer-gguf", type=Path, help="with --gguf: the GGUF file llama.cpp runs instead")
    ap.add_argument("--only-peer", action="store_true", help="run llama.cpp alone (no ratios)")
    ap.add_argument("--dtype", choices=("f32", "bf16", "f16", "q8_0", "q4_k"), default="f32",
                    help="mhsa's weights (and llama.cpp's, unless --peer-outtype); needs --model-dir, --gguf or --arch smollm2")
    ap.add_argument("--peer-outtype", choices=("f32", "f16", "bf16", "q8_0"),
                    help="the GGUF type llama.cpp runs (default: --dtype's)")
    ap.add_argument("--only", choices=("pp", "tg"), help="run only prompt processing (pp512) or decoding (tg128)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds: expected >= 1, got {args.rounds}")
    if args.peer_gguf and not args.gguf:
        ap.error("--peer-gguf: expected with --gguf")
    if args.gguf and args.model_dir:
        ap.error("--gguf and --model-dir: expected one of them")
    if args.dtype != "f32" and args.model_dir is None and args.gguf is None and args.arch == "gpt2":
        ap.error("--dtype: mhsa's built-in GPT-2 is f32; give --model-dir DIR (bench/random_hf_model.py writes one)")
    outtype = args.peer_outtype or args.dtype
    global TESTS
    if args.only:
        TESTS = tuple(t for t in TESTS if t[0] == args.only)
    model_dir = args.model_dir or args.gguf  # what mhsa loads
    peer_gguf = args.peer_gguf or args.gguf  # what llama.cpp runs as it is (None: it converts model_dir)
    if peer_gguf:
        outtype = peer_gguf.name
    if model_dir is None and args.arch != "gpt2":
        model_dir = Path(os.environ.get("MHSA_PEER_DIR", ROOT / "build" / "peer")) / f"{args.arch}-random-hf"
        if not (model_dir / "config.json").exists():
            subprocess.run([sys.executable, str(ROOT / "bench" / "random_hf_model.py"), "--arch", args.arch,
                            str(model_dir)], check=True)
    name = model_dir.name if model_dir else "GPT-2 124M"
    if args.only_peer:
        for r in range(args.rounds):
            j, rates = peer_run(args.threads, args.reps, model_dir, outtype, peer_gguf)
            print(f"round {r + 1}: llama.cpp " + "  ".join(f"{label} {rates[key]:.1f} tokens/s" for key, _, label in TESTS)
                  + f" ({j.get('model', '?')}; {j.get('llama_cpp_version', '?')}; cpu busy before "
                    f"{j.get('cpu_busy_pct_before', '?')}%)")
        return
    rounds, info = [], {}
    for r in range(args.rounds):
        order = ("mhsa", "llama.cpp") if r % 2 == 0 else ("llama.cpp", "mhsa")
        rates = {}
        for engine in order:
            print(f"round {r + 1}/{args.rounds}: {engine}", file=sys.stderr, flush=True)
            if engine == "mhsa":
                info["mhsa"], rates["mhsa"] = mhsa_run(args.cli, args.threads, model_dir, args.dtype)
            else:
                info["llama.cpp"], rates["llama.cpp"] = peer_run(args.threads, args.reps, model_dir, outtype, peer_gguf)
        rounds.append(rates)
        print("  " + "  ".join(f"{label} {rates['mhsa'][key]:.1f} vs {rates['llama.cpp'][key]:.1f} tokens/s "
                               f"({rates['mhsa'][key] / rates['llama.cpp'][key]:.2f}x)" for key, _, label in TESTS),
              file=sys.stderr, flush=True)
    peak, bw = info["mhsa"]["fma_peak_gflops"], info["mhsa"]["read_bandwidth_gbs"]
    print(f"{name} mhsa {args.dtype} against llama.cpp {outtype if peer_gguf else outtype.upper()}, {args.threads} threads, {args.rounds} paired rounds (alternating order), "
          f"median of each engine's repetitions per round; llama.cpp {info['llama.cpp'].get('llama_cpp_version', '?')}; "
          f"last measured peak {peak:.1f} GFLOP/s, read bandwidth {bw:.1f} GB/s")
    print(f"{'round':>5} " + " ".join(f"{label + ' mhsa':>11} {'llama.cpp':>10} {'ratio':>6}" for _, _, label in TESTS))
    for i, rates in enumerate(rounds):
        print(f"{i + 1:>5} " + " ".join(f"{rates['mhsa'][key]:11.1f} {rates['llama.cpp'][key]:10.1f} "
                                         f"{rates['mhsa'][key] / rates['llama.cpp'][key]:5.2f}x" for key, _, _ in TESTS))
    for key, _, label in TESTS:
        ratios = [rates["mhsa"][key] / rates["llama.cpp"][key] for rates in rounds]
        print(f"{label}: median of paired ratios {statistics.median(ratios):.2f}x "
              f"(range {min(ratios):.2f}-{max(ratios):.2f}x over {len(ratios)} rounds); "
              f"mhsa median {statistics.median(r['mhsa'][key] for r in rounds):.1f} tokens/s, "
              f"llama.cpp median {statistics.median(r['llama.cpp'][key] for r in rounds):.1f} tokens/s")


if __name__ == "__main__":
    main()
