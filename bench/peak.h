// bench/peak.h — the machine's own yardsticks, measured in the same run as a benchmark: FP32 FMA
// peak and copy bandwidth, so results can be quoted as a fraction of what this machine can do
// (DESIGN.md, "Speed: how it is measured"). Not a calibrated microbenchmark suite: a best-of-N
// tight loop for each.
#pragma once

namespace mhsa::bench {

// FP32 GFLOP/s (an FMA counts as 2 FLOPs) of independent vector FMAs on `threads` OpenMP threads,
// using the widest of AVX-512 / AVX2+FMA / SSE the CPU has (the best of those it measures).
double measure_fma_peak_gflops(int threads);

// memcpy bandwidth in GB/s (bytes read + bytes written, 1 GB = 1e9 B) between two 128 MiB buffers,
// far larger than the last-level cache, on `threads` OpenMP threads each copying its own slice.
double measure_copy_bandwidth_gbs(int threads);

// Read-only bandwidth in GB/s: a sum over a 256 MiB buffer, each thread its own slice. The
// yardstick for memory-bound decode, which reads its keys and values and writes almost nothing.
double measure_read_bandwidth_gbs(int threads);

}  // namespace mhsa::bench
