#!/usr/bin/env python3
"""mhsa.torch against PyTorch's own CPU attention, in one process, in paired rounds.

- op: scaled_dot_product_attention forward and forward+backward (autograd) on q, k, v
  [B, H, T, D] (GPT-2 shapes, causal), mhsa.torch's op against torch's default CPU backend (its
  flash kernel for float32).
- step: one training step (forward, loss, backward) of a GPT-2 124M-shaped GPT2LMHeadModel
  (transformers, attn_implementation="sdpa", random weights, train mode) at T tokens, with and
  without mhsa.torch.patch().

--dtype bfloat16|float16 runs the op on 16-bit tensors (mhsa widens them; bfloat16 on AVX512_BF16's
dot product where the CPU has it, else float32; PyTorch's CPU flash kernel has its own 16-bit path);
the step stays float32.

- bf16 (issue 14): mhsa's bfloat16 forward against its own float32 forward and against torch's
  bfloat16 flash kernel, and the backward alone (autograd through a kept graph) against torch's;
  causal unless --full. `--what bf16 --T 4096` is the issue's B1 H12 T4096 D64.

--dropout P sets dropout_p for the op and GPT-2's attn_pdrop, resid_pdrop and embd_pdrop for the
step (GPT-2's own config has 0.1; the default here is 0). PyTorch's CPU flash kernel has no
dropout: with P > 0 its sdpa runs the math path (the T×T matrix), mhsa's kernels do not.

Each round times both sides back to back, alternating which goes first, and takes the median of
each side's repetitions; the summary is the median of the per-round ratios and their range.
Absolute times on a shared host drift; ratios from one run are steadier.

Usage (after building the _core target; PYTHONPATH=build/python):
    python3 bench/torch_op.py [--threads 2] [--rounds 5] [--what op,step,bf16] [--full] [--T 1024] [--batch 1] [--dropout 0.1] [--dtype float32]
"""

import argparse
import os
import statistics
import sys
import time


def median_seconds(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def paired(name, ours, theirs, rounds, reps, labels=("mhsa", "torch")):
    """Prints each round's times and the ratio theirs / ours (> 1: ours is faster)."""
    a, b = labels
    ratios = []
    for r in range(rounds):
        order = [(a, ours), (b, theirs)]
        if r % 2:
            order.reverse()
        t = {side: median_seconds(fn, reps) for side, fn in order}
        ratios.append(t[b] / t[a])
        print(f"  {name} round {r}: {a} {t[a] * 1e3:9.1f} ms  {b} {t[b] * 1e3:9.1f} ms  "
              f"ratio {ratios[-1]:.2f}", flush=True)
    print(f"{name}: {b} / {a} = {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}, "
          f"{rounds} rounds)", flush=True)


def bench_op(args, torch, F, mt):
    B, H, T, D = args.batch, 12, args.T, 64
    gen = torch.Generator().manual_seed(0)
    dtype = getattr(torch, args.dtype)
    q, k, v = (torch.randn(B, H, T, D, generator=gen).to(dtype).requires_grad_() for _ in range(3))
    dout = torch.randn(B, H, T, D, generator=gen).to(dtype)
    original = mt._ORIGINAL

    def forward(fn):
        def run():
            with torch.no_grad():
                fn(q, k, v, is_causal=True, dropout_p=args.dropout)
        return run

    def forward_backward(fn):
        def run():
            torch.autograd.grad(fn(q, k, v, is_causal=True, dropout_p=args.dropout), (q, k, v), dout)
        return run

    shape = f"B={B} H={H} T={T} D={D} {args.dtype} causal dropout={args.dropout}"
    paired(f"op forward {shape}", forward(mt.scaled_dot_product_attention), forward(original), args.rounds, 5)
    paired(f"op forward+backward {shape}", forward_backward(mt.scaled_dot_product_attention),
           forward_backward(original), args.rounds, 5)


def bench_bf16(args, torch, F, mt):
    """Issue 14's bfloat16 attention: mhsa's bfloat16 forward against its float32 forward and against
    torch's bfloat16 flash kernel; the backward alone (autograd through a kept graph) against torch's."""
    B, H, T, D = args.batch, 12, args.T, 64
    gen = torch.Generator().manual_seed(0)
    q32, k32, v32 = (torch.randn(B, H, T, D, generator=gen) for _ in range(3))
    dout = torch.randn(B, H, T, D, generator=gen).to(torch.bfloat16)
    q16, k16, v16 = (x.to(torch.bfloat16) for x in (q32, k32, v32))
    original = mt._ORIGINAL

    def forward(fn, q, k, v):
        def run():
            with torch.no_grad():
                fn(q, k, v, is_causal=args.causal)
        return run

    def backward(fn):
        q, k, v = (x.detach().requires_grad_() for x in (q16, k16, v16))
        out = fn(q, k, v, is_causal=args.causal)

        def run():
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        return run

    shape = f"B={B} H={H} T={T} D={D} {'causal' if args.causal else 'full'}"
    paired(f"mhsa forward bf16 vs float32 {shape}", forward(mt.scaled_dot_product_attention, q16, k16, v16),
           forward(mt.scaled_dot_product_attention, q32, k32, v32), args.rounds, 5, ("mhsa bf16", "mhsa f32"))
    paired(f"forward bf16 {shape}", forward(mt.scaled_dot_product_attention, q16, k16, v16),
           forward(original, q16, k16, v16), args.rounds, 5)
    paired(f"backward bf16 {shape}", backward(mt.scaled_dot_product_attention), backward(original), args.rounds, 5)


def bench_step(args, torch, F, mt):
    import transformers
    p = args.dropout
    config = transformers.GPT2Config(n_positions=args.T, attn_pdrop=p, resid_pdrop=p, embd_pdrop=p)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).train()
    ids = torch.randint(0, config.vocab_size, (args.batch, args.T))

    def step(patched):
        def run():
            with mt.patch(patched):
                model.zero_grad(set_to_none=True)
                model(ids, labels=ids).loss.backward()
        return run

    before = mt.calls["backward"]
    step(True)()
    assert mt.calls["backward"] - before == config.n_layer, "the patch did not reach the model's attention"
    paired(f"GPT-2 124M training step B={args.batch} T={args.T} dropout={p}", step(True), step(False), args.rounds, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--what", default="op,step")
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--full", dest="causal", action="store_false", help="bf16: without the causal mask")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # mhsa's OpenMP, read at its import
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    import mhsa.torch as mt
    print(f"torch {torch.__version__}, {args.threads} threads", flush=True)
    for what in args.what.split(","):
        {"op": bench_op, "step": bench_step, "bf16": bench_bf16}[what](args, torch, F, mt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
