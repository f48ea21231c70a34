// kernels/isa/attention_tiles.h — the register-blocked microkernels shared by one ISA's attention
// forward (flash_attention.cpp) and backward (flash_backward.cpp). Include it, after defining
// MHSA_ISA, in those per-ISA sources only. Not a GEMM: fixed-size tiles over packed operands.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/attention_params.h"
#include "kernels/isa/simd.h"
#include "mhsa/tensor.h"

namespace mhsa::kernels::MHSA_ISA {

// Register blocking of both microkernels: kRows query rows × kCols vectors of keys (or of Dv).
// AVX-512 has 32 vector registers: 6 × 4 accumulators + 4 loads + 1 broadcast. AVX2 and the
// portable path have 16: 4 × 2 accumulators.
constexpr int kRows = kLanes == 16 ? 6 : 4;
constexpr int kCols = kLanes == 16 ? 4 : 2;
constexpr int64_t kChainD = 64;  // q·k sums restart every kChainD terms (accuracy)

using AlignedFloats = std::vector<float, AlignedAllocator<float>>;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// S[r, c·kLanes + ...] for R rows × C vectors of keys: S = Q[R, D] · Kt[D, C·kLanes]. The sum
// over D restarts every kChainD terms and is added on (blocked summation): long heads (D = 256)
// then round like PyTorch's, at the price of one pass over the tile per extra block.
template <int R, int C>
void scores_tile(const float* q, int64_t ldq, const float* kt, int64_t ldk, int64_t D, float* s, int64_t lds) {
  for (int64_t d0 = 0; d0 < D; d0 += kChainD) {
    Vec acc[R][C];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = Vec{};
    const int64_t d_end = std::min(D, d0 + kChainD);
    for (int64_t d = d0; d < d_end; ++d) {
      Vec kv[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) kv[c] = load(kt + d * ldk + c * kLanes);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const Vec qv = splat(q[r * ldq + d]);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) acc[r][c] = fma(qv, kv[c], acc[r][c]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c)
        store(s + r * lds + c * kLanes, d0 == 0 ? acc[r][c] : acc[r][c] + load(s + r * lds + c * kLanes));
  }
}

// O[R, C·kLanes] += P[R, J] · V[J, C·kLanes]. The J-term sums start from 0 and are added to O
// at the end (blocked summation: each call is a chain of its own, so outputs and gradients summed
// over thousands of keys or rows round like PyTorch's instead of one running sum's error).
template <int R, int C>
void accumulate_tile(const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t J, float* o, int64_t ldo) {
  Vec acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = Vec{};
  for (int64_t j = 0; j < J; ++j) {
    Vec vv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) vv[c] = load(v + j * ldv + c * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Vec pv = splat(p[r * ldp + j]);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = fma(pv, vv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) store(o + r * ldo + c * kLanes, acc[r][c] + load(o + r * ldo + c * kLanes));
}

// The sum of a[d]·b[d] over d < n in exactly the order and rounding of one element of
// scores_tile (one fused chain per kChainD terms, each chain added onto the ones before), so that a
// dot product taken apart from the tiles, like the backward's rowsum(dO ∘ O), matches an element
// the tiles compute bit for bit (the backward's dS = P (dP − rowsum) is then exactly 0 for a row
// with one visible key). The tiles' a·b + c is fused where the ISA has an FMA; here it is said
// explicitly (fused), since GCC left the scalar a * b + acc unfused (measured: one rounding off).
// a·b + c in one rounding where the ISA has an FMA: the forward and the backward add the mask to
// the scaled scores with it, so that both round them the same whatever GCC would contract.
inline float fused(float a, float b, float c) {
#if defined(__FMA__) || defined(__aarch64__)
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;  // no FMA instruction: the tiles multiply and add too
#endif
}

inline float tile_dot(const float* a, const float* b, int64_t n) {
  float total = 0.0f;
  for (int64_t d0 = 0; d0 < n; d0 += kChainD) {
    float acc = 0.0f;
    for (int64_t d = d0; d < std::min(n, d0 + kChainD); ++d) acc = fused(a[d], b[d], acc);
    total = d0 == 0 ? acc : acc + total;
  }
  return total;
}

// Turns one query row's raw dot products s[0, n) (n a multiple of kLanes, keys j0 + [0, n)) into
// the scores the softmax sees on the visible keys [lo, hi), and −inf elsewhere: scale, soft-cap,
// mask, in this order and with these roundings wherever scores are made (forward, decode path,
// backward), so that the backward recomputes the forward's scores bit for bit. `mask` is the
// row's mask at key j0 (or null). Returns the factor still to be applied to the row: the scale,
// when nothing came after it (the forward folds that product into its max pass), else 1. With
// `dcap` set (the backward, soft-capping only) it also writes d cap / d x = 1 − tanh² there on
// [lo, hi), 0 elsewhere.
inline float finish_scores(float* s, int64_t n, int64_t lo, int64_t hi, float scale, float softcap,
                           const float* mask, int64_t mask_stride, float* dcap) {
  float pending = 1.0f;
  if (softcap > 0.0f) {  // one vector pass: t = tanh(scale·s / softcap), s = softcap·t (t with a mask)
    const Vec sc = splat(scale), inv = splat(1.0f / softcap), cap = splat(softcap);
    for (int64_t j = 0; j < n; j += kLanes) {
      const Vec t = tanh(load(s + j) * sc * inv);
      if (dcap) store(dcap + j, 1.0f - t * t);
      store(s + j, mask ? t : cap * t);
    }
    if (mask)
      for (int64_t j = lo; j < hi; ++j) s[j] = fused(softcap, s[j], mask[j * mask_stride]);
  } else if (mask) {
    for (int64_t j = lo; j < hi; ++j) s[j] = fused(s[j], scale, mask[j * mask_stride]);
  } else {
    pending = scale;
  }
  if (dcap) {
    std::fill(dcap, dcap + lo, 0.0f);
    std::fill(dcap + hi, dcap + n, 0.0f);
  }
  std::fill(s, s + lo, -std::numeric_limits<float>::infinity());
  std::fill(s + hi, s + n, -std::numeric_limits<float>::infinity());
  return pending;
}

// The forwards' (flash_attention.cpp, flash_attention_bf16.cpp) online-softmax update of one row of scores s[0, n) (n a multiple of kLanes), first multiplied
// by `scale`: turns them into probabilities and rescales the row's output o[0, dv) when its
// running max moves. The scale is applied here, not folded into q, to spare q·k a rounding.
// NaN: the max skips NaN scores, but e^(NaN − m) is NaN, so a NaN score makes l (and the
// output) NaN; m stays −∞ only while every score so far is −∞ or NaN, and l == 0 only while
// every score is −∞ (a masked row).
// exp_fn: e^x of a vector (simd.h's exp unless a kernel brings its own).
template <class ExpFn>
inline void softmax_row(float* s, int64_t n, float scale, float& m, float& l, float* o, int64_t dv, ExpFn exp_fn) {
  Vec vmax = splat(-std::numeric_limits<float>::infinity());
  const Vec sc = splat(scale);
  for (int64_t j = 0; j < n; j += kLanes) {
    const Vec x = load(s + j) * sc;
    store(s + j, x);
    vmax = max(vmax, x);
  }
  const float m_new = std::max(m, reduce_max(vmax));
  if (m_new == -std::numeric_limits<float>::infinity()) {  // every score −∞ (masked) or NaN
    bool nan = false;
    for (int64_t j = 0; j < n; ++j) nan |= std::isnan(s[j]);
    if (nan) {  // the row is NaN: poison l and o, whatever comes later
      l = std::numeric_limits<float>::quiet_NaN();
      for (int64_t d = 0; d < dv; ++d) o[d] = l;
    }
    for (int64_t j = 0; j < n; j += kLanes) store(s + j, splat(0.0f));  // nothing to add to o
    return;
  }
  if (m_new > m) {
    const float alpha = m == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(m - m_new);
    l *= alpha;
    for (int64_t d = 0; d < dv; ++d) o[d] *= alpha;
    m = m_new;
  }
  const Vec mv = splat(m_new);
  Vec sum = splat(0.0f);
  for (int64_t j = 0; j < n; j += kLanes) {
    const Vec e = exp_fn(load(s + j) - mv);
    store(s + j, e);
    sum += e;
  }
  l += reduce_sum(sum);
}
inline void softmax_row(float* s, int64_t n, float scale, float& m, float& l, float* o, int64_t dv) {
  softmax_row(s, n, scale, m, l, o, dv, [](Vec x) { return exp(x); });
}

// The blocked forwards' first step for rows [i0, i0 + rows) of batch b: each row's visible keys
// (begin, end), the union's bounds (min_begin, max_end), and the online softmax's m = −∞, l = 0.
inline void start_rows(const AttentionParams& p, int64_t b, int64_t i0, int64_t rows, int64_t* begin, int64_t* end,
                       float* m, float* l, int64_t& min_begin, int64_t& max_end) {
  min_begin = p.Tk;
  max_end = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const KeyRange keys = key_range(p, b, i0 + r);
    begin[r] = keys.begin;
    end[r] = keys.end;
    min_begin = std::min(min_begin, keys.begin);
    max_end = std::max(max_end, keys.end);
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
  }
}

// The blocked forwards' last step for rows [i0, i0 + rows) of query head h: out = o / l (0 for a
// row with no visible key; a NaN l is a NaN row, not a masked one), lse = m + log l (−∞ there).
// o: the rows' unnormalised outputs, ldo apart.
inline void write_rows(const AttentionParams& p, int64_t b, int64_t h, int64_t i0, int64_t rows, const float* m,
                       const float* l, const float* o, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    const bool masked = l[r] == 0.0f;
    const float inv = 1.0f / l[r];
    if (p.out) {
      float* out = p.out + b * p.out_stride[0] + h * p.out_stride[1] + i * p.out_stride[2];
      for (int64_t d = 0; d < p.Dv; ++d) out[d * p.out_stride[3]] = masked ? 0.0f : o[r * ldo + d] * inv;
    }
    if (p.lse)
      p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]] =
          masked ? -std::numeric_limits<float>::infinity() : m[r] + std::log(l[r]);
  }
}

// The backwards' (flash_backward.cpp, flash_backward_bf16.cpp) split: one task per (batch, kv
// head), run start to end by one thread with its own scratch Task(p), so that no two threads add
// into one gradient and the result does not depend on the thread count.
template <class Task, class Run>
void for_each_kv_head(const AttentionParams& p, Run run) {
#pragma omp parallel
  {
    Task task(p);
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t hk = 0; hk < p.Hkv; ++hk) run(p, b, hk, task);
  }
}

// Whether any of n rows' visible keys [begin[r], end[r]) (empty when equal) meets keys [j0, j1):
// the backwards skip a key block no row of a query block sees (causal, window, padding).
inline bool rows_see_keys(const int64_t* begin, const int64_t* end, int64_t n, int64_t j0, int64_t j1) {
  for (int64_t r = 0; r < n; ++r)
    if (begin[r] < end[r] && begin[r] < j1 && end[r] > j0) return true;
  return false;
}

// The backwards' last step for kv head hk of batch b: dq of the group's rows (r = (h − first
// head)·Tq + i) from dq_rows, ld apart.
inline void write_dq(const AttentionParams& p, int64_t b, int64_t hk, const float* dq_rows, int64_t ld) {
  const int64_t group = p.Hq / p.Hkv;
  for (int64_t row = 0; row < group * p.Tq; ++row) {
    const int64_t h = hk * group + row / p.Tq, i = row % p.Tq;
    float* dq = p.dq + b * p.dq_stride[0] + h * p.dq_stride[1] + i * p.dq_stride[2];
    for (int64_t d = 0; d < p.D; ++d) dq[d * p.dq_stride[3]] = dq_rows[row * ld + d];
  }
}

// The forward's split-K decode path (flash_attention.cpp) takes few queries against many keys:
// Tq <= kDecodeQueries and at most kDecodeRows query rows per kv head, rows of unit stride, no
// dropout (a training-time option; decoding never drops).
constexpr int64_t kDecodeQueries = 8;
constexpr int64_t kDecodeRows = 32;
inline bool takes_decode_path(const AttentionParams& p) {
  const bool unit_rows = p.q_stride[3] == 1 && p.k_stride[3] == 1 && (!p.out || p.v_stride[3] == 1);
  return unit_rows && p.dropout == 0.0f && p.Tq <= kDecodeQueries && p.Tq * (p.Hq / p.Hkv) <= kDecodeRows;
}

// The decode path's q·k (few query rows, keys read in place): kLanes products at a time, the
// lanes summed by reduce_sum at the end. The backward calls it on the shapes the forward took
// the decode path for, so that it recomputes the forward's scores bit for bit. A 16-bit key
// (bfloat16, float16) is widened in registers, a Q8_0 one dequantised (load_kv_at): the same
// products as on the widened key.
template <class T>
float decode_dot(const float* a, const T* b, int64_t n) {
  const int64_t full = n / kLanes * kLanes;
  Vec acc = splat(0.0f);
  for (int64_t d = 0; d < full; d += kLanes) acc = fma(load(a + d), load_kv_at(b, d), acc);
  if (full < n) acc = fma(load_partial(a + full, static_cast<int>(n - full), 0.0f),
                          load_partial_kv_at(b, full, static_cast<int>(n - full)), acc);
  return reduce_sum(acc);
}

// decode_dot of one query row against 4 keys: 4 independent chains (one FMA chain alone waits
// on its latency), each exactly decode_dot's, so out[i] is decode_dot(a, b_i, n) bit for bit.
template <class T>
void decode_dot4(const float* a, const T* b0, const T* b1, const T* b2, const T* b3, int64_t n, float* out) {
  const int64_t full = n / kLanes * kLanes;
  Vec c0 = splat(0.0f), c1 = c0, c2 = c0, c3 = c0;
  for (int64_t d = 0; d < full; d += kLanes) {
    const Vec av = load(a + d);
    c0 = fma(av, load_kv_at(b0, d), c0);
    c1 = fma(av, load_kv_at(b1, d), c1);
    c2 = fma(av, load_kv_at(b2, d), c2);
    c3 = fma(av, load_kv_at(b3, d), c3);
  }
  if (full < n) {
    const int rest = static_cast<int>(n - full);
    const Vec av = load_partial(a + full, rest, 0.0f);
    c0 = fma(av, load_partial_kv_at(b0, full, rest), c0);
    c1 = fma(av, load_partial_kv_at(b1, full, rest), c1);
    c2 = fma(av, load_partial_kv_at(b2, full, rest), c2);
    c3 = fma(av, load_partial_kv_at(b3, full, rest), c3);
  }
  out[0] = reduce_sum(c0);
  out[1] = reduce_sum(c1);
  out[2] = reduce_sum(c2);
  out[3] = reduce_sum(c3);
}

// decode_dot and decode_dot4 for Q8_0 keys (n a multiple of 32): each block's scale widened once
// for its 32 values instead of once a vector (the loads were the split-K decode's bound: SmolLM2 at
// 4k context, one thread, 0.76x the float32 cache's tokens/s with the scale per vector). The same
// FMAs in the same order on the same exact products, so the same bits as the generic form.
inline float decode_dot(const float* a, const BlockQ8_0* b, int64_t n) {
  Vec acc = splat(0.0f);
  for (int64_t blk = 0; blk < n / 32; ++blk) {
    const Vec d = splat(f16_scalar(b[blk].d));
    for (int i = 0; i < 32; i += kLanes) acc = fma(load(a + blk * 32 + i), d * load_i8(b[blk].qs + i), acc);
  }
  return reduce_sum(acc);
}
inline void decode_dot4(const float* a, const BlockQ8_0* b0, const BlockQ8_0* b1, const BlockQ8_0* b2,
                        const BlockQ8_0* b3, int64_t n, float* out) {
  Vec c0 = splat(0.0f), c1 = c0, c2 = c0, c3 = c0;
  for (int64_t blk = 0; blk < n / 32; ++blk) {
    const Vec d0 = splat(f16_scalar(b0[blk].d)), d1 = splat(f16_scalar(b1[blk].d)),
              d2 = splat(f16_scalar(b2[blk].d)), d3 = splat(f16_scalar(b3[blk].d));
    for (int i = 0; i < 32; i += kLanes) {
      const Vec av = load(a + blk * 32 + i);
      c0 = fma(av, d0 * load_i8(b0[blk].qs + i), c0);
      c1 = fma(av, d1 * load_i8(b1[blk].qs + i), c1);
      c2 = fma(av, d2 * load_i8(b2[blk].qs + i), c2);
      c3 = fma(av, d3 * load_i8(b3[blk].qs + i), c3);
    }
  }
  out[0] = reduce_sum(c0);
  out[1] = reduce_sum(c1);
  out[2] = reduce_sum(c2);
  out[3] = reduce_sum(c3);
}

template <int R, int C>
struct ScoresTile {
  static void run(const float* q, int64_t ldq, const float* kt, int64_t ldk, int64_t D, float* s, int64_t lds) {
    scores_tile<R, C>(q, ldq, kt, ldk, D, s, lds);
  }
};
template <int R, int C>
struct AccumulateTile {
  static void run(const float* p, int64_t ldp, const float* v, int64_t ldv, int64_t J, float* o, int64_t ldo) {
    accumulate_tile<R, C>(p, ldp, v, ldv, J, o, ldo);
  }
};

// Both microkernels share one signature; tile_fn picks the instance for `rows` <= kRows rows
// and `cols` <= kCols vectors.
using TileFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t);
template <template <int, int> class Tile>
TileFn tile_fn(int64_t rows, int64_t cols) {
  static_assert(kRows <= 6 && kCols <= 4);
  static constexpr TileFn table[6][4] = {
      {Tile<1, 1>::run, Tile<1, 2>::run, Tile<1, 3>::run, Tile<1, 4>::run},
      {Tile<2, 1>::run, Tile<2, 2>::run, Tile<2, 3>::run, Tile<2, 4>::run},
      {Tile<3, 1>::run, Tile<3, 2>::run, Tile<3, 3>::run, Tile<3, 4>::run},
      {Tile<4, 1>::run, Tile<4, 2>::run, Tile<4, 3>::run, Tile<4, 4>::run},
      {Tile<5, 1>::run, Tile<5, 2>::run, Tile<5, 3>::run, Tile<5, 4>::run},
      {Tile<6, 1>::run, Tile<6, 2>::run, Tile<6, 3>::run, Tile<6, 4>::run}};
  return table[rows - 1][cols - 1];
}

}  // namespace mhsa::kernels::MHSA_ISA
