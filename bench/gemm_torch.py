"""bench/gemm_torch.py — the PyTorch peer for bench_gemm: torch.addmm(bias, A, B) in float32 on the
same shapes, 1 and 2 threads, best and median time and GFLOP/s (decode shapes: B GB/s, with B
rotated among copies larger than the last-level cache, as bench_gemm does). Run it right after
bench_gemm and quote the ratio; absolute numbers drift on shared machines.

    python3 bench/gemm_torch.py [--quick]
"""
import sys
import time

import torch

SHAPES = [  # name, M, N, K — the same list as bench_gemm.cpp
    ("qkv proj", 1024, 2304, 768), ("out proj", 1024, 768, 768), ("decode", 1, 2304, 768),
    ("decode", 2, 2304, 768), ("decode", 4, 2304, 768), ("decode", 8, 2304, 768),
    ("small M", 32, 2304, 768), ("odd", 1025, 1025, 97), ("odd", 97, 97, 1025), ("odd", 7, 7, 7),
]


def time_it(fn, min_seconds, min_reps=5):
    fn()
    times = []
    while sum(times) < min_seconds or len(times) < min_reps:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[0], times[len(times) // 2]


def main():
    min_seconds = 0.1 if "--quick" in sys.argv else 0.5
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, torch.addmm float32")
    print(f"{'shape':9s} {'M':>5s} {'N':>5s} {'K':>5s}  {'thr':>3s}  {'best ms':>9s} {'median ms':>9s}  "
          f"{'GFLOP/s':>8s}  B GB/s")
    for name, m, n, k in SHAPES:
        decode = m <= 8
        copies = max(1, (96 << 20) // (k * n * 4)) if decode else 1
        a, bias = torch.randn(m, k), torch.randn(n)
        bs = [torch.randn(k, n) for _ in range(copies)]
        out = torch.empty(m, n)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            which = [0]

            def run():
                torch.addmm(bias, a, bs[which[0]], out=out)
                which[0] = (which[0] + 1) % copies

            best, median = time_it(run, min_seconds)
            gflops = 2.0 * m * n * k / best * 1e-9
            line = f"{name:9s} {m:5d} {n:5d} {k:5d}  {threads:3d}  {best * 1e3:9.3f} {median * 1e3:9.3f}  {gflops:8.1f}"
            if decode:
                line += f"  {4.0 * k * n / best * 1e-9:.1f}"
            print(line)


if __name__ == "__main__":
    main()
