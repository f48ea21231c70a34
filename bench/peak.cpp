// bench/peak.cpp — FMA peak and copy bandwidth of this machine (see peak.h).
//
// The FMA loop keeps 12 independent accumulators per thread (latency 4 × 2 pipes needs >= 8), and
// each ISA's loop lives in a function compiled for that ISA with a target attribute, picked by
// __builtin_cpu_supports, so this file needs no special flags.
#include "peak.h"

#include "mhsa/tensor.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace mhsa::bench {
namespace {

constexpr long kIters = 4'000'000;  // per thread and repetition: ~0.1 s at 100 GFLOP/s per core
constexpr int kAcc = 12;

// Each returns the FLOPs it did; `seed` keeps the compiler from folding the loop.
#if defined(__x86_64__)
__attribute__((target("avx512f"))) double fma_loop_avx512(float seed) {
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(seed * static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < kIters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  __m512 sum = acc[0];
  for (int i = 1; i < kAcc; ++i) sum = _mm512_add_ps(sum, acc[i]);
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  return 2.0 * 16 * kAcc * static_cast<double>(kIters);
}

__attribute__((target("avx2,fma"))) double fma_loop_avx2(float seed) {
  __m256 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_set1_ps(seed * static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long it = 0; it < kIters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  float out[8];
  __m256 sum = acc[0];
  for (int i = 1; i < kAcc; ++i) sum = _mm256_add_ps(sum, acc[i]);
  _mm256_storeu_ps(out, sum);
  volatile float sink = out[0];
  (void)sink;
  return 2.0 * 8 * kAcc * static_cast<double>(kIters);
}

// vdpbf16ps: 16 lanes of two bfloat16 products each, 4 FLOPs a lane.
__attribute__((target("avx512f,avx512bf16"))) double bf16_dot_loop(float seed) {
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(seed * static_cast<float>(i));
  const __m512i one = _mm512_set1_epi32(0x3f803f80);  // the pair (1, 1)
  const __m512bh a = reinterpret_cast<const __m512bh&>(one);
  for (long it = 0; it < kIters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, a);
  __m512 sum = acc[0];
  for (int i = 1; i < kAcc; ++i) sum = _mm512_add_ps(sum, acc[i]);
  volatile float sink = _mm512_reduce_add_ps(sum);
  (void)sink;
  return 4.0 * 16 * kAcc * static_cast<double>(kIters);
}

#endif

// 4-lane vectors in the compiler's baseline ISA (SSE2 on x86: a multiply and an add per step;
// NEON on ARM: fused when contraction is on), counted as 2 FLOPs per lane and step.
double fma_loop_baseline(float seed) {
  using V4 = float __attribute__((vector_size(16)));
  V4 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = seed * static_cast<float>(i) - V4{};
  const V4 a = 0.999999f - V4{}, b = 1e-7f - V4{};
  for (long it = 0; it < kIters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = acc[i] * a + b;
  V4 sum = acc[0];
  for (int i = 1; i < kAcc; ++i) sum += acc[i];
  volatile float sink = sum[0];
  (void)sink;
  return 2.0 * 4 * kAcc * static_cast<double>(kIters);
}

// Best-of-`reps` GFLOP/s of `loop` run concurrently on `threads` threads.
template <class Loop>
double best_gflops(Loop loop, int threads, int reps) {
  double best = 0.0;
  for (int r = 0; r < reps; ++r) {
    double flops = 0.0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    flops += loop(1.0f + static_cast<float>(omp_get_thread_num()));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops / s * 1e-9);
  }
  return best;
}

// The widest loop this CPU runs, best of `reps` on `threads` threads.
double widest_gflops(int threads, int reps) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return best_gflops(fma_loop_avx512, threads, reps);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return best_gflops(fma_loop_avx2, threads, reps);
#endif
  return best_gflops(fma_loop_baseline, threads, reps);
}

}  // namespace

// On a shared machine (a VM whose second core is sometimes taken for a second or so), one burst
// of repetitions can measure half the peak, and every "% of peak" after it would be doubled. So
// the all-threads measurement is repeated, up to 8 rounds, until it reaches 92% of threads × the
// one-thread rate (scaling that real cores give), keeping the best.
double measure_fma_peak_gflops(int threads) {
  constexpr int kReps = 5, kRounds = 8;
  const double one = widest_gflops(1, kReps);
  double best = 0.0;
  for (int round = 0; round < kRounds && best < 0.92 * threads * one; ++round)
    best = std::max(best, widest_gflops(threads, kReps));
  return best;
}

double measure_bf16_dot_peak_gflops(int threads) {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx512bf16")) return 0.0;
  constexpr int kReps = 5, kRounds = 8;
  const double one = best_gflops(bf16_dot_loop, 1, kReps);
  double best = 0.0;
  for (int round = 0; round < kRounds && best < 0.92 * threads * one; ++round)
    best = std::max(best, best_gflops(bf16_dot_loop, threads, kReps));
  return best;
#else
  (void)threads;
  return 0.0;
#endif
}

double measure_copy_bandwidth_gbs(int threads) {
  constexpr size_t kBytes = size_t{128} << 20;
  constexpr int kReps = 8;
  // Tensor memory (2 MiB-aligned, huge pages where the kernel allows): what the kernels stream.
  struct Free {
    void operator()(void* p) const { detail::free_tensor_memory(p, kBytes); }
  };
  std::unique_ptr<char, Free> src(static_cast<char*>(detail::allocate_tensor_memory(kBytes)));
  std::unique_ptr<char, Free> dst(static_cast<char*>(detail::allocate_tensor_memory(kBytes)));
  double best = 0.0;
  for (int r = 0; r < kReps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      // Each thread first-touches (rep 0) and then copies the same slice.
      const size_t n = static_cast<size_t>(omp_get_num_threads()), t = static_cast<size_t>(omp_get_thread_num());
      const size_t begin = kBytes / n * t, end = t + 1 == n ? kBytes : kBytes / n * (t + 1);
      if (r == 0) std::memset(src.get() + begin, 1, end - begin);
      std::memcpy(dst.get() + begin, src.get() + begin, end - begin);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::max(best, 2.0 * static_cast<double>(kBytes) / s * 1e-9);
  }
  return best;
}

namespace {

// One thread's sum over floats [begin, end) (begin, end multiples of 128), with the widest
// vector loads the CPU has and 8 independent accumulators, so that neither add latency nor load
// width limits the rate: only memory does, as in the decode kernels' streams over weights and
// the KV cache (which read whole vectors with AVX-512 or AVX2 and keep several sums in flight).
using ReadLoop = float (*)(const float* data, size_t begin, size_t end);
#if defined(__x86_64__)
__attribute__((target("avx512f"))) float read_loop_avx512(const float* data, size_t begin, size_t end) {
  __m512 acc[8];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  for (size_t i = begin; i < end; i += 128)
#pragma GCC unroll 8
    for (int u = 0; u < 8; ++u) acc[u] = _mm512_add_ps(acc[u], _mm512_load_ps(data + i + 16 * u));
  for (int u = 1; u < 8; ++u) acc[0] = _mm512_add_ps(acc[0], acc[u]);
  return _mm512_reduce_add_ps(acc[0]);
}

__attribute__((target("avx2"))) float read_loop_avx2(const float* data, size_t begin, size_t end) {
  __m256 acc[8];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  for (size_t i = begin; i < end; i += 64)
#pragma GCC unroll 8
    for (int u = 0; u < 8; ++u) acc[u] = _mm256_add_ps(acc[u], _mm256_load_ps(data + i + 8 * u));
  for (int u = 1; u < 8; ++u) acc[0] = _mm256_add_ps(acc[0], acc[u]);
  float out[8];
  _mm256_storeu_ps(out, acc[0]);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
#endif

float read_loop_baseline(const float* data, size_t begin, size_t end) {
  using V4 = float __attribute__((vector_size(16)));
  V4 acc[8] = {};
  for (size_t i = begin; i < end; i += 32)
    for (int u = 0; u < 8; ++u) {
      V4 x;
      std::memcpy(&x, data + i + 4 * u, sizeof x);
      acc[u] += x;
    }
  for (int u = 1; u < 8; ++u) acc[0] += acc[u];
  return acc[0][0] + acc[0][1] + acc[0][2] + acc[0][3];
}

ReadLoop widest_read_loop() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return read_loop_avx512;
  if (__builtin_cpu_supports("avx2")) return read_loop_avx2;
#endif
  return read_loop_baseline;
}

}  // namespace

// Reads a 512 MiB buffer (as large as GPT-2 124M's fp32 weights, far beyond any last-level
// cache) in 6 repetitions per round, each thread its own slice, and keeps the best repetition.
// Memory bandwidth on these shared hosts swings by up to 2× within minutes, so, as for the FMA
// peak, rounds are repeated (up to 4) while the best is below `at_least` (a rate a kernel has
// just reached: the yardstick must not be under it because of a slow moment).
double measure_read_bandwidth_gbs(int threads, double at_least) {
  constexpr size_t kFloats = size_t{128} << 20;  // 512 MiB
  constexpr int kReps = 6, kRounds = 4;
  struct Free {  // Tensor memory (2 MiB-aligned, huge pages where the kernel allows), as the kernels read
    void operator()(void* p) const { detail::free_tensor_memory(p, kFloats * sizeof(float)); }
  };
  std::unique_ptr<float, Free> data(static_cast<float*>(detail::allocate_tensor_memory(kFloats * sizeof(float))));
  const ReadLoop loop = widest_read_loop();
  double best = 0.0;
  for (int round = 0; round < kRounds && (round == 0 || best < at_least); ++round)
    for (int r = 0; r < kReps; ++r) {
      float total = 0.0f;
      const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
      {
        const size_t n = static_cast<size_t>(omp_get_num_threads()), t = static_cast<size_t>(omp_get_thread_num());
        const size_t begin = kFloats / n * t / 128 * 128, end = t + 1 == n ? kFloats : kFloats / n * (t + 1) / 128 * 128;
        if (round == 0 && r == 0) std::fill(data.get() + begin, data.get() + end, 1.0f);  // first touch by the reader
        total += loop(data.get(), begin, end);
      }
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      volatile float sink = total;
      (void)sink;
      if (round > 0 || r > 0) best = std::max(best, static_cast<double>(kFloats * sizeof(float)) / sec * 1e-9);
    }
  return best;
}

}  // namespace mhsa::bench
