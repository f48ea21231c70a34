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
// Dropout as the float32 kernel's: after the row sum, P times the row's factors (dropout_scales),
// then rounded. Takes the shapes the blocked float32 path takes (the decode path's shapes read the
// cache from memory, where the dot product would not pay); returns false for the others, which the
// caller runs on the float32 kernel. Every output row is computed by one thread in an order
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
#include "kernels/isa/bf16_dot_tiles.h"
#include "kernels/isa/simd.h"
#include "mhsa/tensor.h"

namespace mhsa::kernels::avx512bf16 {
namespace {

constexpr int64_t kBq = 48;     // query rows per block
constexpr int64_t kBk = 256;    // keys per block (even: whole pairs)
constexpr int64_t kBk2 = kBk / 2;

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

struct Scratch {
  Words q;                          // [kBq][d2] the rows' queries as pairs
  AlignedFloats s;                  // [kBq][kBk] scores, then probabilities
  Words pw;                         // [kBq][kBk2] probabilities as bfloat16 pairs
  AlignedFloats o;                  // [kBq][dv_pad] unnormalised output
  std::vector<float> m, l;          // [kBq] running max and sum
  std::vector<int64_t> begin, end;  // [kBq] each row's visible keys
  AlignedFloats z;                  // [kBk] one row's dropout factors
  Scratch(int64_t d2, int64_t dv_pad)
      : q(static_cast<size_t>(kBq * d2)), s(static_cast<size_t>(kBq * kBk)), pw(static_cast<size_t>(kBq * kBk2)),
        o(static_cast<size_t>(kBq * std::max<int64_t>(dv_pad, 1))), m(kBq), l(kBq), begin(kBq), end(kBq), z(kBk) {}
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
    dot_product<false>(rows, n, w.q.data(), d2, kt + c_begin, kBk, d2, w.s.data() + c_begin, kBk);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t j1 = j0 + c_begin;  // the first key of the row's scores
      const int64_t lo = std::clamp<int64_t>(w.begin[r] - j1, 0, n), hi = std::clamp<int64_t>(w.end[r] - j1, lo, n);
      const float* mrow = p.mask ? p.mask + b * p.mask_stride[0] + h * p.mask_stride[1] +
                                       (i0 + r) * p.mask_stride[2] + j1 * p.mask_stride[3]
                                 : nullptr;
      float* s = w.s.data() + r * kBk + c_begin;
      const float scale = finish_scores(s, n, lo, hi, p.scale, p.softcap, mrow, p.mask_stride[3], nullptr);
      softmax_row(s, n, scale, w.m[r], w.l[r], w.o.data() + r * dv_pad, dv_pad, exp_scalef);
      if (p.dropout > 0.0f) {  // after the row sum: dropout changes what P·V adds, not l
        dropout_scales(p, b, h, i0 + r, j1, n, w.z.data());
        for (int64_t jj = 0; jj < n; jj += 16) store(s + jj, load(s + jj) * load(w.z.data() + jj));
      }
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
    dot_product<true>(rows, dv_pad, w.pw.data() + skip, kBk2, vb, dv_pad, pairs, w.o.data(), dv_pad);
  }
  write_rows(p, b, h, i0, rows, w.m.data(), w.l.data(), w.o.data(), dv_pad);
}

}  // namespace

bool attention_forward_bf16_dot(const AttentionParams& p) {
  if (p.k_element != p.v_element || (p.k_element != KVElement::f32 && p.k_element != KVElement::bf16) || p.k_pages ||
      takes_decode_path(p))
    return false;
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
          if (p.k_element == KVElement::bf16)
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
