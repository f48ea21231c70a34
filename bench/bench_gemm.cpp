// bench/bench_gemm.cpp — speed of the projection GEMM (kernels::gemm) for the shapes the library
// uses, every usable ISA, 1 and 2 threads, against this machine's FP32 FMA peak and copy
// bandwidth measured in the same run (docs/architecture.md, "Speed: how it is measured").
//
//   bench_gemm [--quick]
//
// Prints one row per shape × ISA × threads: best and median time, GFLOP/s (2·M·N·K / best time),
// % of the measured peak for that thread count, and for decode shapes (M <= 8) the rate at which B
// is read in GB/s, with B rotated among copies larger than the last-level cache so that it comes
// from memory, as the weights of a real model do. The PyTorch peer is bench/gemm_torch.py.
// Not a correctness test (tests/cpp/test_gemm.cpp is).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "kernels/dispatch.h"
#include "peak.h"

namespace {

struct Shape {
  const char* name;
  int64_t M, N, K;
};

struct Timing {
  double best_s, median_s;
};

// Runs fn until `min_seconds` have passed and at least `min_reps` timed repetitions (after one
// warm-up call), returning the best and the median time.
template <class Fn>
Timing time_it(Fn&& fn, double min_seconds, int min_reps) {
  fn();
  std::vector<double> times;
  double total = 0.0;
  while (total < min_seconds || static_cast<int>(times.size()) < min_reps) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    times.push_back(s);
    total += s;
  }
  std::sort(times.begin(), times.end());
  return {times.front(), times[times.size() / 2]};
}

std::vector<float> random_floats(std::mt19937& gen, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& x : v) x = normal(gen);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const double min_seconds = quick ? 0.1 : 0.5;
  const int max_threads = std::min(2, omp_get_num_procs());

  std::vector<double> peak(max_threads + 1), bandwidth(max_threads + 1);
  for (int t = 1; t <= max_threads; ++t) {
    peak[t] = mhsa::bench::measure_fma_peak_gflops(t);
    bandwidth[t] = mhsa::bench::measure_copy_bandwidth_gbs(t);
    std::printf("measured: %d thread(s): FP32 FMA peak %.1f GFLOP/s, copy bandwidth %.1f GB/s\n", t, peak[t],
                bandwidth[t]);
  }

  const std::vector<Shape> shapes = {
      {"qkv proj", 1024, 2304, 768}, {"out proj", 1024, 768, 768}, {"decode", 1, 2304, 768},
      {"decode", 2, 2304, 768},      {"decode", 4, 2304, 768},     {"decode", 6, 2304, 768},
      {"decode", 8, 2304, 768},      {"decode", 8, 3072, 768},     {"decode", 8, 768, 3072},
      {"small M", 32, 2304, 768},    {"odd", 1025, 1025, 97},      {"odd", 97, 97, 1025},
      {"odd", 7, 7, 7},
  };
  std::mt19937 gen(42);
  std::printf("\n%-9s %5s %5s %5s  %-8s %3s  %9s %9s  %8s %7s  %s\n", "shape", "M", "N", "K", "isa", "thr",
              "best ms", "median ms", "GFLOP/s", "% peak", "B GB/s (% of copy bw)");
  for (const Shape& s : shapes) {
    const bool decode = s.M <= 8;
    // Decode reads B from memory: enough copies of it to overflow a 32 MiB last-level cache.
    const int64_t b_size = s.K * s.N;
    const int copies = decode ? static_cast<int>(std::max<int64_t>(1, (int64_t{96} << 20) / (b_size * 4))) : 1;
    const std::vector<float> a = random_floats(gen, s.M * s.K), bias = random_floats(gen, s.N);
    const std::vector<float> b = random_floats(gen, b_size * copies);
    std::vector<float> c(static_cast<size_t>(s.M * s.N));
    for (mhsa::cpu::Isa isa : mhsa::cpu::usable_isas()) {
      const auto gemm = mhsa::kernels::kernels_for(isa).gemm;
      for (int t = 1; t <= max_threads; ++t) {
        omp_set_num_threads(t);
        int which = 0;
        const Timing tm = time_it(
            [&] {
              gemm(s.M, s.N, s.K, a.data(), s.K, b.data() + b_size * which, s.N, bias.data(), c.data(), s.N);
              which = (which + 1) % copies;
            },
            min_seconds, 5);
        const double gflops = 2.0 * s.M * s.N * s.K / tm.best_s * 1e-9;
        std::printf("%-9s %5lld %5lld %5lld  %-8s %3d  %9.3f %9.3f  %8.1f %6.1f%%", s.name,
                    static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K),
                    std::string(mhsa::cpu::isa_name(isa)).c_str(), t, tm.best_s * 1e3, tm.median_s * 1e3, gflops,
                    100.0 * gflops / peak[t]);
        if (decode) {
          const double gbs = 4.0 * b_size / tm.best_s * 1e-9;
          std::printf("  %.1f (%.0f%%)", gbs, 100.0 * gbs / bandwidth[t]);
        }
        std::printf("\n");
      }
    }
  }
  for (int t = 1; t <= max_threads; ++t)
    std::printf("re-measured at the end: %d thread(s): FP32 FMA peak %.1f GFLOP/s\n", t,
                mhsa::bench::measure_fma_peak_gflops(t));
  return 0;
}
