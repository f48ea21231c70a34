// bench/bench_rows.cpp — speed of the model families' row kernels (RMSNorm and its backward,
// LayerNorm backward, SwiGLU/GeGLU and their backward, logit soft-cap, rotary embedding) in GB/s
// against this machine's read bandwidth measured in the same run (bench/peak.h).
//
//   bench_rows [--threads N] [--quick]
//
// Two sizes per kernel: SmolLM2-135M's shapes for a prefill of 512 tokens (C 576, F 1536, 9 + 3
// heads of 64; the operands fit in the caches, so a rate above the DRAM yardstick is expected),
// and 64 MiB rows (from memory). GB/s counts each distinct byte a kernel must read or write once
// (1 GB = 1e9 B). Best of repeated runs on the best ISA. Not a correctness test
// (tests/cpp/test_elementwise_families.cpp is).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/cpu.h"
#include "kernels/dispatch.h"
#include "peak.h"

namespace {

using mhsa::kernels::GluKind;

double best_seconds(const std::function<void()>& fn, double min_seconds) {
  fn();
  double best = 1e30, total = 0;
  int reps = 0;
  while (total < min_seconds || reps < 5) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
    total += s;
    ++reps;
  }
  return best;
}

std::vector<float> randn(int64_t n) {
  static std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(gen);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  double min_seconds = 0.3;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--quick")) min_seconds = 0.05;
  }
  omp_set_num_threads(threads);
  const auto& k = mhsa::kernels::kernels();
  const double read_gbs = mhsa::bench::measure_read_bandwidth_gbs(threads);
  const std::string isa(mhsa::cpu::isa_name(mhsa::cpu::best_isa()));
  std::printf("isa %s, %d threads, read bandwidth %.1f GB/s\n\n", isa.c_str(), threads, read_gbs);
  std::printf("%-22s %-16s %10s %9s %8s\n", "kernel", "shape", "time (us)", "GB/s", "% read");

  struct Size {
    const char* name;
    int64_t rows, C, F, heads, n;  // n: soft-cap elements per row
  };
  const int64_t big = int64_t{16} << 20;  // 64 MiB of floats
  for (const Size& s : {Size{"smollm2 pp512", 512, 576, 1536, 12, 49152}, Size{"64 MiB", big / 1024, 1024, 1024, 16, 1024}}) {
    const int64_t R = s.rows, C = s.C, F = s.F, sc_rows = s.name[0] == 's' ? 16 : big / s.n;
    auto x = randn(R * C), w = randn(C), dy = randn(R * C), dx = randn(R * C), y = randn(R * C), dw = randn(C),
         db = randn(C);
    auto gate = randn(R * F), up = randn(R * F), out = randn(R * F), dg = randn(R * F), du = randn(R * F);
    auto logits = randn(sc_rows * s.n), capped = randn(sc_rows * s.n);
    const int64_t rope_rows = R, D = 64;
    auto q = randn(rope_rows * s.heads * D);
    std::vector<float> table(static_cast<size_t>(4096 * D));
    mhsa::kernels::rope_table(mhsa::kernels::rope_inv_freq(D, 10000.0, mhsa::RopeScaling{}), 0, 4096, table.data());
    std::vector<int64_t> pos(static_cast<size_t>(rope_rows));
    for (int64_t r = 0; r < rope_rows; ++r) pos[static_cast<size_t>(r)] = r % 4096;
    const double f = sizeof(float);
    struct Case {
      const char* name;
      double bytes;
      std::function<void()> run;
    };
    const std::vector<Case> cases = {
        {"rms_norm", 2 * f * R * C, [&] { k.rms_norm(R, C, x.data(), C, w.data(), 0, 1e-6f, y.data(), C); }},
        {"rms_norm_backward", 4 * f * R * C,
         [&] { k.rms_norm_backward(R, C, x.data(), C, w.data(), 0, 1e-6f, dy.data(), C, dx.data(), C, dw.data()); }},
        {"layer_norm_backward", 4 * f * R * C,
         [&] {
           k.layer_norm_backward(R, C, x.data(), C, w.data(), 1e-5f, dy.data(), C, dx.data(), C, dw.data(), db.data());
         }},
        {"swiglu", 3 * f * R * F,
         [&] { k.glu(GluKind::swiglu, R, F, gate.data(), F, up.data(), F, out.data(), F); }},
        {"swiglu_backward", 5 * f * R * F,
         [&] {
           k.glu_backward(GluKind::swiglu, R, F, gate.data(), F, up.data(), F, out.data(), F, dg.data(), F, du.data(),
                          F);
         }},
        {"geglu", 3 * f * R * F, [&] { k.glu(GluKind::geglu, R, F, gate.data(), F, up.data(), F, out.data(), F); }},
        {"geglu_backward", 5 * f * R * F,
         [&] {
           k.glu_backward(GluKind::geglu, R, F, gate.data(), F, up.data(), F, out.data(), F, dg.data(), F, du.data(),
                          F);
         }},
        {"softcap", 2 * f * sc_rows * s.n,
         [&] { k.softcap(sc_rows, s.n, logits.data(), s.n, 30.0f, capped.data(), s.n); }},
        {"softcap_backward", 3 * f * sc_rows * s.n,
         [&] { k.softcap_backward(sc_rows, s.n, logits.data(), s.n, 30.0f, capped.data(), s.n); }},
        {"rope (q and k)", 2 * f * rope_rows * s.heads * D,
         [&] { k.rope(rope_rows, s.heads, D, D, q.data(), s.heads * D, pos.data(), table.data(), false); }},
    };
    for (const Case& c : cases) {
      const double t = best_seconds(c.run, min_seconds);
      const double gbs = c.bytes / t / 1e9;
      std::printf("%-22s %-16s %10.1f %9.1f %7.0f%%\n", c.name, s.name, t * 1e6, gbs, 100 * gbs / read_gbs);
    }
  }
  return 0;
}
