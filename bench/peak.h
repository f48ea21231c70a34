// bench/peak.h — the machine's own yardsticks, measured in the same run as a benchmark: FP32 FMA
// peak and copy bandwidth, so results can be quoted as a fraction of what this machine can do
// (docs/architecture.md, "Speed: how it is measured"). Not a calibrated microbenchmark suite: a best-of-N
// tight loop for each.
#pragma once

namespace mhsa::bench {

// FP32 GFLOP/s (an FMA counts as 2 FLOPs) of independent vector FMAs on `threads` OpenMP threads,
// using the widest of AVX-512 / AVX2+FMA / SSE the CPU has (the best of those it measures).
double measure_fma_peak_gflops(int threads);

// AVX512_BF16's peak: GFLOP/s of independent vdpbf16ps (16 lanes × 2 products, 4 FLOPs a lane)
// on `threads` threads; 0 where the CPU lacks the instruction. The yardstick of GEMMs over
// bfloat16 weights that run on it (kernels::gemm_bt_bf16_dot).
double measure_bf16_dot_peak_gflops(int threads);

// memcpy bandwidth in GB/s (bytes read + bytes written, 1 GB = 1e9 B) between two 128 MiB buffers,
// far larger than the last-level cache, on `threads` OpenMP threads each copying its own slice.
double measure_copy_bandwidth_gbs(int threads);

// Read-only bandwidth in GB/s: sums over a 512 MiB buffer with the widest vector loads, each
// thread its own slice; the best repetition. The yardstick for memory-bound decode, which reads
// its weights and keys and values and writes almost nothing. Rounds are repeated (a few at
// most) while the best is below `at_least`, a rate a kernel has just reached: on hosts whose
// bandwidth swings, a slow moment must not make the yardstick shorter than what was measured.
double measure_read_bandwidth_gbs(int threads, double at_least = 0.0);

}  // namespace mhsa::bench
