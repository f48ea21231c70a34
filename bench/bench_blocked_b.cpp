// bench/bench_blocked_b.cpp — would GPT-2's [in, out] weights read faster by 8-sequence decode
// steps if they were stored blocked? A question for issue 15, answered before building it.
//
// gemm's in-place path (kernels/gemm.cpp, M <= 16) walks a fresh block of 16 rows of B across all
// of its columns, a 16-column panel at a time: per panel 16 cache lines, one from each row, ldb
// floats apart, so each thread reads 16 interleaved streams. Stored blocked —
// [K/16][N/16][16 rows][16 columns], each block's panels one after another — the same walk reads
// one contiguous stream. This harness runs the same AVX2 kernel on both layouts: M = 8 rows of A
// (a 6-row and a 2-row tile per panel, fresh chains of 16 rows as gemm's), K split in two parts,
// one per thread (as gemm_in_place at 2 threads), over GPT-2 124M's 48 projections (340 MB, from
// memory), and next to it the library's kernels::gemm on the strided layout (what the prototype's
// strided time should match). Alternating passes; medians. Not a correctness test: it checks only
// that the two layouts give the same C.
//
// rows 1 runs one row of A instead (a single sequence's decode): the blocked layout read in address
// order by a 16-row chain per panel column, against kernels::gemm's stream of 8 rows of the [K, N]
// layout at a time. (On the development machine the blocked single row read ~20% slower, and the
// 8-row win did not survive into a model whose decode of one sequence would pay for it:
// docs/performance-history.md, "GPT-2's projections blocked for decoding".)
//
// A fourth argument `side` reads one row's blocked B as the library does: the thread's K range in
// four runs side by side, a panel of each in turn (four concurrent streams).
//
//   bench_blocked_b [passes = 20] [rows = 8 | 1] [prefetch floats ahead for blocked = 512] [side]
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "mhsa/tensor.h"

namespace {

constexpr int kB = 16;  // rows per fresh block and columns per panel

// c[R][16] += Σ_{kk<16} a[kk][r] · b(kk), b(kk) = b + kk·step (step 16: blocked; ldb: strided).
template <int R>
__attribute__((target("avx2,fma"))) inline void tile(const float* a, const float* b, int64_t step, float* c,
                                                     int64_t ldc, const float* prefetch) {
  __m256 acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
#pragma GCC unroll 2
  for (int kk = 0; kk < kB; ++kk) {
    const __m256 b0 = _mm256_loadu_ps(b + kk * step), b1 = _mm256_loadu_ps(b + kk * step + 8);
    if (prefetch) __builtin_prefetch(prefetch + kk * (step == kB ? kB : step));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + kk * 8 + r);
      acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(c + r * ldc, _mm256_add_ps(_mm256_loadu_ps(c + r * ldc), acc[r][0]));
    _mm256_storeu_ps(c + r * ldc + 8, _mm256_add_ps(_mm256_loadu_ps(c + r * ldc + 8), acc[r][1]));
  }
}

// C[8, N] (zeroed by the caller) += A[8, K] · B for K blocks [b0, b1); A packed [K][8].
__attribute__((target("avx2,fma"))) void part(const float* a_packed, const float* B, int64_t N, int64_t b0,
                                              int64_t b1, bool blocked, int64_t ahead, float* C) {
  const int64_t panels = N / kB;
  for (int64_t blk = b0; blk < b1; ++blk) {
    const float* a = a_packed + blk * kB * 8;
    for (int64_t p = 0; p < panels; ++p) {
      const float* b = blocked ? B + (blk * panels + p) * kB * kB : B + blk * kB * N + p * kB;
      const int64_t step = blocked ? kB : N;
      const float* pf = blocked ? b + ahead : b + 2 * kB;  // strided: gemm's two panels ahead, every row
      tile<6>(a, b, step, C + p * kB, N, pf);
      float* c2 = C + 6 * N + p * kB;
      const float* a2 = a + 6;  // rows 6 and 7 of the packed A
      tile<2>(a2, b, step, c2, N, nullptr);
    }
  }
}

// C[1, N] (zeroed by the caller) += a[K] · B (blocked) for K blocks [b0, b1): per panel two chains
// of 16 rows, added into C.
__attribute__((target("avx2,fma"))) void part_one_row(const float* a, const float* B, int64_t N, int64_t b0,
                                                      int64_t b1, int64_t ahead, float* C) {
  const int64_t panels = N / kB;
  for (int64_t blk = b0; blk < b1; ++blk)
    for (int64_t p = 0; p < panels; ++p) {
      const float* b = B + (blk * panels + p) * kB * kB;
      __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
#pragma GCC unroll 16
      for (int kk = 0; kk < kB; ++kk) {
        __builtin_prefetch(b + kk * kB + ahead);
        const __m256 ak = _mm256_broadcast_ss(a + blk * kB + kk);
        s0 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b + kk * kB), s0);
        s1 = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b + kk * kB + 8), s1);
      }
      float* c = C + p * kB;
      _mm256_storeu_ps(c, _mm256_add_ps(_mm256_loadu_ps(c), s0));
      _mm256_storeu_ps(c + 8, _mm256_add_ps(_mm256_loadu_ps(c + 8), s1));
    }
}

// part_one_row with the thread's blocks cut into 4 runs read side by side, a panel of each in turn:
// four concurrent streams, as kernels::gemm's one-row stream reads 8 rows of the [K, N] layout.
__attribute__((target("avx2,fma"))) void part_one_row4(const float* a, const float* B, int64_t N, int64_t b0,
                                                       int64_t b1, int64_t ahead, float* C) {
  const int64_t panels = N / kB, per = (b1 - b0) / 4;
  if (per == 0) return part_one_row(a, B, N, b0, b1, ahead, C);
  for (int64_t j = 0; j < per; ++j)
    for (int64_t p = 0; p < panels; ++p) {
      __m256 s[4][2];
      const float* b[4];
      for (int q = 0; q < 4; ++q) {
        s[q][0] = s[q][1] = _mm256_setzero_ps();
        b[q] = B + ((b0 + q * per + j) * panels + p) * kB * kB;
      }
#pragma GCC unroll 4
      for (int kk = 0; kk < kB; ++kk)
#pragma GCC unroll 4
        for (int q = 0; q < 4; ++q) {
          __builtin_prefetch(b[q] + kk * kB + ahead);
          const __m256 ak = _mm256_broadcast_ss(a + (b0 + q * per + j) * kB + kk);
          s[q][0] = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b[q] + kk * kB), s[q][0]);
          s[q][1] = _mm256_fmadd_ps(ak, _mm256_loadu_ps(b[q] + kk * kB + 8), s[q][1]);
        }
      float* c = C + p * kB;
      for (int q = 0; q < 4; ++q) {
        _mm256_storeu_ps(c, _mm256_add_ps(_mm256_loadu_ps(c), s[q][0]));
        _mm256_storeu_ps(c + 8, _mm256_add_ps(_mm256_loadu_ps(c + 8), s[q][1]));
      }
    }
  if (b0 + 4 * per < b1) part_one_row(a, B, N, b0 + 4 * per, b1, ahead, C);
}

}  // namespace

int main(int argc, char** argv) {
  const int passes = argc > 1 ? std::atoi(argv[1]) : 20;
  const int64_t M = argc > 2 ? std::atoi(argv[2]) : 8;
  const int64_t ahead = argc > 3 ? std::atoi(argv[3]) : 512;
  const bool side = argc > 4 && std::string(argv[4]) == "side";
  if ((M != 8 && M != 1) || passes < 1) {
    std::fprintf(stderr, "usage: bench_blocked_b [passes] [8|1] [prefetch floats]\n");
    return 2;
  }
  struct Product {
    int64_t K, N;
  };
  const Product products[4] = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}};
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<mhsa::Tensor> strided, blocked;
  double bytes = 0, flops = 0;
  for (int l = 0; l < 12; ++l)
    for (const Product& p : products) {
      strided.emplace_back(std::vector<int64_t>{p.K, p.N});
      blocked.emplace_back(std::vector<int64_t>{p.K, p.N});
      float* s = strided.back().data();
      float* b = blocked.back().data();
      for (int64_t e = 0; e < p.K * p.N; ++e) s[e] = normal(gen);
      const int64_t panels = p.N / kB;
      for (int64_t k = 0; k < p.K; ++k)
        for (int64_t j = 0; j < p.N; ++j)
          b[((k / kB * panels + j / kB) * kB + k % kB) * kB + j % kB] = s[k * p.N + j];
      bytes += 4.0 * p.K * p.N;
      flops += 2.0 * M * p.K * p.N;
    }
  mhsa::Tensor A({M, 3072}), Ap({3072, 8}), C({2, M, 3072}), Cl({M, 3072});
  for (int64_t e = 0; e < A.numel(); ++e) A.data()[e] = normal(gen) * 50.0f;
  for (int64_t k = 0; k < 3072; ++k)
    for (int64_t r = 0; r < 8; ++r) Ap.data()[k * 8 + r] = A.data()[r * 3072 + k];
  const auto& k = mhsa::kernels::kernels();
  const auto run = [&](bool use_blocked) {
    for (size_t w = 0; w < strided.size(); ++w) {
      const Product& p = products[w % 4];
      const float* B = (use_blocked ? blocked : strided)[w].data();
      const int64_t blocks = p.K / kB;
      if (M == 1 && !use_blocked) {  // one row on today's layout: the library's stream
        k.gemm(1, p.N, p.K, A.data(), p.K, B, p.N, nullptr, C.data(), p.N);
        continue;
      }
#pragma omp parallel num_threads(2)
      {
        const int t = omp_get_thread_num();
        float* c = C.data() + t * M * 3072;
        std::fill(c, c + M * p.N, 0.0f);
        if (M == 1 && side)
          part_one_row4(A.data(), B, p.N, blocks * t / 2, blocks * (t + 1) / 2, ahead, c);
        else if (M == 1)
          part_one_row(A.data(), B, p.N, blocks * t / 2, blocks * (t + 1) / 2, ahead, c);
        else
          part(Ap.data(), B, p.N, blocks * t / 2, blocks * (t + 1) / 2, use_blocked, ahead, c);
      }
      for (int64_t e = 0; e < M * p.N; ++e) C.data()[e] += C.data()[M * 3072 + e];
    }
  };
  const auto library = [&] {
    for (size_t w = 0; w < strided.size(); ++w) {
      const Product& p = products[w % 4];
      k.gemm(M, p.N, p.K, A.data(), p.K, strided[w].data(), p.N, nullptr, Cl.data(), p.N);
    }
  };
  run(false);
  std::vector<float> c_strided(C.data(), C.data() + M * 768);
  run(true);
  for (int64_t e = 0; M == 8 && e < M * 768; ++e)  // (rows 1: the prototype's sums are not gemm's)
    if (c_strided[e] != C.data()[e]) {
      std::fprintf(stderr, "layouts differ at %lld\n", static_cast<long long>(e));
      return 1;
    }
  std::vector<double> t[3];
  for (int pass = 0; pass <= passes; ++pass)
    for (int v = 0; v < 3; ++v) {
      const auto t0 = std::chrono::steady_clock::now();
      if (v == 2) library(); else run(v == 1);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (pass > 0) t[v].push_back(s);
    }
  const char* names[3] = {M == 1 ? "kernels::gemm, strided B (again)" : "prototype, strided B (today's layout)",
                          "prototype, blocked B", "kernels::gemm, strided B"};
  for (int v = 0; v < 3; ++v) {
    std::sort(t[v].begin(), t[v].end());
    const double med = t[v][t[v].size() / 2];
    std::printf("%-40s median %6.2f ms  best %6.2f ms  B at %5.1f GB/s  %6.1f GFLOP/s\n", names[v], med * 1e3,
                t[v].front() * 1e3, bytes / med / 1e9, flops / med / 1e9);
  }
}
