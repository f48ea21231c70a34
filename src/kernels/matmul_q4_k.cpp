// kernels/matmul_q4_k.cpp — C[M, N] = A[M, K] · B[N, K]ᵀ for a few rows M with B stored as Q4_K
// blocks (kernels/q4_k.h: 144 bytes per 256 weights, a ninth of float32's bytes), compiled once
// per ISA: the weight streams of decoding a 4-bit model. The same plan as matmul_bt.cpp's
// streams: several matrices that multiply one A are one call, their rows one row space that the
// threads split evenly in groups of kGroup rows, each thread one contiguous range read in order;
// with one row of A, kGroup rows of B are read side by side (independent chains, the next
// group's rows prefetched).
//
// The arithmetic: a sub-block's 32 weights are (d·sc)·q − dmin·m, so its share of a dot product
// is (d·sc)·Σ q·a − (dmin·m)·Σ a. The quants are widened from their nibbles in registers (exact),
// Σ q·a and Σ a are summed lane-wise in float32 over the sub-block, and each joins the row's
// accumulator in one FMA with its coefficient (the products d·sc, dmin·m rounded as the
// dequantiser rounds them). Every C element is one fixed chain over the blocks whatever the
// grouping and the thread count; close to, not bitwise, the float kernel on the dequantised B
// (the float64 twin: matmul_bt_q4_k_ref). Not for large M: gemm_bt_q4_k (gemm.cpp).
#include <omp.h>

#include <algorithm>

#include "kernels/dispatch.h"
#include "kernels/isa/simd.h"
#include "kernels/isa/bt_parts.h"

namespace mhsa::kernels::MHSA_ISA {
namespace {

constexpr int kSubVecs = static_cast<int>(kQ4KSub) / kLanes;  // vectors per sub-block: 2, 4 or 8

inline Vec fused(Vec a, Vec b, Vec c) {
#if defined(__AVX512F__)
  return (Vec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__AVX2__) && defined(__FMA__)
  return (Vec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  return fma(a, b, c);
#endif
}

// kLanes bytes from p, zero-extended to 32 bits (vpmovzxbd on x86).
inline IVec load_u8(const uint8_t* p) {
#if defined(__AVX512F__)
  return (IVec)_mm512_maskz_cvtepu8_epi32(0xFFFF, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#elif defined(__AVX2__)
  return (IVec)_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
#else
  using Bytes = uint8_t __attribute__((vector_size(kLanes)));
  Bytes q;
  std::memcpy(&q, p, sizeof(Bytes));
  return __builtin_convertvector(q, IVec);
#endif
}

// One block's coefficients: scale[s] = d·sc[s], offset[s] = dmin·m[s], rounded as the dequantiser
// rounds them.
struct Coefficients {
  float scale[8], offset[8];
};
inline Coefficients coefficients(const BlockQ4_K& blk) {
  Coefficients c;
  const float d = f16_scalar(blk.d), dmin = f16_scalar(blk.dmin);
  for (int s = 0; s < 8; ++s) {
    int sc, m;
    q4_k_scale_min(blk, s, &sc, &m);
    c.scale[s] = d * static_cast<float>(sc);
    c.offset[s] = dmin * static_cast<float>(m);
  }
  return c;
}

// out[r·ldc + j] = A row r · B row j for R rows of A (lda apart) and J rows of B (ldb blocks apart)
// over nb blocks. Per sub-block: Σ a (shared by the J rows) and Σ q·a lane-wise, a product then
// FMAs in order; then acc = fma(scale, Σ q·a, acc), acc = fma(−offset, Σ a, acc); then the fixed
// horizontal sum. Each (r, j) is the same chain for any R and J.
template <int R, int J>
void dot_q4k(int64_t nb, const float* A, int64_t lda, const BlockQ4_K* B, int64_t ldb, float* out, int64_t ldc) {
  Vec acc[R][J] = {};
  for (int64_t b = 0; b < nb; ++b) {
    if constexpr (J > 1)
      for (int j = 0; j < J; ++j)
        for (int line = 0; line < 3; ++line)
          __builtin_prefetch(reinterpret_cast<const char*>(B + (J + j) * ldb + b) + 64 * line);
    Coefficients co[J];
    for (int j = 0; j < J; ++j) co[j] = coefficients(B[j * ldb + b]);
    for (int p = 0; p < 4; ++p) {  // sub-blocks 2p (low nibbles) and 2p + 1 (high nibbles)
      const int64_t k0 = b * kQ4KBlock + 64 * p;
      Vec sum_lo[R], sum_hi[R];
      for (int r = 0; r < R; ++r) {
        const float* a = A + r * lda + k0;
        sum_lo[r] = load(a);
        sum_hi[r] = load(a + kQ4KSub);
        for (int v = 1; v < kSubVecs; ++v) {
          sum_lo[r] += load(a + v * kLanes);
          sum_hi[r] += load(a + kQ4KSub + v * kLanes);
        }
      }
      for (int j = 0; j < J; ++j) {
        const uint8_t* qs = B[j * ldb + b].qs + 32 * p;
        Vec lo[kSubVecs], hi[kSubVecs];
        for (int v = 0; v < kSubVecs; ++v) {
          const IVec w = load_u8(qs + v * kLanes);
          lo[v] = __builtin_convertvector(w & 15, Vec);
          hi[v] = __builtin_convertvector(w >> 4, Vec);
        }
        const Vec s_lo = splat(co[j].scale[2 * p]), s_hi = splat(co[j].scale[2 * p + 1]);
        const Vec o_lo = splat(-co[j].offset[2 * p]), o_hi = splat(-co[j].offset[2 * p + 1]);
        for (int r = 0; r < R; ++r) {
          const float* a = A + r * lda + k0;
          Vec dot_lo = load(a) * lo[0], dot_hi = load(a + kQ4KSub) * hi[0];
          for (int v = 1; v < kSubVecs; ++v) {
            dot_lo = fused(load(a + v * kLanes), lo[v], dot_lo);
            dot_hi = fused(load(a + kQ4KSub + v * kLanes), hi[v], dot_hi);
          }
          acc[r][j] = fused(s_lo, dot_lo, acc[r][j]);
          acc[r][j] = fused(o_lo, sum_lo[r], acc[r][j]);
          acc[r][j] = fused(s_hi, dot_hi, acc[r][j]);
          acc[r][j] = fused(o_hi, sum_hi[r], acc[r][j]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) out[r * ldc + j] = reduce_sum(acc[r][j]);
}

// C[M, rows] = A[M, K] · B[rows, K]ᵀ (ldb in blocks): one row of A against kGroup rows of B at a
// time, or each group's rows in turn against kRows rows of A.
void range_product(int64_t M, int64_t K, const float* A, int64_t lda, const BlockQ4_K* B, int64_t ldb, int64_t rows,
                   float* C, int64_t ldc) {
  const int64_t nb = K / kQ4KBlock;
  if (M == 1) {
    int64_t n = 0;
    for (; n + kGroup <= rows; n += kGroup) dot_q4k<1, kGroup>(nb, A, lda, B + n * ldb, ldb, C + n, ldc);
    for (; n < rows; ++n) dot_q4k<1, 1>(nb, A, lda, B + n * ldb, ldb, C + n, ldc);
    return;
  }
  for (int64_t n0 = 0; n0 < rows; n0 += kGroup)
    for (int64_t m = 0; m < M; m += kRows)
      for (int64_t n = n0; n < std::min<int64_t>(rows, n0 + kGroup); ++n) {
        const float* a = A + m * lda;
        const BlockQ4_K* b = B + n * ldb;
        float* out = C + m * ldc + n;
        switch (std::min<int64_t>(kRows, M - m)) {
          case 4: dot_q4k<4, 1>(nb, a, lda, b, ldb, out, ldc); break;
          case 3: dot_q4k<3, 1>(nb, a, lda, b, ldb, out, ldc); break;
          case 2: dot_q4k<2, 1>(nb, a, lda, b, ldb, out, ldc); break;
          default: dot_q4k<1, 1>(nb, a, lda, b, ldb, out, ldc); break;
        }
      }
}

}  // namespace

void matmul_bt_parts_q4_k(int64_t M, int64_t K, const float* A, int64_t lda, const BtPartQ4K* parts, int count) {
  parts_product(K, parts, count, [&](const BtPartQ4K& part, int64_t n0, int64_t n) {
    range_product(M, K, A, lda, part.B + n0 * part.ldb, part.ldb, n, part.C + n0, part.ldc);
  });
}

void matmul_bt_q4_k(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ4_K* B, int64_t ldb,
                    float* C, int64_t ldc) {
  const BtPartQ4K part{B, ldb, N, C, ldc};
  matmul_bt_parts_q4_k(M, K, A, lda, &part, 1);
}

}  // namespace mhsa::kernels::MHSA_ISA
