#!/usr/bin/env python3
"""Runs `mhsa bench` and the same cases through PyTorch in the same run, and prints the ratios.

PyTorch peers: scaled_dot_product_attention with its default CPU backend (the flash kernel) and
with the math backend, autograd through it for the backward (its forward time subtracted), torch.nn.MultiheadAttention, torch.addmm for the projection GEMM, and
scaled_dot_product_attention for one decode query. Usage (after scripts/build.sh):

    python3 bench/compare_torch.py [--mhsa build/mhsa] [--threads 2] [--filter attention]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def best_seconds(fn, min_seconds):
    """Best time of repeated calls: one warm-up, then at least 3 runs and min_seconds in total."""
    fn()
    best, total, runs = float("inf"), 0.0, 0
    while runs < 3 or total < min_seconds:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, total, runs = min(best, dt), total + dt, runs + 1
    return best


def attention_peers(name, min_seconds):
    _, h, t, d, mode = name.split("_")
    H, T, D, causal = int(h[1:]), int(t[1:]), int(d[1:]), mode == "causal"
    q, k, v = (torch.randn(1, H, T, D) for _ in range(3))
    out = {"torch flash": best_seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), min_seconds)}
    with sdpa_kernel(SDPBackend.MATH):
        out["torch math"] = best_seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), min_seconds)
    return out


def backward_peers(name, min_seconds):
    """Autograd through scaled_dot_product_attention (the CPU flash backend): the backward alone."""
    _, h, t, d, mode = name.split("_")
    H, T, D, causal = int(h[1:]), int(t[1:]), int(d[1:]), mode == "causal"
    q, k, v = (torch.randn(1, H, T, D, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, H, T, D)

    def run():
        with torch.enable_grad():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.autograd.grad(out, (q, k, v), dout)

    forward_only = best_seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), min_seconds)
    return {"torch autograd (minus fwd)": best_seconds(run, min_seconds) - forward_only}


def decode_peers(name, min_seconds):
    _, h, tk, d = name.split("_")
    H, Tk, D = int(h[1:]), int(tk[2:]), int(d[1:])
    q, k, v = torch.randn(1, H, 1, D), torch.randn(1, H, Tk, D), torch.randn(1, H, Tk, D)
    return {"torch sdpa": best_seconds(lambda: F.scaled_dot_product_attention(q, k, v), min_seconds)}


def mha_peers(name, min_seconds):
    _, c, h, t, _ = name.split("_")
    C, H, T = int(c[1:]), int(h[1:]), int(t[1:])
    m = torch.nn.MultiheadAttention(C, H, batch_first=True).eval()
    x = torch.randn(1, T, C)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(T)
    return {"torch MultiheadAttention": best_seconds(
        lambda: m(x, x, x, attn_mask=mask, is_causal=True, need_weights=False), min_seconds)}


def gemm_peers(name, min_seconds):
    _, m, k, n = name.split("_")
    M, K, N = int(m[1:]), int(k[1:]), int(n[1:])
    a, b, bias = torch.randn(M, K), torch.randn(K, N), torch.randn(N)
    return {"torch addmm": best_seconds(lambda: torch.addmm(bias, a, b), min_seconds)}


PEERS = {"attention": attention_peers, "backward": backward_peers, "decode": decode_peers, "mha": mha_peers, "gemm": gemm_peers}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mhsa", default=os.path.join(os.path.dirname(__file__), "..", "build", "mhsa"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--filter", default="")
    ap.add_argument("--min-seconds", type=float, default=1.0)
    args = ap.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mhsa.json")
        subprocess.run([args.mhsa, "bench", "--filter", args.filter, "--min-seconds", str(args.min_seconds),
                        "--json", path], env=env, check=True)
        with open(path) as f:
            ours = json.load(f)

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    print(f"\nPyTorch {torch.__version__}, {torch.get_num_threads()} thread(s), same run; ratio = peer time / mhsa time")
    print(f"{'case':32} {'peer':26} {'peer ms':>9} {'mhsa ms':>9} {'ratio':>7}")
    for case in ours["cases"]:
        peers = PEERS[case["name"].split("_")[0]](case["name"], args.min_seconds)
        for peer, seconds in peers.items():
            print(f"{case['name']:32} {peer:26} {seconds * 1e3:9.3f} {case['seconds'] * 1e3:9.3f} "
                  f"{seconds / case['seconds']:6.2f}x")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
