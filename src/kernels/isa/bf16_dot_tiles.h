// kernels/isa/bf16_dot_tiles.h — the AVX512_BF16 tiles shared by the bfloat16 attention forward
// (flash_attention_bf16.cpp) and backward (flash_backward_bf16.cpp): a register-blocked product of
// bfloat16 pairs on vdpbf16ps, and an exp for AVX-512. Include it, after defining MHSA_ISA as
// avx512bf16, in sources compiled with -mavx512bf16 only.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/isa/simd.h"
#include "mhsa/tensor.h"

namespace mhsa::kernels::avx512bf16 {

constexpr int kDotRows = 6;  // rows of a tile
constexpr int kDotCols = 4;  // vectors of 16 float32 of a tile: 6 × 4 accumulators, 4 loads, 1 broadcast

// 32-bit words of two bfloat16 each, 64-byte aligned (the tiles' b operands).
using Words = std::vector<uint32_t, AlignedAllocator<uint32_t>>;

inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }
// Two floats as one word of two bfloat16 (lo in the low half), each rounded to nearest even (exact
// for bfloat16 values).
inline uint32_t pair_of(float lo, float hi) { return float_to_bf16(lo) | uint32_t{float_to_bf16(hi)} << 16; }

// e^x with simd.h's range reduction and polynomial, but AVX-512's roundscale and scalef in place of
// its integer rounding and exponent assembly (13 instructions against 20); a few ulp, 0 below
// -87.33 (and for −∞), NaN kept.
inline Vec exp_scalef(Vec x) {
  const __mmask16 under = _mm512_cmp_ps_mask(x, splat(-87.33f), _CMP_LT_OQ);
  x = min(splat(88.0f), max(splat(-87.33f), x));  // max and min return x when it is NaN
  // (the zero-masked forms: GCC 12's plain ones start from _mm512_undefined_ps and warn when inlined)
  const Vec n = _mm512_maskz_roundscale_ps(0xFFFF, x * 1.44269504088896341f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const Vec r = fma(n, splat(2.12194440e-4f), fma(n, splat(-0.693359375f), x));  // ln2 in two parts
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~under), exp_taylor7(r), n);
}

// out[R, C·16] (ldo) = (kAdd ? out : 0) + Σ_i a[r·lda + i] · b[i·ldb + (16 c ...)] over `steps`
// words, each a's word (a pair of bfloat16) broadcast against C vectors of b's words by vdpbf16ps;
// the sum starts from 0 and is added to out at the end (blocked summation). b 64-byte aligned.
// Every element is one float32 chain over the pairs in ascending order, whatever R and C.
template <int R, int C, bool kAdd>
void dot_tile(const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb, int64_t steps, float* out, int64_t ldo) {
  __m512 acc[R][C];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < steps; ++i) {
    __m512bh bv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) bv[c] = as_bh(_mm512_load_si512(b + i * ldb + c * 16));
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m512bh av = as_bh(_mm512_set1_epi32(static_cast<int>(a[r * lda + i])));
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], av, bv[c]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      float* o = out + r * ldo + c * 16;
      _mm512_storeu_ps(o, kAdd ? _mm512_add_ps(acc[r][c], _mm512_loadu_ps(o)) : acc[r][c]);
    }
}

using DotTileFn = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, int64_t, float*, int64_t);
// The tile of `rows` (1..kDotRows) × `cols` (1..kDotCols) vectors.
template <bool kAdd>
DotTileFn dot_tile_fn(int64_t rows, int64_t cols) {
#define MHSA_ROW(R) {dot_tile<R, 1, kAdd>, dot_tile<R, 2, kAdd>, dot_tile<R, 3, kAdd>, dot_tile<R, 4, kAdd>}
  static constexpr DotTileFn table[kDotRows][kDotCols] = {MHSA_ROW(1), MHSA_ROW(2), MHSA_ROW(3),
                                                          MHSA_ROW(4), MHSA_ROW(5), MHSA_ROW(6)};
#undef MHSA_ROW
  return table[rows - 1][cols - 1];
}

// out[rows, cols] (ldo, cols a multiple of 16) (+)= a[rows, steps words] (lda) · b[steps, cols] (ldb)
// in tiles.
template <bool kAdd>
void dot_product(int64_t rows, int64_t cols, const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb,
                 int64_t steps, float* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; r += kDotRows)
    for (int64_t c = 0; c < cols; c += kDotCols * 16)
      dot_tile_fn<kAdd>(std::min<int64_t>(kDotRows, rows - r), std::min<int64_t>(kDotCols, (cols - c) / 16))(
          a + r * lda, lda, b + c, ldb, steps, out + r * ldo + c, ldo);
}

}  // namespace mhsa::kernels::avx512bf16
