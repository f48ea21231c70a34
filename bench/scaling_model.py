#!/usr/bin/env python3
"""A model of data-parallel training throughput (`mpirun -np N mhsa train`, docs/distributed.md)
on N machines: tokens/s for GPT-2 124M and a 1B Llama shape (Llama-3.2-1B) on 8 and 64 machines
over 25 and 100 Gb/s networks, from a measured per-token compute time and the gradient's bytes.

A step is the rows of the global batch shared among the machines, each row a forward and a
backward; what mhsa's reduction does (train/gradient_tree.h, train/sharded_adamw.h):
  - the gradient (float32, 4 bytes a parameter) is reduce-scattered by one all-to-all per bucket,
    each rank receiving (N-1)/N of it; the buckets are started during the backward of the
    machine's LAST row, as that backward finishes them (the output side first, a tied embedding
    last), one link sending them in turn;
  - after the optimiser the weights (float32) are all-gathered: (N-1)/N of them again, not overlapped.
So the bytes match a ring all-reduce's 2(N-1)/N x gradient bytes. A bucket's all-to-all takes
(N-1)/N x bytes / bandwidth + one latency + (N-1) x a per-message overhead (Open MPI posts the N-1
messages at once); the ring all-gather (N-1) x (latency + overhead) + (N-1)/N x bytes / bandwidth.
Not modelled: the optimiser and the tree's own additions (measured small), stragglers, the
network's contention (full bisection assumed), and compute that speeds up with more threads.

Run: python3 bench/scaling_model.py [--gpt2-token-s S] [--llama-token-s S] ...; prints the
assumptions and the table (markdown).
"""

import argparse


def gpt2_parts(vocab=50257, C=768, L=12, T=1024):
    """(name, parameters) in the order the backward finishes them: head side first."""
    layer = 4 * C * C + 4 * C + 8 * C * C + 5 * C + 4 * C  # attention, MLP, two LayerNorms
    return [("ln_f", 2 * C)] + [(f"layer {i}", layer) for i in reversed(range(L))] + \
           [("wte+wpe (tied head)", vocab * C + T * C)]


def llama_parts(vocab=128256, C=2048, L=16, heads=32, kv_heads=8, F=8192):
    head_dim = C // heads
    layer = C * C * 2 + 2 * C * kv_heads * head_dim + 3 * C * F + 2 * C  # q, o; k, v; gate, up, down; norms
    return [("norm", C)] + [(f"layer {i}", layer) for i in reversed(range(L))] + \
           [("embed_tokens (tied head)", vocab * C)]


def reduce_scatter_exposed(parts, backward_s, machines, bandwidth, latency, message, bucket_bytes):
    """Seconds the reduce-scatter runs past the end of the last row's backward: the parts become
    ready as the backward reaches them (its time shared out by parameters; the tied embedding's
    gradient is final only at the end), cut into buckets, sent one after another."""
    total = sum(p for _, p in parts)
    ready, link, done = 0.0, 0.0, 0.0
    for name, params in parts:
        ready += backward_s * params / total
        if name.startswith(("wte", "embed")):
            ready = backward_s
        nbytes = 4 * params
        buckets = max(1, round(nbytes / bucket_bytes))
        link = max(link, ready) + (machines - 1) / machines * nbytes / bandwidth + \
            buckets * (latency + (machines - 1) * message)
        done = link
    return max(0.0, done - backward_s)


def step(parts, token_s, batch_tokens, context, machines, gbps, latency, message, bucket_bytes, efficiency,
         overlap=True):
    params = sum(p for _, p in parts)
    bandwidth = gbps * 1e9 / 8 * efficiency
    rows = batch_tokens // context // machines  # rows per machine
    compute = rows * context * token_s
    backward = compute / rows * 2 / 3  # one row's backward: 2/3 of its forward + backward
    gather = (machines - 1) / machines * 4 * params / bandwidth + (machines - 1) * (latency + message)
    rs = reduce_scatter_exposed(parts, backward if overlap else 0.0, machines, bandwidth, latency, message,
                                bucket_bytes)
    return compute + rs + gather, compute, rs, gather


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpt2-token-s", type=float, default=1 / 160,
                    help="GPT-2 124M: seconds of a training step per token on one machine (default: the 2-core "
                         "test machine, quiet, 2 threads: `mhsa bench --filter gpt2_124M_train`, ~160 tokens/s)")
    ap.add_argument("--llama-token-s", type=float, default=None,
                    help="Llama 1B: the same (default: GPT-2's scaled by the non-embedding + head FLOPs)")
    ap.add_argument("--speedups", type=float, nargs="+", default=[1, 32],
                    help="machines this many times faster than the measured one (1: the 2-core test machine; "
                         "32: e.g. 64 cores at the same speed per core)")
    ap.add_argument("--batch-tokens", type=int, default=524288, help="global batch in tokens")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--latency-us", type=float, default=30, help="one message's latency (TCP over Ethernet)")
    ap.add_argument("--message-us", type=float, default=3, help="a sender's overhead per message")
    ap.add_argument("--efficiency", type=float, default=0.9, help="share of the link rate TCP delivers")
    ap.add_argument("--bucket-mb", type=float, default=4)
    a = ap.parse_args()

    models = {"GPT-2 124M": gpt2_parts(T=a.context), "Llama-3.2-1B shape": llama_parts()}
    flops = {  # per token: 6 x (matrix parameters incl. the head) + attention's 12 x L x C x T
        "GPT-2 124M": 6 * (12 * 12 * 768 * 768 + 50257 * 768) + 12 * 12 * 768 * a.context,
        "Llama-3.2-1B shape": 6 * (16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192) + 128256 * 2048)
        + 12 * 16 * 2048 * a.context,
    }
    llama = a.llama_token_s or a.gpt2_token_s * flops["Llama-3.2-1B shape"] / flops["GPT-2 124M"]
    token_s = {"GPT-2 124M": a.gpt2_token_s, "Llama-3.2-1B shape": llama}
    bucket = a.bucket_mb * 2**20
    print("Assumptions:")
    print(f"- global batch {a.batch_tokens} tokens = {a.batch_tokens // a.context} rows of {a.context}; "
          f"rows shared evenly; a row's backward is 2/3 of its compute")
    for name, parts in models.items():
        p = sum(x for _, x in parts)
        print(f"- {name}: {p / 1e6:.1f} M parameters, {4 * p / 1e6:.0f} MB of float32 gradient; "
              f"{token_s[name] * 1e3:.2f} ms per token on the measured machine ({1 / token_s[name]:.0f} tokens/s); "
              f"{flops[name] / 1e9:.2f} GFLOP per token")
    print(f"- network: link rate x {a.efficiency}, {a.latency_us:g} us latency, {a.message_us:g} us per message "
          f"sent, full bisection; "
          f"buckets of {a.bucket_mb:g} MiB")
    print("- per step: compute + the reduce-scatter's part not hidden behind the last row's backward + the weights' "
          "all-gather (not overlapped); traffic per machine 2(N-1)/N x 4 bytes x parameters (a ring all-reduce's)")
    print()
    print("| model | machine speed | machines | network | tokens/s | vs 1 machine x N | comm exposed / step | "
          "without overlap |")
    print("|---|---|---|---|---|---|---|---|")
    for name, parts in models.items():
        for speed in a.speedups:
            ts = token_s[name] / speed
            for machines in (8, 64):
                for gbps in (25, 100):
                    args = (parts, ts, a.batch_tokens, a.context, machines, gbps, a.latency_us * 1e-6,
                            a.message_us * 1e-6, bucket, a.efficiency)
                    total, compute, rs, gather = step(*args)
                    plain = step(*args, overlap=False)[0]
                    print(f"| {name} | {speed:g}x ({1 / ts:.0f} tok/s) | {machines} | {gbps} Gb/s | "
                          f"{a.batch_tokens / total:,.0f} | {compute / total:.0%} | {rs + gather:.2f} s | "
                          f"{a.batch_tokens / plain:,.0f} tok/s |")


if __name__ == "__main__":
    main()
