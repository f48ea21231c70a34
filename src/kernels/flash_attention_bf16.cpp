// kernels/flash_attention_bf16.cpp — the attention forward for bfloat16 q, k and v on AVX512_BF16's
// dot product (vdpbf16ps), where cpu::bf16_dot() (dispatch.h: attention_forward_bf16_dot).
//
// flash_attention.cpp's blocked forward with both matrix products on bfloat16 pairs:
//   S = Q Ktᵀ   q·k summed over pairs of D, each pair's two products exact in float32 (the inputs
//               are bfloat16), one float32 chain per score;
//   P           the same online softmax in float32 (attention_tiles.h: finish_scores, softmax_row;
//               l sums the float32 P), then P rounded to bfloat16 (nearest even);
//   O += P V    over pairs of keys, in float32, each block's sum added to O.
// The rounding of P is FlashAttention's on GPUs and PyTorch's CPU flash kernel's for bfloat16:
// out differs from the float32 kernel's on the widened inputs by up to 2^-9 of the values it
// averages, below the output's own bfloat16 rounding. lse is the float32 kernel's up to the order
// of q·k's sums. The keys are packed per (batch, kv head) as pairs of D ([D/2][kBc] words per key
// block), the values as pairs of keys ([kBc/2][Dv] words), each word two bfloat16.
//
// q holds bfloat16 values widened to float32; k and v are bfloat16 (read as they are) or widened.
// Takes the shapes the blocked float32 path takes, without dropout (the decode path's shapes read
// the cache from memory, where the dot product would not pay); returns false for the others, which
// the caller runs on the float32 kernel. Every output row is computed by one thread in an order
// fixed by the shapes: bitwise identical for any thread count.
#define MHSA_ISA avx512bf16
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/bf16.h"
#include "kernels/isa/attention_tiles.h"
#include "kernels/isa/simd.h"
#include "mhsa/tensor.h"

namespace mhsa::kernels::avx512bf16 {
namespace {

constexpr int kR = 6;           // query rows of a tile
constexpr int kC = 4;           // vectors of a tile: 64 keys (scores) or 64 of Dv (output)
constexpr int64_t kBq = 48;     // query rows per block
constexpr int64_t kBk = 256;    // keys per block (even: whole pairs)
constexpr int64_t kBk2 = kBk / 2;
using Words = std::vector<uint32_t, AlignedAllocator<uint32_t>>;

inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }
inline uint32_t pair_of(float lo, float hi) { return float_to_bf16(lo) | uint32_t{float_to_bf16(hi)} << 16; }
inline uint16_t bits_of(float x) { return float_to_bf16(x); }  // exact: the value is a bfloat16's
inline uint16_t bits_of(bfloat16 x) { return x.bits; }

struct PackedKV {
  int64_t blocks = 0, d2 = 0, dv_pad = 0;
  Words kt;  // [blocks][d2][kBk]: key j's elements 2p and 2p + 1; zero past D and Tk
  Words v;   // [blocks][kBk2][dv_pad]: the values of keys 2i and 2i + 1 of the block; zero past Tk and Dv
};

// T: the keys' and values' element type, float (bfloat16 values widened) or bfloat16. Keys past
// the batch's length (kv_lengths) are packed as zeros: no row sees them, and P·V's pairs may reach
// one key past a row's last (its P is 0, but 0 times a garbage NaN would not be).
template <class T>
void pack_block(const AttentionParams& p, int64_t b, int64_t hk, int64_t kb, PackedKV& kv) {
  const int64_t Tk = p.kv_lengths ? std::clamp<int64_t>(p.kv_lengths[b], 0, p.Tk) : p.Tk;
  const int64_t D = p.D, Dv = p.Dv, ks = p.k_stride[3], vs = p.v_stride[3];
  uint32_t* kt = kv.kt.data() + kb * kv.d2 * kBk;
  for (int64_t jj = 0; jj < kBk; ++jj) {
    const int64_t j = kb * kBk + jj;
    const T* k = j < Tk ? key_row<T>(p, b, hk, j) : nullptr;
    for (int64_t q = 0; q < kv.d2; ++q) {
      const uint32_t lo = k ? bits_of(k[2 * q * ks]) : 0, hi = k && 2 * q + 1 < D ? bits_of(k[(2 * q + 1) * ks]) : 0;
      kt[q * kBk + jj] = lo | hi << 16;
    }
  }
  if (kv.dv_pad == 0) return;
  uint32_t* vp = kv.v.data() + kb * kBk2 * kv.dv_pad;
  for (int64_t i = 0; i < kBk2; ++i) {
    const int64_t j = kb * kBk + 2 * i;
    const T* v0 = j < Tk ? value_row<T>(p, b, hk, j) : nullptr;
    const T* v1 = j + 1 < Tk ? value_row<T>(p, b, hk, j + 1) : nullptr;
    uint32_t* row = vp + i * kv.dv_pad;
    for (int64_t d = 0; d < Dv; ++d)
      row[d] = (v0 ? bits_of(v0[d * vs]) : 0u) | uint32_t{v1 ? bits_of(v1[d * vs]) : uint16_t{0}} << 16;
    std::fill(row + Dv, row + kv.dv_pad, 0u);
  }
}

// e^x with simd.h's range reduction and polynomial, but AVX-512's roundscale and scalef in place of
// its integer rounding and exponent assembly (13 instructions against 20); a few ulp, 0 below
// -87.33 (and for −∞), NaN kept. The softmax is a third of this kernel's time.
inline Vec exp_scalef(Vec x) {
  const __mmask16 under = _mm512_cmp_ps_mask(x, splat(-87.33f), _CMP_LT_OQ);
  x = min(splat(88.0f), max(splat(-87.33f), x));  // max and min return x when it is NaN
  const Vec n = _mm512_roundscale_ps(x * 1.44269504088896341f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const Vec r = fma(n, splat(2.12194440e-4f), fma(n, splat(-0.693359375f), x));  // ln2 in two parts
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~under), _mm512_scalef_ps(exp_taylor7(r), n));
}

// out[R, C·16] (ldo) = (kAdd ? out : 0) + Σ_i a[r·lda + i] · b[i·ldb + (16 c ...)] over `steps` pairs,
// each a's word broadcast against C vectors of b's words by vdpbf16ps; the sum starts from 0 and
// is added to out at the end. Scores: a the queries' pairs of D ([R][d2]), b the key block's
// ([d2][kBk]). Output: a the probabilities' pairs of keys (rows kBk2 apart), b the values' ([pairs][dv_pad]).
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
template <bool kAdd>
DotTileFn dot_tile_fn(int64_t rows, int64_t cols) {
#define MHSA_ROW(R) {dot_tile<R, 1, kAdd>, dot_tile<R, 2, kAdd>, dot_tile<R, 3, kAdd>, dot_tile<R, 4, kAdd>}
  static constexpr DotTileFn table[kR][kC] = {MHSA_ROW(1), MHSA_ROW(2), MHSA_ROW(3),
                                              MHSA_ROW(4), MHSA_ROW(5), MHSA_ROW(6)};
#undef MHSA_ROW
  return table[rows - 1][cols - 1];
}

struct Scratch {
  Words q;                          // [kBq][d2] the rows' queries as pairs
  AlignedFloats s;                  // [kBq][kBk] scores, then probabilities
  Words pw;                         // [kBq][kBk2] probabilities as bfloat16 pairs
  AlignedFloats o;                  // [kBq][dv_pad] unnormalised output
  std::vector<float> m, l;          // [kBq] running max and sum
  std::vector<int64_t> begin, end;  // [kBq] each row's visible keys
  Scratch(int64_t d2, int64_t dv_pad)
      : q(static_cast<size_t>(kBq * d2)), s(static_cast<size_t>(kBq * kBk)), pw(static_cast<size_t>(kBq * kBk2)),
        o(static_cast<size_t>(kBq * std::max<int64_t>(dv_pad, 1))), m(kBq), l(kBq), begin(kBq), end(kBq) {}
};

// Rows [i0, i0 + rows) of query head h against the packed keys of its kv head.
void query_block(const AttentionParams& p, const PackedKV& kv, int64_t b, int64_t h, int64_t i0, int64_t rows,
                 Scratch& w) {
  const int64_t d2 = kv.d2, dv_pad = kv.dv_pad;
  const float* q = p.q + b * p.q_stride[0] + h * p.q_stride[1];
  for (int64_t r = 0; r < rows; ++r) {
    const float* qr = q + (i0 + r) * p.q_stride[2];
    const auto at = [&](int64_t d) { return d < p.D ? qr[d * p.q_stride[3]] : 0.0f; };
    for (int64_t i = 0; i < d2; ++i) w.q[r * d2 + i] = pair_of(at(2 * i), at(2 * i + 1));
  }
  int64_t min_begin, max_end;
  start_rows(p, b, i0, rows, w.begin.data(), w.end.data(), w.m.data(), w.l.data(), min_begin, max_end);
  std::fill(w.o.begin(), w.o.begin() + rows * dv_pad, 0.0f);
  const int64_t first = min_begin / kBk, blocks = (max_end + kBk - 1) / kBk;
  for (int64_t kb = first; kb < blocks; ++kb) {
    const int64_t j0 = kb * kBk;
    // Keys [c_begin, c_end) (32 at a time: one bfloat16 conversion) are those some row sees: the
    // others are neither scored nor put through the softmax (P·V reads only pairs inside).
    const int64_t c_begin = std::clamp<int64_t>(min_begin - j0, 0, kBk) / 32 * 32;
    const int64_t c_end = (std::clamp<int64_t>(max_end - j0, 0, kBk) + 31) / 32 * 32, n = c_end - c_begin;
    const uint32_t* kt = kv.kt.data() + kb * d2 * kBk;
    for (int64_t r = 0; r < rows; r += kR) {
      const int64_t R = std::min<int64_t>(kR, rows - r);
      for (int64_t c = c_begin; c < c_end; c += kC * 16)
        dot_tile_fn<false>(R, std::min<int64_t>(kC, (c_end - c) / 16))(w.q.data() + r * d2, d2, kt + c, kBk, d2,
                                                                      w.s.data() + r * kBk + c, kBk);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t j1 = j0 + c_begin;  // the first key of the row's scores
      const int64_t lo = std::clamp<int64_t>(w.begin[r] - j1, 0, n), hi = std::clamp<int64_t>(w.end[r] - j1, lo, n);
      const float* mrow = p.mask ? p.mask + b * p.mask_stride[0] + h * p.mask_stride[1] +
                                       (i0 + r) * p.mask_stride[2] + j1 * p.mask_stride[3]
                                 : nullptr;
      float* s = w.s.data() + r * kBk + c_begin;
      const float scale = finish_scores(s, n, lo, hi, p.scale, p.softcap, mrow, p.mask_stride[3], nullptr);
      softmax_row(s, n, scale, w.m[r], w.l[r], w.o.data() + r * dv_pad, dv_pad, exp_scalef);
      uint32_t* pw = w.pw.data() + r * kBk2 + c_begin / 2;
      for (int64_t jj = 0; jj < n; jj += 32) {
        const __m512bh two = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + jj + 16), _mm512_loadu_ps(s + jj));
        _mm512_storeu_si512(pw + jj / 2, reinterpret_cast<const __m512i&>(two));
      }
    }
    if (dv_pad == 0) continue;
    // P is 0 outside every row's keys: P·V runs over the pairs some row sees.
    const int64_t skip = std::clamp<int64_t>(min_begin - j0, 0, kBk) / 2;
    const int64_t pairs = (std::min(kBk, max_end - j0) + 1) / 2 - skip;
    const uint32_t* vb = kv.v.data() + (kb * kBk2 + skip) * dv_pad;
    for (int64_t r = 0; r < rows; r += kR)
      for (int64_t c = 0; c < dv_pad; c += kC * 16)
        dot_tile_fn<true>(std::min<int64_t>(kR, rows - r), std::min<int64_t>(kC, (dv_pad - c) / 16))(
            w.pw.data() + r * kBk2 + skip, kBk2, vb + c, dv_pad, pairs, w.o.data() + r * dv_pad + c, dv_pad);
  }
  write_rows(p, b, h, i0, rows, w.m.data(), w.l.data(), w.o.data(), dv_pad);
}

}  // namespace

bool attention_forward_bf16_dot(const AttentionParams& p) {
  if (p.kv_element == KVElement::f16 || p.k_pages || p.dropout > 0.0f || takes_decode_path(p)) return false;
  const int64_t group = p.Hq / p.Hkv, q_blocks = (p.Tq + kBq - 1) / kBq;
  PackedKV kv;  // shared by all threads: packed once per (batch, kv head)
  kv.blocks = (p.Tk + kBk - 1) / kBk;
  kv.d2 = (p.D + 1) / 2;
  kv.dv_pad = p.out ? round_up(p.Dv, 16) : 0;
  kv.kt.resize(static_cast<size_t>(kv.blocks * kv.d2 * kBk));
  kv.v.resize(static_cast<size_t>(kv.blocks * kBk2 * kv.dv_pad));
  const int64_t tasks = group * q_blocks;
#pragma omp parallel
  {
    Scratch w(kv.d2, kv.dv_pad);
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t hk = 0; hk < p.Hkv; ++hk) {
#pragma omp for schedule(static)
        for (int64_t kb = 0; kb < kv.blocks; ++kb) {
          if (p.kv_element == KVElement::bf16)
            pack_block<bfloat16>(p, b, hk, kb, kv);
          else
            pack_block<float>(p, b, hk, kb, kv);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < tasks; ++t) {  // the most expensive (causal: the last) blocks first
          const int64_t i0 = (q_blocks - 1 - t / group) * kBq;
          query_block(p, kv, b, hk * group + t % group, i0, std::min(kBq, p.Tq - i0), w);
        }
      }
  }
  return true;
}

}  // namespace mhsa::kernels::avx512bf16
