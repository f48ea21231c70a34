// kernels/flash_backward_bf16.cpp — the attention backward for bfloat16 q, k, v, out and dout on
// AVX512_BF16's dot product (vdpbf16ps), where cpu::bf16_dot() (dispatch.h: attention_backward_bf16_dot).
//
// flash_backward.cpp's FlashAttention-2 backward with its five matrix products on bfloat16 pairs,
// each one float32 chain per element (bf16_dot_tiles.h), added onto a float32 accumulator:
//   S   = Q Kᵀ      over pairs of D   (the forward's own products: S is the bfloat16 forward's, bit for bit)
//   dP  = dO Vᵀ     over pairs of Dv
//   P   = exp(S·scale − lse), dS = scale · P ∘ (dP − D) (∘ cap') in float32, as flash_backward.cpp;
//         P = exp(S·scale − m)/l for a row whose |lse| is too large for its float rounding
//         (lse_too_coarse), with its max m and sum l recomputed by a first pass (exact_rows)
//         then P and dS rounded to bfloat16 (nearest even), as PyTorch's CPU flash kernel and
//         FlashAttention round them for bfloat16
//   dVᵀ += dOᵀ P    over pairs of query rows: dV transposed, so that P and dS are read as rows
//   dKᵀ += Qᵀ dS    over pairs of query rows
//   dQ  += dS K     over pairs of keys
// D = rowsum(dO ∘ O) is taken in double, and again in the dP tiles' own order (one vdpbf16ps chain)
// for rows whose P is exactly 1 (one visible key: there O = v, D = dP and dS = 0 exactly).
//
// One (batch, kv head) is one task, run by one thread start to end (as flash_backward.cpp): no two
// threads add into one gradient, and every result is bitwise identical for any thread count. The
// task packs its operands once, in the layouts the products read (words of two bfloat16):
//   q [rows][D/2], qt [D][rows/2], dout [rows][Dv/2], doutt [Dv][rows/2]   (rows: the group's Hq/Hkv·Tq)
//   kt [blocks][D/2][kBc], vt [blocks][Dv/2][kBc], kp [blocks][kBc/2][D]   (keys past Tk zero)
// O(T·D) memory per task, no T×T. Key blocks that no row of a query block sees are skipped.
// With dropout (factors Z regenerated from the seed, as flash_backward.cpp): dVᵀ += dOᵀ (P∘Z) and
// dS = scale · P ∘ (dP∘Z − D). Takes the shapes the bfloat16 forward takes on its dot product (not
// the decode path's) and returns false for the others, which the caller runs on the float32 backward.
#define MHSA_ISA avx512bf16
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/attention_sinks.h"
#include "kernels/isa/attention_tiles.h"
#include "kernels/isa/bf16_dot_tiles.h"
#include "kernels/isa/simd.h"

namespace mhsa::kernels::avx512bf16 {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kBr = 64;  // query rows per block (even: whole pairs)
constexpr int64_t kBc = 64;  // keys per block (a multiple of 32: whole bfloat16 conversions)
constexpr int64_t kBc2 = kBc / 2;

struct Task {
  int64_t rows, rows2, d2, dv2, d_pad, dv_pad, blocks;
  Words q, qt, dout, doutt, kt, vt, kp;
  std::vector<float> lse, di, di_dot;
  std::vector<float> m, inv_l;  // [rows] P = exp(s − m)·inv_l: lse and 1, or exact_rows'
  std::vector<int64_t> begin, end;
  AlignedFloats s, dp, dcap;  // [kBr][kBc]: S then P; dP then dS; soft-capping's 1 − tanh² (or empty)
  AlignedFloats z;            // [kBc] one row's dropout factors (or empty)
  Words p_rows, ds_rows;      // [kBr/2][kBc]: P and dS as pairs of rows
  Words ds_keys;              // [kBr][kBc2]: dS as pairs of keys
  AlignedFloats dq;           // [rows][d_pad]
  AlignedFloats dkt, dvt;     // [D][kBc], [Dv][kBc]
  std::vector<float> out_row;
  explicit Task(const AttentionParams& p)
      : rows(p.Hq / p.Hkv * p.Tq), rows2((rows + 1) / 2), d2((p.D + 1) / 2), dv2((p.Dv + 1) / 2),
        d_pad(round_up(p.D, 16)), dv_pad(round_up(p.Dv, 16)), blocks((p.Tk + kBc - 1) / kBc),
        q(static_cast<size_t>(rows * d2)), qt(static_cast<size_t>(p.D * rows2)), dout(static_cast<size_t>(rows * dv2)),
        doutt(static_cast<size_t>(p.Dv * rows2)), kt(static_cast<size_t>(blocks * d2 * kBc)),
        vt(static_cast<size_t>(blocks * dv2 * kBc)), kp(static_cast<size_t>(blocks * kBc2 * d_pad)),
        lse(static_cast<size_t>(rows)), di(static_cast<size_t>(rows)), di_dot(static_cast<size_t>(rows)),
        m(static_cast<size_t>(rows)), inv_l(static_cast<size_t>(rows)),
        begin(static_cast<size_t>(rows)), end(static_cast<size_t>(rows)), s(kBr * kBc), dp(kBr * kBc),
        dcap(p.softcap > 0.0f ? kBr * kBc : 0), z(p.dropout > 0.0f ? kBc : 0), p_rows(kBr / 2 * kBc),
        ds_rows(kBr / 2 * kBc), ds_keys(kBr * kBc2),
        dq(static_cast<size_t>(rows * d_pad)), dkt(static_cast<size_t>(p.D * kBc)),
        dvt(static_cast<size_t>(p.Dv * kBc)), out_row(static_cast<size_t>(dv2 * 2)) {}
};

// One lane of vdpbf16ps's chain over n words: the order and rounding of one element of dot_tile.
float chain_dot(const uint32_t* a, const uint32_t* b, int64_t n) {
  __m128 acc = _mm_setzero_ps();
  for (int64_t i = 0; i < n; ++i) {
    const __m128i x = _mm_cvtsi32_si128(static_cast<int>(a[i])), y = _mm_cvtsi32_si128(static_cast<int>(b[i]));
    acc = _mm_dpbf16_ps(acc, reinterpret_cast<const __m128bh&>(x), reinterpret_cast<const __m128bh&>(y));
  }
  return _mm_cvtss_f32(acc);
}

void pack(const AttentionParams& p, int64_t b, int64_t hk, Task& t) {
  const int64_t group = p.Hq / p.Hkv;
  std::vector<uint32_t> o_pairs(static_cast<size_t>(t.dv2));
  std::vector<float> qrow(static_cast<size_t>(t.d2 * 2)), grow(static_cast<size_t>(t.dv2 * 2));
  for (int64_t r = 0; r < t.rows; ++r) {
    const int64_t h = hk * group + r / p.Tq, i = r % p.Tq;
    const float* q = p.q + b * p.q_stride[0] + h * p.q_stride[1] + i * p.q_stride[2];
    const float* o = p.out + b * p.out_stride[0] + h * p.out_stride[1] + i * p.out_stride[2];
    const float* g = p.dout + b * p.dout_stride[0] + h * p.dout_stride[1] + i * p.dout_stride[2];
    for (int64_t d = 0; d < t.d2 * 2; ++d) qrow[d] = d < p.D ? q[d * p.q_stride[3]] : 0.0f;
    for (int64_t d = 0; d < t.dv2 * 2; ++d) {
      grow[d] = d < p.Dv ? g[d * p.dout_stride[3]] : 0.0f;
      t.out_row[d] = d < p.Dv ? o[d * p.out_stride[3]] : 0.0f;
    }
    for (int64_t e = 0; e < t.d2; ++e) t.q[r * t.d2 + e] = pair_of(qrow[2 * e], qrow[2 * e + 1]);
    for (int64_t e = 0; e < t.dv2; ++e) {
      t.dout[r * t.dv2 + e] = pair_of(grow[2 * e], grow[2 * e + 1]);
      o_pairs[e] = pair_of(t.out_row[2 * e], t.out_row[2 * e + 1]);
    }
    // The transposed pairs: row r is the low half of word r/2 when even, the high half when odd.
    const int shift = r % 2 == 0 ? 0 : 16;
    for (int64_t d = 0; d < p.D; ++d) {
      uint32_t& w = t.qt[d * t.rows2 + r / 2];
      w = (shift == 0 ? 0u : w) | uint32_t{float_to_bf16(qrow[d])} << shift;
    }
    for (int64_t d = 0; d < p.Dv; ++d) {
      uint32_t& w = t.doutt[d * t.rows2 + r / 2];
      w = (shift == 0 ? 0u : w) | uint32_t{float_to_bf16(grow[d])} << shift;
    }
    t.lse[r] = p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]];
    const KeyRange keys = t.lse[r] == kNegInf ? KeyRange{} : key_range(p, b, i);  // a fully masked row has no gradient
    double sum = 0.0;
    for (int64_t d = 0; d < p.Dv; ++d) sum += double(grow[d]) * double(t.out_row[d]);
    t.di[r] = static_cast<float>(sum);
    t.di_dot[r] = chain_dot(t.dout.data() + r * t.dv2, o_pairs.data(), t.dv2);
    t.begin[r] = keys.begin;
    t.end[r] = keys.end;
    t.m[r] = t.lse[r];
    t.inv_l[r] = 1.0f;
  }
  std::fill(t.dq.begin(), t.dq.end(), 0.0f);
  std::fill(t.kt.begin(), t.kt.end(), 0u);
  std::fill(t.vt.begin(), t.vt.end(), 0u);
  std::fill(t.kp.begin(), t.kp.end(), 0u);
  const int64_t Tk = std::min(p.Tk, p.kv_lengths ? std::max<int64_t>(p.kv_lengths[b], 0) : p.Tk);
  for (int64_t j = 0; j < Tk; ++j) {  // keys no row sees stay zero (a NaN there times P = 0 would not be)
    const int64_t kb = j / kBc, jj = j % kBc;
    const float* k = key_row(p, b, hk, j);
    const float* v = value_row(p, b, hk, j);
    const int shift = jj % 2 == 0 ? 0 : 16;
    for (int64_t d = 0; d < p.D; ++d) {
      const uint32_t x = float_to_bf16(k[d * p.k_stride[3]]);
      t.kt[(kb * t.d2 + d / 2) * kBc + jj] |= x << (d % 2 == 0 ? 0 : 16);
      t.kp[(kb * kBc2 + jj / 2) * t.d_pad + d] |= x << shift;
    }
    for (int64_t d = 0; d < p.Dv; ++d)
      t.vt[(kb * t.dv2 + d / 2) * kBc + jj] |= uint32_t{float_to_bf16(v[d * p.v_stride[3]])} << (d % 2 == 0 ? 0 : 16);
  }
}

// Rows 2i and 2i + 1 of x ([kBr][kBc] floats) as words of two bfloat16, key by key: w[i][j].
void pair_rows(const float* x, int64_t n2, uint32_t* w) {
  // After vcvtne2ps2bf16: row 2i's 16 values, then row 2i + 1's; interleave them.
  alignas(64) static constexpr uint16_t kIdx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(kIdx);
  for (int64_t i = 0; i < n2; ++i)
    for (int64_t j = 0; j < kBc; j += 16) {
      const float* even = x + 2 * i * kBc + j;
      const __m512bh two = _mm512_cvtne2ps_pbh(_mm512_load_ps(even + kBc), _mm512_load_ps(even));
      _mm512_store_si512(w + i * kBc + j, _mm512_permutexvar_epi16(idx, reinterpret_cast<const __m512i&>(two)));
    }
}

// The rows whose float lse is too coarse for exp(s − lse) (lse_too_coarse: |lse| ≥ 16): their max
// m and 1/l recomputed from their scores (the main pass's S, finished and scaled as it does), the
// online softmax's running max with l summed in double across blocks. Only the query blocks that
// hold such a row compute S an extra time; every other row keeps m = lse, 1/l = 1, whose P is
// exp(s − lse)·1, today's bits.
void exact_rows(const AttentionParams& p, int64_t b, int64_t hk, Task& t) {
  const int64_t group = p.Hq / p.Hkv;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int64_t r0 = 0; r0 < t.rows; r0 += kBr) {
    const int64_t n = std::min(kBr, t.rows - r0);
    bool coarse[kBr] = {}, any = false;
    float m[kBr];
    double l[kBr];
    for (int64_t r = 0; r < n; ++r) {
      coarse[r] = t.begin[r0 + r] < t.end[r0 + r] && lse_too_coarse(t.lse[r0 + r]);
      any |= coarse[r];
      m[r] = -kInf;
      l[r] = 0.0;
    }
    if (!any) continue;
    for (int64_t kb = 0; kb < t.blocks; ++kb) {
      const int64_t j0 = kb * kBc;
      if (!rows_see_keys(t.begin.data() + r0, t.end.data() + r0, n, j0, j0 + kBc)) continue;
      dot_product<false>(n, kBc, t.q.data() + r0 * t.d2, t.d2, t.kt.data() + kb * t.d2 * kBc, kBc, t.d2, t.s.data(),
                         kBc);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t row = r0 + r, h = hk * group + row / p.Tq, i = row % p.Tq;
        const int64_t lo = std::clamp<int64_t>(t.begin[row] - j0, 0, kBc);
        const int64_t hi = std::clamp<int64_t>(t.end[row] - j0, lo, kBc);
        if (!coarse[r] || hi == lo) continue;
        float* s = t.s.data() + r * kBc;
        const float* mrow = p.mask ? p.mask + b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2] +
                                         j0 * p.mask_stride[3]
                                   : nullptr;
        const Vec pending = splat(finish_scores(s, kBc, lo, hi, p.scale, p.softcap, mrow, p.mask_stride[3], nullptr));
        for (int64_t jj = 0; jj < kBc; jj += 16)
          store(s + jj, _mm512_maskz_mul_round_ps(0xFFFF, load(s + jj), pending,
                                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        Vec vmax = splat(-kInf);
        for (int64_t jj = 0; jj < kBc; jj += 16) vmax = max(vmax, load(s + jj));
        const float block_max = reduce_max(vmax);
        if (block_max == -kInf) continue;  // every key of the block masked
        if (block_max > m[r]) {
          l[r] = m[r] == -kInf ? 0.0 : l[r] * std::exp(double(m[r]) - double(block_max));
          m[r] = block_max;
        }
        const Vec mv = splat(m[r]);
        Vec sum = splat(0.0f);
        for (int64_t jj = 0; jj < kBc; jj += 16) sum += exp_scalef(load(s + jj) - mv);
        l[r] += reduce_sum(sum);
      }
    }
    for (int64_t r = 0; r < n; ++r) {
      if (coarse[r] && p.sinks) fold_sink(p.sinks[hk * group + (r0 + r) / p.Tq], m[r], l[r]);
      if (coarse[r] && m[r] > -kInf) {
        t.m[r0 + r] = m[r];
        t.inv_l[r0 + r] = static_cast<float>(1.0 / l[r]);
      }
    }
  }
}

void run_task(const AttentionParams& p, int64_t b, int64_t hk, Task& t) {
  pack(p, b, hk, t);
  exact_rows(p, b, hk, t);
  const int64_t group = p.Hq / p.Hkv;
  for (int64_t kb = 0; kb < t.blocks; ++kb) {
    const int64_t j0 = kb * kBc;
    std::fill(t.dkt.begin(), t.dkt.end(), 0.0f);
    std::fill(t.dvt.begin(), t.dvt.end(), 0.0f);
    const uint32_t* kt = t.kt.data() + kb * t.d2 * kBc;
    const uint32_t* vt = t.vt.data() + kb * t.dv2 * kBc;
    const uint32_t* kp = t.kp.data() + kb * kBc2 * t.d_pad;
    for (int64_t r0 = 0; r0 < t.rows; r0 += kBr) {
      const int64_t n = std::min(kBr, t.rows - r0), n2 = (n + 1) / 2;
      if (!rows_see_keys(t.begin.data() + r0, t.end.data() + r0, n, j0, j0 + kBc)) continue;
      dot_product<false>(n, kBc, t.q.data() + r0 * t.d2, t.d2, kt, kBc, t.d2, t.s.data(), kBc);
      dot_product<false>(n, kBc, t.dout.data() + r0 * t.dv2, t.dv2, vt, kBc, t.dv2, t.dp.data(), kBc);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t row = r0 + r, h = hk * group + row / p.Tq, i = row % p.Tq;
        const int64_t lo = std::clamp<int64_t>(t.begin[row] - j0, 0, kBc);
        const int64_t hi = std::clamp<int64_t>(t.end[row] - j0, lo, kBc);
        float* s = t.s.data() + r * kBc;
        float* dp = t.dp.data() + r * kBc;
        if (hi == lo) {  // no key of this block: P = dS = 0
          std::fill(s, s + kBc, 0.0f);
          std::fill(dp, dp + kBc, 0.0f);
          continue;
        }
        float* dcap = p.softcap > 0.0f ? t.dcap.data() + r * kBc : nullptr;
        const float* mrow = p.mask ? p.mask + b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2] +
                                         j0 * p.mask_stride[3]
                                   : nullptr;
        // The scores as the forward rounded them (its lse came from these): the scale's product by
        // an explicitly rounded multiply, which the compiler cannot fuse with the subtraction of
        // lse (P = 1 exactly where a row sees one key).
        const Vec pending = splat(finish_scores(s, kBc, lo, hi, p.scale, p.softcap, mrow, p.mask_stride[3], dcap));
        // P = exp(s − m)·(1/l): m = lse and 1/l = 1 (exactly exp(s − lse)) unless exact_rows set them.
        const Vec m = splat(t.m[row]), inv_l = splat(t.inv_l[row]);
        const Vec di = splat(t.di[row]), di_dot = splat(t.di_dot[row]);
        const Vec one = splat(1.0f), ds_scale = splat(p.scale);
        const float* z = nullptr;
        if (p.dropout > 0.0f) {
          dropout_scales(p, b, h, i, j0, kBc, t.z.data());
          z = t.z.data();
        }
        for (int64_t jj = 0; jj < kBc; jj += 16) {  // P (dropped) into s, dS into dp
          const Vec scaled = _mm512_maskz_mul_round_ps(0xFFFF, load(s + jj), pending, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          Vec prob = exp_scalef(scaled - m) * inv_l, dpz = load(dp + jj);
          if (z) dpz *= load(z + jj);
          Vec ds = prob * (dpz - (prob == one ? di_dot : di));
          if (dcap) ds *= load(dcap + jj);
          if (z) prob *= load(z + jj);
          store(s + jj, prob);
          store(dp + jj, ds * ds_scale);
        }
      }
      if (n % 2 != 0) {  // the last pair's second row: zero
        std::fill(t.s.data() + n * kBc, t.s.data() + (n + 1) * kBc, 0.0f);
        std::fill(t.dp.data() + n * kBc, t.dp.data() + (n + 1) * kBc, 0.0f);
      }
      pair_rows(t.s.data(), n2, t.p_rows.data());
      pair_rows(t.dp.data(), n2, t.ds_rows.data());
      for (int64_t r = 0; r < n; ++r)  // dS as pairs of keys
        for (int64_t jj = 0; jj < kBc; jj += 32) {
          const float* ds = t.dp.data() + r * kBc + jj;
          const __m512bh two = _mm512_cvtne2ps_pbh(_mm512_load_ps(ds + 16), _mm512_load_ps(ds));
          _mm512_store_si512(t.ds_keys.data() + r * kBc2 + jj / 2, reinterpret_cast<const __m512i&>(two));
        }
      dot_product<true>(p.Dv, kBc, t.doutt.data() + r0 / 2, t.rows2, t.p_rows.data(), kBc, n2, t.dvt.data(), kBc);
      dot_product<true>(p.D, kBc, t.qt.data() + r0 / 2, t.rows2, t.ds_rows.data(), kBc, n2, t.dkt.data(), kBc);
      dot_product<true>(n, t.d_pad, t.ds_keys.data(), kBc2, kp, t.d_pad, kBc2, t.dq.data() + r0 * t.d_pad, t.d_pad);
    }
    for (int64_t jj = 0; jj < kBc && j0 + jj < p.Tk; ++jj) {
      const int64_t j = j0 + jj;
      float* dk = p.dk + b * p.dk_stride[0] + hk * p.dk_stride[1] + j * p.dk_stride[2];
      float* dv = p.dv + b * p.dv_stride[0] + hk * p.dv_stride[1] + j * p.dv_stride[2];
      for (int64_t d = 0; d < p.D; ++d) dk[d * p.dk_stride[3]] = t.dkt[d * kBc + jj];
      for (int64_t d = 0; d < p.Dv; ++d) dv[d * p.dv_stride[3]] = t.dvt[d * kBc + jj];
    }
  }
  write_dq(p, b, hk, t.dq.data(), t.d_pad);
}

}  // namespace

bool attention_backward_bf16_dot(const AttentionParams& p) {
  if (!p.bf16_values || p.k_element != KVElement::f32 || p.v_element != KVElement::f32 || p.k_pages || takes_decode_path(p))
    return false;
  for_each_kv_head<Task>(p, run_task);
  return true;
}

}  // namespace mhsa::kernels::avx512bf16
