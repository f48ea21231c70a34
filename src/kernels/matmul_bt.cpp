// kernels/matmul_bt.cpp — C[M, N] = A[M, K] · B[N, K]ᵀ for a few rows M, compiled once per ISA:
// the weight streams of decoding, where every projection is a pass over an [out, in] matrix (an
// nn.Linear weight, or the LM head's logits = h · wteᵀ with wte stored [V, C]). Several matrices
// that multiply the same A (q | k | v, gate | up) are one call: their rows form one row space
// that the threads split evenly, in groups of kGroup rows, each thread one contiguous range, read
// in order (one sequential stream: interleaving several rows' streams measured slower). Each row
// of B is read once, from memory, and dotted with up to kRows rows of A held in L1. Every C
// element is one FMA chain over k in vector steps and the same horizontal sum, whatever the
// grouping and the thread count. Not for large M: that is a GEMM.
//
// The _bf16 variants read B as bfloat16 (uint16 storage, half the bytes of the stream) and widen
// it in registers; widening is exact, so their results are bitwise those of the float kernels on
// the widened B. The _q8_0 variants read B as Q8_0 blocks (34 bytes per 32 weights instead of
// 128): their chains run over blocks (see dot_q8), so they are close to, not bitwise, the float
// kernels on the dequantised B.
#include <omp.h>

#include <algorithm>
#include <type_traits>

#include "kernels/dispatch.h"
#include "kernels/isa/simd.h"

namespace mhsa::kernels::MHSA_ISA {
namespace {

constexpr int kRows = 4;   // rows of A per pass over a group of B rows
constexpr int kGroup = 4;  // rows of B per group: the unit the threads split
constexpr int64_t kParallel = int64_t{1} << 15;  // below this many multiply-adds per A row: one thread

// a·b + c fused wherever the ISA has FMA: written out, so that the contraction of simd.h's fma
// cannot differ between dot_rows and dot_cols (their chains must be the same bits).
inline Vec fused(Vec a, Vec b, Vec c) {
#if defined(__AVX512F__)
  return (Vec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__AVX2__) && defined(__FMA__)
  return (Vec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return fma(a, b, c);
#endif
}

inline Vec load_b(const float* b) { return load(b); }
inline Vec load_b(const uint16_t* b) { return load_bf16(b); }
inline Vec load_partial_b(const float* b, int n) { return load_partial(b, n, 0.0f); }
inline Vec load_partial_b(const uint16_t* b, int n) { return load_partial_bf16(b, n); }

// out[r·ldc] = A row r · b for R rows of A: one FMA chain per row over k in vector steps, then
// the fixed-order horizontal sum. TB: float, or uint16_t for bfloat16.
template <int R, class TB>
void dot_rows(int64_t K, const float* A, int64_t lda, const TB* b, float* out, int64_t ldc) {
  Vec acc[R] = {};
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    const Vec bv = load_b(b + k);
    for (int r = 0; r < R; ++r) acc[r] = fused(load(A + r * lda + k), bv, acc[r]);
  }
  if (k < K) {
    const int rest = static_cast<int>(K - k);
    const Vec bv = load_partial_b(b + k, rest);
    for (int r = 0; r < R; ++r) acc[r] = fused(load_partial(A + r * lda + k, rest, 0.0f), bv, acc[r]);
  }
  for (int r = 0; r < R; ++r) out[r * ldc] = reduce_sum(acc[r]);
}

// out[j] = a · B row j for J rows of B (ldb apart), for a single row a of A: J independent
// chains, each exactly dot_rows' chain. A bfloat16 row is read twice as fast as a float one, so
// one chain's FMA latency would bound it (GPT-2 decode measured 1.13× the float32 speed), and
// the J interleaved streams need a prefetch of the next group's rows (J·ldb ahead; harmless past
// the end of B): on the LM head's shape (N 50257, K 768, 1 thread, medians of 40 alternating
// runs) 2.0× the float kernel with it, 1.7× without.
template <int J, class TB>
void dot_cols(int64_t K, const float* a, const TB* B, int64_t ldb, float* out) {
  Vec acc[J] = {};
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    const Vec av = load(a + k);
    if (k % (64 / sizeof(TB)) == 0)
      for (int j = 0; j < J; ++j) __builtin_prefetch(B + (J + j) * ldb + k);
    for (int j = 0; j < J; ++j) acc[j] = fused(av, load_b(B + j * ldb + k), acc[j]);
  }
  if (k < K) {
    const int rest = static_cast<int>(K - k);
    const Vec av = load_partial(a + k, rest, 0.0f);
    for (int j = 0; j < J; ++j) acc[j] = fused(av, load_partial_b(B + j * ldb + k, rest), acc[j]);
  }
  for (int j = 0; j < J; ++j) out[j] = reduce_sum(acc[j]);
}

// C[M, rows] = A[M, K] · B[rows, K]ᵀ, B's rows in order (one sequential stream when they are
// contiguous), each group of kGroup rows L1-resident while every kRows rows of A pass over it.
template <class TB>
void range_product(int64_t M, int64_t K, const float* A, int64_t lda, const TB* B, int64_t ldb, int64_t rows,
                   float* C, int64_t ldc) {
  if constexpr (!std::is_same_v<TB, float>) {
    if (M == 1) {  // decoding one sequence: a group's rows side by side
      int64_t n = 0;
      for (; n + kGroup <= rows; n += kGroup) dot_cols<kGroup>(K, A, B + n * ldb, ldb, C + n);
      for (; n < rows; ++n) dot_cols<1>(K, A, B + n * ldb, ldb, C + n);
      return;
    }
  }
  for (int64_t n0 = 0; n0 < rows; n0 += kGroup)
    for (int64_t m = 0; m < M; m += kRows)
      for (int64_t n = n0; n < std::min<int64_t>(rows, n0 + kGroup); ++n) {
        const float* a = A + m * lda;
        const TB* b = B + n * ldb;
        float* out = C + m * ldc + n;
        switch (std::min<int64_t>(kRows, M - m)) {
          case 4: dot_rows<4>(K, a, lda, b, out, ldc); break;
          case 3: dot_rows<3>(K, a, lda, b, out, ldc); break;
          case 2: dot_rows<2>(K, a, lda, b, out, ldc); break;
          default: dot_rows<1>(K, a, lda, b, out, ldc); break;
        }
      }
}

// ---- Q8_0 B ---------------------------------------------------------------------------------
// A block's 32 quants are widened to float in registers (exact) and dotted with A's 32 floats in
// kBlockVecs lanes-wide steps; the block's vector of partial sums then takes its scale in one FMA
// into the row's accumulator (the float64 twin is then the plain sum over the dequantised B).
// The alternative, A quantised to int8 per block and integer dot products (llama.cpp's Q8_0
// path, vpmaddubsw + vpmaddwd), is measured beside this one by bench/bench_q8_0. On the quiet
// 2-core AVX2 host (medians of 5 alternating rounds, GB/s of B) it is faster where K = 768:
// GPT-2's LM head 13.6 vs 9.8 (1 thread), 19.8 vs 16.7 (2); c_fc 14.1 vs 9.9, 22.2 vs 17.1; and
// level at c_proj (K = 3072: 14.0 vs 14.0, 17.0 vs 18.0). This loop is compute-bound at about 60%
// of the read bandwidth with 2 threads: switching to the integer path (adding A's rounding,
// ~0.4% of each block's scale, and a twin that quantises A too) is the next step, not yet taken.
constexpr int kBlockVecs = static_cast<int>(kQ8Block) / kLanes;  // 2 (AVX-512), 4 (AVX2), 8 (portable)

// Σ a[i]·q[i] over one block, lane by lane: a product, then kBlockVecs − 1 FMAs in order.
inline Vec block_dot(const float* a, const Vec* q) {
  Vec s = load(a) * q[0];
  for (int v = 1; v < kBlockVecs; ++v) s = fused(load(a + v * kLanes), q[v], s);
  return s;
}

// out[r·ldc + j] = A row r · B row j for R rows of A (lda apart) and J rows of B (ldb blocks
// apart) over nb blocks: per block acc = fma(d, block_dot, acc), then the fixed horizontal sum.
// Each (r, j) is the same chain for any R and J. With J > 1 (one row of A, decoding) the J
// interleaved streams prefetch the next group's rows, as dot_cols does.
template <int R, int J>
void dot_q8(int64_t nb, const float* A, int64_t lda, const BlockQ8_0* B, int64_t ldb, float* out, int64_t ldc) {
  Vec acc[R][J] = {};
  for (int64_t b = 0; b < nb; ++b) {
    if constexpr (J > 1)
      if (b % 2 == 0)
        for (int j = 0; j < J; ++j) __builtin_prefetch(B + (J + j) * ldb + b);
    for (int j = 0; j < J; ++j) {
      const BlockQ8_0& blk = B[j * ldb + b];
      Vec q[kBlockVecs];
      for (int v = 0; v < kBlockVecs; ++v) q[v] = load_q8(blk.qs + v * kLanes);
      const Vec d = splat(f16_scalar(blk.d));
      for (int r = 0; r < R; ++r) acc[r][j] = fused(d, block_dot(A + r * lda + b * kQ8Block, q), acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) out[r * ldc + j] = reduce_sum(acc[r][j]);
}

// range_product for a Q8_0 B (ldb in blocks): one row of A against kGroup rows of B at a time, or
// each group's rows in turn against kRows rows of A.
void range_product(int64_t M, int64_t K, const float* A, int64_t lda, const BlockQ8_0* B, int64_t ldb, int64_t rows,
                   float* C, int64_t ldc) {
  const int64_t nb = K / kQ8Block;
  if (M == 1) {
    int64_t n = 0;
    for (; n + kGroup <= rows; n += kGroup) dot_q8<1, kGroup>(nb, A, lda, B + n * ldb, ldb, C + n, ldc);
    for (; n < rows; ++n) dot_q8<1, 1>(nb, A, lda, B + n * ldb, ldb, C + n, ldc);
    return;
  }
  for (int64_t n0 = 0; n0 < rows; n0 += kGroup)
    for (int64_t m = 0; m < M; m += kRows)
      for (int64_t n = n0; n < std::min<int64_t>(rows, n0 + kGroup); ++n) {
        const float* a = A + m * lda;
        const BlockQ8_0* b = B + n * ldb;
        float* out = C + m * ldc + n;
        switch (std::min<int64_t>(kRows, M - m)) {
          case 4: dot_q8<4, 1>(nb, a, lda, b, ldb, out, ldc); break;
          case 3: dot_q8<3, 1>(nb, a, lda, b, ldb, out, ldc); break;
          case 2: dot_q8<2, 1>(nb, a, lda, b, ldb, out, ldc); break;
          default: dot_q8<1, 1>(nb, a, lda, b, ldb, out, ldc); break;
        }
      }
}

template <class Part>
void parts_product(int64_t M, int64_t K, const float* A, int64_t lda, const Part* parts, int count) {
  int64_t groups = 0, total_rows = 0;  // every part's rows in groups of kGroup (its last one may be short)
  for (int p = 0; p < count; ++p) {
    groups += (parts[p].N + kGroup - 1) / kGroup;
    total_rows += parts[p].N;
  }
#pragma omp parallel if (total_rows * K >= kParallel)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t g0 = groups * t / threads, g1 = groups * (t + 1) / threads;  // this thread's groups
    int64_t first = 0;                                                          // the part's first group
    for (int p = 0; p < count && first < g1; ++p) {
      const Part& part = parts[p];
      const int64_t part_groups = (part.N + kGroup - 1) / kGroup;
      const int64_t lo = std::max(g0, first) - first, hi = std::min(g1, first + part_groups) - first;
      if (lo < hi) {
        const int64_t n0 = lo * kGroup, n1 = std::min(part.N, hi * kGroup);
        range_product(M, K, A, lda, part.B + n0 * part.ldb, part.ldb, n1 - n0, part.C + n0, part.ldc);
      }
      first += part_groups;
    }
  }
}

}  // namespace

void matmul_bt_parts(int64_t M, int64_t K, const float* A, int64_t lda, const BtPart* parts, int count) {
  parts_product(M, K, A, lda, parts, count);
}

void matmul_bt_parts_bf16(int64_t M, int64_t K, const float* A, int64_t lda, const BtPart16* parts, int count) {
  parts_product(M, K, A, lda, parts, count);
}

void matmul_bt_parts_q8_0(int64_t M, int64_t K, const float* A, int64_t lda, const BtPartQ8* parts, int count) {
  parts_product(M, K, A, lda, parts, count);
}

void matmul_bt(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
               int64_t ldc) {
  const BtPart part{B, ldb, N, C, ldc};
  matmul_bt_parts(M, K, A, lda, &part, 1);
}

void matmul_bt_bf16(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                    float* C, int64_t ldc) {
  const BtPart16 part{B, ldb, N, C, ldc};
  matmul_bt_parts_bf16(M, K, A, lda, &part, 1);
}

void matmul_bt_q8_0(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ8_0* B, int64_t ldb,
                    float* C, int64_t ldc) {
  const BtPartQ8 part{B, ldb, N, C, ldc};
  matmul_bt_parts_q8_0(M, K, A, lda, &part, 1);
}

}  // namespace mhsa::kernels::MHSA_ISA
