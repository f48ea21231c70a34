// kernels/matmul_bt.cpp — C[M, N] = A[M, K] · B[N, K]ᵀ for a few rows M, compiled once per ISA:
// the weight streams of decoding, where every projection is a pass over an [out, in] matrix (an
// nn.Linear weight, or the LM head's logits = h · wteᵀ with wte stored [V, C]). Several matrices
// that multiply the same A (q | k | v, gate | up) are one call: their rows form one row space
// that the threads share in groups of kGroup rows, contiguous ranges (isa/bt_parts.h: one even
// range a thread for one row of A, claimed from the front for more). A range is read as
// ascending streams: one row at a time, or rows far apart side by side (its halves; for a 16-bit
// B its quarters, or with several rows of A its thirds), which read faster than adjacent rows
// interleaved. Each row of B is read once, from memory, and dotted with up to
// 8 rows of A held in L1 (a 16-bit B with several rows of A: in register blocks of 3 rows of B,
// dot_block). Every C element is one FMA chain over k in vector steps and the same horizontal
// sum, whatever the grouping, the blocking and the thread count. Not for large M: that is a GEMM.
//
// The _bf16 variants read B as bfloat16 (uint16 storage, half the bytes of the stream) and widen
// it in registers; widening is exact, so their results are bitwise those of the float kernels on
// the widened B. The _f16 variants are the same for IEEE float16 B (vcvtph2ps). Q8_0 and Q4_K B
// have their own streams, on the same plan: matmul_q8_0.cpp, matmul_q4_k.cpp.
#include <omp.h>

#include <algorithm>
#include <type_traits>

#include "kernels/dispatch.h"
#include "kernels/isa/simd.h"
#include "kernels/isa/bt_parts.h"

namespace mhsa::kernels::MHSA_ISA {
namespace {


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
inline Vec load_b(const float16* b) { return load_f16(&b->bits); }
inline Vec load_partial_b(const float16* b, int n) { return load_partial_kv(b, n); }

// A software prefetch this many elements ahead in B's stream (2 KiB, whatever the element type;
// past the row it is the next row's start when rows are contiguous, and harmless when not), once
// per cache line. One Zen 3 core, float B from memory, CPU time, 3 alternating rounds
// (docs/performance-history.md, "A prefetch in the B·Aᵀ stream"): 8 rows × N 2304 × K 768 1.1–1.3×
// faster than without, at K
// 3072 ~1.15×, one row ~1.1×; 1 KiB ahead about the same, 4 and 6 KiB less. A 16-bit B was
// prefetched 512 elements (1 KiB) ahead until GPT-2's bfloat16 weights, one row of A on a Zen 5
// (pass-by-pass alternation), read 1.09–1.10× faster 2 KiB ahead (4 and 8 KiB: 0.98×, 0.93×).
template <class TB>
constexpr int64_t kPrefetch = 2048 / sizeof(TB);

// out[r·ldc] = A row r · b for R rows of A: one FMA chain per row over k in vector steps, then
// the fixed-order horizontal sum. TB: float, or uint16_t for bfloat16.
template <int R, class TB>
void dot_rows(int64_t K, const float* A, int64_t lda, const TB* b, float* out, int64_t ldc) {
  Vec acc[R] = {};
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    const Vec bv = load_b(b + k);
    if (k % (64 / sizeof(TB)) == 0) __builtin_prefetch(b + k + kPrefetch<TB>);
    for (int r = 0; r < R; ++r) acc[r] = fused(load(A + r * lda + k), bv, acc[r]);
  }
  if (k < K) {
    const int rest = static_cast<int>(K - k);
    const Vec bv = load_partial_b(b + k, rest);
    for (int r = 0; r < R; ++r) acc[r] = fused(load_partial(A + r * lda + k, rest, 0.0f), bv, acc[r]);
  }
  for (int r = 0; r < R; ++r) out[r * ldc] = reduce_sum(acc[r]);
}

// out[j·apart] = a · B row j·apart for J rows of B, `apart` rows of ldb elements from each other,
// for a single row a of A: J independent chains, each exactly dot_rows' chain, each row its own
// stream with dot_rows' prefetch kPrefetch ahead (past the row: the next row, when rows are
// contiguous). Decoding one sequence uses J = 2 with the rows half a range apart (range_product):
// one FMA chain has 4 cycles' latency, which bounds a single 16-bit row at 8 elements per 4 cycles
// (~12 GB/s on a 3 GHz core) and leaves a float row no slack to catch up after a stall. Two rows
// side by side give two chains; rows far apart keep each a plain ascending stream, which the
// memory reads faster than two adjacent rows interleaved with the next pair prefetched (SmolLM2's
// shapes, 2 threads, B from memory: float16 1.07–1.24×, float 1.07–1.19× in a scratch harness;
// the decode numbers are in docs/performance-history.md, "Decode streams as separate ascending streams").
template <int J, class TB>
void dot_cols(int64_t K, const float* a, const TB* B, int64_t ldb, int64_t apart, float* out) {
  Vec acc[J] = {};
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    const Vec av = load(a + k);
    if (k % (64 / sizeof(TB)) == 0)
      for (int j = 0; j < J; ++j) __builtin_prefetch(B + j * apart * ldb + k + kPrefetch<TB>);
    for (int j = 0; j < J; ++j) acc[j] = fused(av, load_b(B + j * apart * ldb + k), acc[j]);
  }
  if (k < K) {
    const int rest = static_cast<int>(K - k);
    const Vec av = load_partial(a + k, rest, 0.0f);
    for (int j = 0; j < J; ++j) acc[j] = fused(av, load_partial_b(B + j * apart * ldb + k, rest), acc[j]);
  }
  for (int j = 0; j < J; ++j) out[j * apart] = reduce_sum(acc[j]);
}

// Rows of B dotted side by side with one row of A (range_product, M = 1), each a part of the
// range apart: two for a float B; four for a 16-bit B, whose row supplies 16 elements a load at
// half the bytes, so that two chains of 4 cycles' latency bound it below what memory delivers. The
// bfloat16 weights of GPT-2 124M (its 48 projections and LM head, 249 MB from memory, 2 threads,
// a scratch harness alternating the variants pass by pass on a Zen 5): four rows 1.10-1.13x two,
// six 1.13x, eight 1.07x, three 1.07x, one 0.94x (docs/performance-history.md,
// "A Zen 5: the 8-row tiles in 512-bit registers").
template <class TB>
inline constexpr int kColStreams = std::is_same_v<TB, float> ? 2 : 4;

// Several rows of A (serving several sequences, M = 2..8): J rows of B at a time against R rows
// of A, J·R accumulators, each the same FMA chain over k and the same horizontal sum as dot_rows'
// (so the same bits). With one row of B against 8 of A, a vector step is 9 loads for 8 FMAs, and
// 8 chains for two FMA units of 4 cycles' latency leave no slack: ~60 GFLOP/s per core on this
// project's Zen 3 with B in the caches. 3 rows of B against 4 of A is 7 loads (and 3 widenings
// for 16-bit B) for 12 FMAs in 12 chains, in 16 registers: 77–90 GFLOP/s in a scratch harness,
// and an 8-sequence step with 16-bit weights 1.18–1.19× the one-row-of-B stream's
// (docs/performance-history.md, "16-bit weights at 2–8 rows in register blocks"). The J rows are `apart`
// rows of ldb
// elements from each other, their results `apart` columns of C: range_product takes them a third
// of its range apart, each row its own ascending stream (as dot_cols does for one row of A),
// which read faster than 3 adjacent rows with the next block prefetched: 1.12–1.15× on 4- and
// 8-sequence steps ("Decode streams as separate ascending streams"). With `prefetch` (the first pass; later
// passes find
// the block in L1) each row is prefetched kPrefetch ahead, once per cache line.
constexpr int kBlockCols = 3;  // J: rows of B per register block
constexpr int kBlockRows = 4;  // R at most: rows of A per pass

template <int J, int R, class TB>
void dot_block(int64_t K, const float* A, int64_t lda, const TB* B, int64_t ldb, int64_t apart, float* out,
               int64_t ldc, bool prefetch) {
  Vec acc[J][R] = {};
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    Vec bv[J];
    for (int j = 0; j < J; ++j) bv[j] = load_b(B + j * apart * ldb + k);
    if (prefetch && k % (64 / sizeof(TB)) == 0)
      for (int j = 0; j < J; ++j) __builtin_prefetch(B + j * apart * ldb + k + kPrefetch<TB>);
    for (int r = 0; r < R; ++r) {
      const Vec av = load(A + r * lda + k);
      for (int j = 0; j < J; ++j) acc[j][r] = fused(av, bv[j], acc[j][r]);
    }
  }
  if (k < K) {
    const int rest = static_cast<int>(K - k);
    Vec bv[J];
    for (int j = 0; j < J; ++j) bv[j] = load_partial_b(B + j * apart * ldb + k, rest);
    for (int r = 0; r < R; ++r) {
      const Vec av = load_partial(A + r * lda + k, rest, 0.0f);
      for (int j = 0; j < J; ++j) acc[j][r] = fused(av, bv[j], acc[j][r]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) out[r * ldc + j * apart] = reduce_sum(acc[j][r]);
}

// One block of J rows of B (apart as in dot_block) against all M rows of A, in passes of at most
// kBlockRows rows of A, as even as they can be (8 rows: 4 + 4; 6: 3 + 3).
template <int J, class TB>
void dot_block_passes(int64_t M, int64_t K, const float* A, int64_t lda, const TB* B, int64_t ldb, int64_t apart,
                      float* C, int64_t ldc) {
  const int64_t passes = (M + kBlockRows - 1) / kBlockRows;
  for (int64_t p = 0; p < passes; ++p) {
    const int64_t m0 = M * p / passes, m1 = M * (p + 1) / passes;
    const float* a = A + m0 * lda;
    float* out = C + m0 * ldc;
    switch (m1 - m0) {
      case 4: dot_block<J, 4>(K, a, lda, B, ldb, apart, out, ldc, p == 0); break;
      case 3: dot_block<J, 3>(K, a, lda, B, ldb, apart, out, ldc, p == 0); break;
      case 2: dot_block<J, 2>(K, a, lda, B, ldb, apart, out, ldc, p == 0); break;
      default: dot_block<J, 1>(K, a, lda, B, ldb, apart, out, ldc, p == 0); break;
    }
  }
}

// Rows of A per pass of the float stream: 8 independent FMA chains (two FMA units of 4 cycles'
// latency need 8 in flight; a pass of 4 rows ran at half the FMA rate, and a server decoding 8
// sequences needed two passes). 8 A rows, one B vector and a load fit 16 registers. At 8 rows a
// float B is read at ~the memory's rate this way; the register blocks above, which read kBlockCols
// rows of B side by side, were slower from memory (SmolLM2's 8-sequence step 0.87–1.07× with
// them), so the float stream keeps one row of B at a time.
constexpr int kFloatRows = 8;

// C[M, rows] = A[M, K] · B[rows, K]ᵀ. One row of A: kColStreams rows of B side by side, row i of
// each of the range's parts (dot_cols), each an ascending stream; the last rows % kColStreams alone.
// More, float: each group of kGroup rows of B L1-resident while every kFloatRows rows of A pass
// over it. More, 16-bit: blocks of kBlockCols rows of B, row i of each third of the range, each
// block L1-resident while the rows of A pass over it (dot_block_passes).
template <class TB>
void range_product(int64_t M, int64_t K, const float* A, int64_t lda, const TB* B, int64_t ldb, int64_t rows,
                   float* C, int64_t ldc) {
  if (M == 1) {  // decoding one sequence: row i of each of the range's kColStreams parts side by side
    constexpr int kStreams = kColStreams<TB>;
    const int64_t part = rows / kStreams;
    for (int64_t n = 0; n < part; ++n) dot_cols<kStreams>(K, A, B + n * ldb, ldb, part, C + n);
    for (int64_t n = kStreams * part; n < rows; ++n) dot_cols<1>(K, A, B + n * ldb, ldb, 0, C + n);
  } else if constexpr (std::is_same_v<TB, float>) {
    for (int64_t n0 = 0; n0 < rows; n0 += kGroup)
      for (int64_t m = 0; m < M; m += kFloatRows)
        for (int64_t n = n0; n < std::min<int64_t>(rows, n0 + kGroup); ++n) {
          const float* a = A + m * lda;
          const float* b = B + n * ldb;
          float* out = C + m * ldc + n;
          switch (std::min<int64_t>(kFloatRows, M - m)) {
            case 8: dot_rows<8>(K, a, lda, b, out, ldc); break;
            case 7: dot_rows<7>(K, a, lda, b, out, ldc); break;
            case 6: dot_rows<6>(K, a, lda, b, out, ldc); break;
            case 5: dot_rows<5>(K, a, lda, b, out, ldc); break;
            case 4: dot_rows<4>(K, a, lda, b, out, ldc); break;
            case 3: dot_rows<3>(K, a, lda, b, out, ldc); break;
            case 2: dot_rows<2>(K, a, lda, b, out, ldc); break;
            default: dot_rows<1>(K, a, lda, b, out, ldc); break;
          }
        }
  } else {  // 16-bit: row i of each third of the range side by side; the last rows % 3 together
    const int64_t third = rows / kBlockCols;
    for (int64_t n = 0; n < third; ++n)
      dot_block_passes<kBlockCols>(M, K, A, lda, B + n * ldb, ldb, third, C + n, ldc);
    const int64_t n = kBlockCols * third;
    if (rows - n == 2) dot_block_passes<2>(M, K, A, lda, B + n * ldb, ldb, 1, C + n, ldc);
    if (rows - n == 1) dot_block_passes<1>(M, K, A, lda, B + n * ldb, ldb, 1, C + n, ldc);
  }
}

template <class Part>
void float_parts_product(int64_t M, int64_t K, const float* A, int64_t lda, const Part* parts, int count) {
  parts_product(K, parts, count, /*even=*/M == 1, [&](const Part& part, int64_t n0, int64_t n) {
    range_product(M, K, A, lda, part.B + n0 * part.ldb, part.ldb, n, part.C + n0, part.ldc);
  });
}

}  // namespace

void matmul_bt_parts(int64_t M, int64_t K, const float* A, int64_t lda, const BtPart* parts, int count) {
  float_parts_product(M, K, A, lda, parts, count);
}

void matmul_bt_parts_bf16(int64_t M, int64_t K, const float* A, int64_t lda, const BtPart16* parts, int count) {
  float_parts_product(M, K, A, lda, parts, count);
}

void matmul_bt_parts_f16(int64_t M, int64_t K, const float* A, int64_t lda, const BtPartF16* parts, int count) {
  float_parts_product(M, K, A, lda, parts, count);
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

void matmul_bt_f16(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float16* B, int64_t ldb,
                   float* C, int64_t ldc) {
  const BtPartF16 part{B, ldb, N, C, ldc};
  matmul_bt_parts_f16(M, K, A, lda, &part, 1);
}

}  // namespace mhsa::kernels::MHSA_ISA
