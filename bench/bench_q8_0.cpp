// bench/bench_q8_0.cpp — the decode weight streams by weight type: matmul_bt (float32),
// matmul_bt_bf16, matmul_bt_q8_0 and matmul_bt_q4_k for one row of A at GPT-2's MLP and LM-head
// shapes, 1 and 2 threads, on the best ISA, with B rotated among copies larger than the last-level
// cache (the weights of a real model come from memory; matmul_bt_q8_0 and matmul_bt_q4_k quantise
// A per block and sum integer products, kernels/matmul_bt.cpp and matmul_q4_k.cpp). Rounds
// alternate the kernels; each prints its median and best over rounds of B's read rate in GB/s,
// against the read bandwidth measured in the same run, and at 1 thread the median rate per second
// of CPU time (robust to a shared host's preemption). Not a correctness test.
//
// With rows > 1 (several sequences decoded in one step) A has that many rows and the rate is
// still B's bytes per second.
//
// The third argument picks the shapes: gpt2 (the default) or smollm2 (q|k|v, gate|up, down and
// the tied LM head of SmolLM2-135M). B lives in tensor memory (2 MiB pages, as a loaded model's
// weights do). A fourth argument `hot` reads one copy of B over and over (from the caches where it
// fits: GPT-2's c_fc and c_proj in every format fit the 32 MiB L3 of the development machine):
// the rate the kernel's own work allows, so that a stream slower from memory than hot is bound by
// memory, and one no faster hot by its instructions.
//
//   bench_q8_0 [rounds] [rows] [gpt2|smollm2] [cold|hot]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "kernels/bf16.h"
#include "kernels/dispatch.h"
#include "kernels/half.h"
#include "kernels/q4_k.h"
#include "kernels/q8_0.h"
#include "mhsa/tensor.h"
#include "peak.h"

namespace {

using mhsa::kernels::BlockQ4_K;
using mhsa::kernels::BlockQ8_0;
using mhsa::kernels::kQ4KBlock;
using mhsa::kernels::kQ8Block;

// This thread's CPU time: at 1 thread a rate per CPU second is what the kernel reaches while it
// runs, whatever else the host schedules in between (these hosts are shared).
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Shape {
  const char* name;
  int64_t N, K;
};

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  const int64_t M = argc > 2 ? std::max(1, std::atoi(argv[2])) : 1;
  const mhsa::cpu::Isa isa = mhsa::cpu::best_isa();
  const auto& k = mhsa::kernels::kernels_for(isa);
  const int max_threads = std::min(2, omp_get_num_procs());
  std::printf("isa %s, rows %lld\n", std::string(mhsa::cpu::isa_name(isa)).c_str(), static_cast<long long>(M));
  const std::vector<Shape> gpt2 = {{"mlp c_fc", 3072, 768}, {"mlp c_proj", 768, 3072}, {"lm head", 50257, 768}};
  const std::vector<Shape> smollm2 = {{"q|k|v", 960, 576}, {"gate|up", 3072, 576}, {"down", 576, 1536},
                                      {"lm head", 49152, 576}};
  const std::string family = argc > 3 ? argv[3] : "gpt2";
  if (family != "gpt2" && family != "smollm2") {
    std::fprintf(stderr, "bench_q8_0: shapes: expected gpt2 or smollm2, got '%s'\n", family.c_str());
    return 2;
  }
  const std::string cache = argc > 4 ? argv[4] : "cold";
  if (cache != "cold" && cache != "hot") {
    std::fprintf(stderr, "bench_q8_0: cache: expected cold or hot, got '%s'\n", cache.c_str());
    return 2;
  }
  const bool hot = cache == "hot";
  const std::vector<Shape>& shapes = family == "gpt2" ? gpt2 : smollm2;
  std::printf("B %s\n", hot ? "hot: one copy, read again and again" : "cold: rotated among copies larger than the LLC");
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Shape& s : shapes) {
    const int64_t n = s.N * s.K;
    const int copies = hot ? 1 : static_cast<int>(std::max<int64_t>(2, (int64_t{96} << 20) / (n * 34 / 32)));  // > LLC as q8
    std::vector<float> a(static_cast<size_t>(M * s.K)), c(static_cast<size_t>(M * s.N));
    for (float& x : a) x = normal(gen);
    std::vector<float> w(static_cast<size_t>(n));
    for (float& x : w) x = normal(gen);
    // Every copy holds the same values; f32 copies only as many as fill 96 MiB of float.
    const int f32_copies = hot ? 1 : static_cast<int>(std::max<int64_t>(2, (int64_t{96} << 20) / (n * 4)));
    const int bf_copies = hot ? 1 : static_cast<int>(std::max<int64_t>(2, (int64_t{96} << 20) / (n * 2)));
    std::vector<float, mhsa::AlignedAllocator<float>> bf32(static_cast<size_t>(n * f32_copies));
    std::vector<uint16_t, mhsa::AlignedAllocator<uint16_t>> bbf(static_cast<size_t>(n * bf_copies));
    std::vector<BlockQ8_0, mhsa::AlignedAllocator<BlockQ8_0>> bq(static_cast<size_t>(n / kQ8Block * copies));
    for (int i = 0; i < f32_copies; ++i) std::copy(w.begin(), w.end(), bf32.begin() + n * i);
    std::transform(w.begin(), w.end(), bbf.begin(), mhsa::kernels::float_to_bf16);
    for (int i = 1; i < bf_copies; ++i) std::copy(bbf.begin(), bbf.begin() + n, bbf.begin() + n * i);
    mhsa::kernels::quantize_row_q8_0(w.data(), n, bq.data());
    for (int i = 1; i < copies; ++i)
      std::copy(bq.begin(), bq.begin() + n / kQ8Block, bq.begin() + n / kQ8Block * i);
    const int q4_copies = hot ? 1 : static_cast<int>(std::max<int64_t>(2, (int64_t{96} << 20) / (n * 144 / 256)));
    std::vector<BlockQ4_K, mhsa::AlignedAllocator<BlockQ4_K>> b4(static_cast<size_t>(n / kQ4KBlock * q4_copies));
    mhsa::kernels::quantize_row_q4_k(w.data(), n, b4.data());
    mhsa::kernels::interleave_q4_k(b4.data(), n / kQ4KBlock);  // the kernels' order, as a loaded model keeps it
    for (int i = 1; i < q4_copies; ++i)
      std::copy(b4.begin(), b4.begin() + n / kQ4KBlock, b4.begin() + n / kQ4KBlock * i);
    struct Variant {
      const char* name;
      double bytes;
      std::function<void(int)> run;
      std::vector<double> rates, cpu_rates;  // GB/s per wall second; per second of this thread's CPU time
    };
    const float* f32_b = bf32.data();
    const uint16_t* bf16_b = bbf.data();
    const BlockQ8_0* q8_b = bq.data();
    const int64_t N = s.N, K = s.K, nb = n / kQ8Block;
    std::vector<Variant> variants = {
        {"f32", 4.0 * n,
         [&](int i) { k.matmul_bt(M, N, K, a.data(), K, f32_b + n * (i % f32_copies), K, c.data(), N); }, {}, {}},
        {"bf16", 2.0 * n,
         [&](int i) { k.matmul_bt_bf16(M, N, K, a.data(), K, bf16_b + n * (i % bf_copies), K, c.data(), N); }, {}, {}},
        {"q8_0", 34.0 * n / 32,
         [&](int i) { k.matmul_bt_q8_0(M, N, K, a.data(), K, q8_b + nb * (i % copies), K / kQ8Block, c.data(), N); },
         {}, {}},
        {"q4_k", 144.0 * n / 256,
         [&](int i) {
           const BlockQ4_K* b = b4.data() + n / kQ4KBlock * (i % q4_copies);
           k.matmul_bt_q4_k(M, N, K, a.data(), K, b, K / kQ4KBlock, c.data(), N);
         },
         {}, {}},
    };
    for (int t = 1; t <= max_threads; ++t) {
      omp_set_num_threads(t);
      for (Variant& v : variants) v.rates.clear(), v.cpu_rates.clear();
      for (int r = 0; r < rounds; ++r)
        for (Variant& v : variants) {  // alternating: one round of every kernel, then the next round
          v.run(0);
          constexpr int kReps = 20;
          const double cpu0 = thread_cpu_seconds();
          const auto t0 = std::chrono::steady_clock::now();
          for (int i = 1; i <= kReps; ++i) v.run(i);
          const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          v.rates.push_back(v.bytes * kReps / sec * 1e-9);
          v.cpu_rates.push_back(v.bytes * kReps / (thread_cpu_seconds() - cpu0) * 1e-9);
        }
      const double bw = mhsa::bench::measure_read_bandwidth_gbs(t);
      for (Variant& v : variants) {
        std::sort(v.rates.begin(), v.rates.end());
        std::sort(v.cpu_rates.begin(), v.cpu_rates.end());
        std::printf("%-10s N %5lld K %4lld  thr %d  %-17s  median %6.1f GB/s  best %6.1f  (read bw %.1f)", s.name,
                    static_cast<long long>(N), static_cast<long long>(K), t, v.name, v.rates[v.rates.size() / 2],
                    v.rates.back(), bw);
        if (t == 1) std::printf("  per CPU second: median %6.1f", v.cpu_rates[v.cpu_rates.size() / 2]);
        std::printf("\n");
      }
    }
  }
  return 0;
}
