// bench/bench_step_gemm.cpp — the projection GEMMs of one GPT-2 124M decode step: the 48 products
// of its 12 layers (c_attn 768 → 2304, attn c_proj 768 → 768, c_fc 768 → 3072, mlp c_proj 3072 →
// 768, weights stored [in, out] as GPT-2's Conv1D keeps them) through kernels::gemm for M rows of
// A, as `mhsa serve` runs them when M sequences decode together. The weights live in tensor
// memory (2 MiB pages, as a loaded model's do) and, 340 MB in all, come from memory, not the
// caches. Prints the median and best time of a pass, the rate B is read at, and GFLOP/s.
//
//   bench_step_gemm [rows = 8] [passes = 30] [layers = 12] [shape = all | 0..3] [pad = 0] [io | oi | blk]
//
// oi stores each weight [out, in] (nn.Linear's layout, every family but GPT-2) and multiplies
// through kernels::matmul_bt, the B·Aᵀ stream those families decode with; io (the default) is
// GPT-2's [in, out] through gemm; blk the same weights blocked (kernels/gemm.h) through gemm_blocked,
// as the CLI's inference models keep them (pad must be 0).
// pad (floats) widens each weight's rows: B's leading dimension N + pad, as a copy stored to keep
// rows 4 KiB apart (c_fc's 12 KiB) out of one L1 set would.
// shape picks one of the four products (its 12 copies): the per-product rates. layers 1 keeps B
// (28 MB) in a 32 MiB L3 — there it measures the L3, not the arithmetic. Not a correctness test.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/gemm.h"
#include "mhsa/tensor.h"

int main(int argc, char** argv) {
  const int64_t M = argc > 1 ? std::atoi(argv[1]) : 8;
  const int passes = argc > 2 ? std::atoi(argv[2]) : 30;
  const int layers = argc > 3 ? std::atoi(argv[3]) : 12;
  const int only = argc > 4 && std::string(argv[4]) != "all" ? std::atoi(argv[4]) : -1;
  const int64_t pad = argc > 5 ? std::atoi(argv[5]) : 0;
  const bool oi = argc > 6 && std::string(argv[6]) == "oi";
  const bool blk = argc > 6 && std::string(argv[6]) == "blk";
  if (M < 1 || M > 4096 || passes < 1 || layers < 1 || only > 3 || pad < 0 || pad > 1024 || (blk && pad != 0) ||
      (argc > 6 && !oi && !blk && std::string(argv[6]) != "io")) {
    std::fprintf(stderr,
                 "usage: bench_step_gemm [rows 1..4096] [passes >= 1] [layers >= 1] [all|0..3] [pad 0..1024] [io|oi|blk]\n");
    return 2;
  }
  struct Product {
    const char* name;
    int64_t K, N;
  };
  const Product products[4] = {{"c_attn", 768, 2304}, {"attn c_proj", 768, 768}, {"c_fc", 768, 3072},
                               {"mlp c_proj", 3072, 768}};
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<mhsa::Tensor> weights;
  double bytes = 0.0, flops = 0.0;
  for (int l = 0; l < layers; ++l)
    for (int i = 0; i < 4; ++i) {
      const int64_t rows = oi ? products[i].N : products[i].K, cols = (oi ? products[i].K : products[i].N) + pad;
      weights.emplace_back(std::vector<int64_t>{rows, cols});
      for (int64_t e = 0; e < rows * cols; ++e) weights.back().data()[e] = normal(gen);
      if (blk) {
        mhsa::Tensor blocked({rows, cols});
        mhsa::kernels::block_b(rows, cols, weights.back().data(), blocked.data());
        weights.back() = std::move(blocked);
      }
      if (only >= 0 && i != only) continue;
      bytes += 4.0 * products[i].K * products[i].N;
      flops += 2.0 * M * products[i].K * products[i].N;
    }
  // Activations in tensor memory (64-byte aligned, as a model's are): a misaligned A splits the
  // B·Aᵀ stream's vector loads across cache lines (half its rate with B in the caches).
  mhsa::Tensor A({M, 3072}), C({M, 3072});
  for (int64_t e = 0; e < A.numel(); ++e) A.data()[e] = normal(gen) * 50.0f;
  const auto& k = mhsa::kernels::kernels();
  std::vector<double> times;
  for (int pass = 0; pass <= passes; ++pass) {  // pass 0 warms up
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t w = 0; w < weights.size(); ++w) {
      const Product& p = products[w % 4];
      if (only >= 0 && static_cast<int>(w % 4) != only) continue;
      if (blk)
        k.gemm_blocked(M, p.N, p.K, A.data(), p.K, weights[w].data(), nullptr, C.data(), p.N);
      else if (oi)
        k.matmul_bt(M, p.N, p.K, A.data(), p.K, weights[w].data(), p.K + pad, C.data(), p.N);
      else
        k.gemm(M, p.N, p.K, A.data(), p.K, weights[w].data(), p.N + pad, nullptr, C.data(), p.N);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (pass > 0) times.push_back(s);
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  std::printf("%s%s × %d layers, %lld rows, %d threads: median %.2f ms, best %.2f ms, B at %.1f GB/s, %.1f GFLOP/s\n",
              only >= 0 ? products[only].name : "all four products", oi ? " [out, in] (matmul_bt)" : blk ? " blocked (gemm_blocked)" : "", layers, static_cast<long long>(M),
              omp_get_max_threads(), median * 1e3, times.front() * 1e3, bytes / median / 1e9, flops / median / 1e9);
}
