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


class TorchGpt2(torch.nn.Module):
    """GPT-2 written directly in PyTorch the way a careful user would (nanoGPT's layout): fused
    QKV projection, scaled_dot_product_attention(is_causal=True), GELU-tanh, tied head, cross-entropy
    over the full logits."""

    def __init__(self, layers=12, heads=12, embd=768, context=1024, vocab=50257):
        super().__init__()
        nn = torch.nn
        self.heads = heads
        self.wte, self.wpe = nn.Embedding(vocab, embd), nn.Embedding(context, embd)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            b = nn.Module()
            b.ln_1, b.ln_2 = nn.LayerNorm(embd), nn.LayerNorm(embd)
            b.c_attn, b.c_proj = nn.Linear(embd, 3 * embd), nn.Linear(embd, embd)
            b.c_fc, b.mlp_proj = nn.Linear(embd, 4 * embd), nn.Linear(4 * embd, embd)
            self.blocks.append(b)
        self.ln_f = nn.LayerNorm(embd)

    def forward(self, ids, targets):
        B, T = ids.shape
        x = self.wte(ids) + self.wpe(torch.arange(T))
        for b in self.blocks:
            q, k, v = b.c_attn(b.ln_1(x)).split(x.shape[-1], dim=-1)
            q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
            x = x + b.c_proj(a)
            x = x + b.mlp_proj(F.gelu(b.c_fc(b.ln_2(x)), approximate="tanh"))
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(B * T, -1), targets.view(-1))


def train_step(model, opt, ids, targets):
    opt.zero_grad(set_to_none=True)
    with torch.enable_grad():
        loss = model(ids, targets)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def adamw(model):
    """AdamW as mhsa bench runs it: betas (0.9, 0.95), weight decay 0.1 on matrices only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                             lr=1e-4, betas=(0.9, 0.95), eps=1e-8)


def gpt2_peers(name, min_seconds):
    """Training steps of the 124M model (forward, loss, backward, clipping, AdamW): PyTorch eager
    on the same shape, written directly and as transformers' GPT2LMHeadModel (sdpa attention)."""
    parts = name.split("_")
    if parts[2] != "train":
        return {}  # prefill and decode: the peer is llama.cpp (bench/compare_llama_cpp.py)
    B, T = int(parts[3][1:]), int(parts[4][1:])
    ids = torch.randint(0, 50257, (B, T + 1))
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    out = {}
    torch.manual_seed(0)
    model = TorchGpt2().train()
    opt = adamw(model)
    out["torch eager GPT-2"] = best_seconds(lambda: train_step(model, opt, x, y), min_seconds)
    del model, opt
    try:
        import transformers
    except ImportError:
        return out
    cfg = transformers.GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = transformers.GPT2LMHeadModel(cfg).train()
    hf.config._attn_implementation = "sdpa"
    opt = adamw(hf)

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = hf

        def forward(self, ids, targets):
            logits = self.m(input_ids=ids).logits
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    wrapped = Wrap()
    out["transformers GPT2LMHeadModel"] = best_seconds(lambda: train_step(wrapped, opt, x, y), min_seconds)
    return out


PEERS = {"gpt2": gpt2_peers, "attention": attention_peers, "backward": backward_peers, "decode": decode_peers, "mha": mha_peers, "gemm": gemm_peers}


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
        kind = case["name"].split("_")[0]
        if kind in ("attention", "backward") and len(case["name"].split("_")) > 5:
            print(f"{case['name']:32} (a window or soft-cap variant: PyTorch's kernels have no peer)")
            continue
        peers = PEERS[kind](case["name"], args.min_seconds)
        for peer, seconds in peers.items():
            print(f"{case['name']:32} {peer:26} {seconds * 1e3:9.3f} {case['seconds'] * 1e3:9.3f} "
                  f"{seconds / case['seconds']:6.2f}x")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
