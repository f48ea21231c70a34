// kernels/flash_backward.cpp — the fast attention backward, compiled once per ISA (MHSA_ISA).
//
// FlashAttention-2's backward on the CPU. One (batch, kv head) is one task, run by one thread
// start to end, so no two threads ever add into the same gradient (no atomics) and the result does
// not depend on the thread count. Inside a task, for each key block (Bc keys) with its dK, dV
// accumulators, for each query block (Br rows of any head of the group) that can see it:
//   S = Q Ktᵀ → P = exp(cap(σS) + mask − lse) (0 outside each row's key_range)  scores microkernel
//     (for a row whose |lse| is too large for its float rounding, lse_too_coarse, P = exp(s − m)/l
//     with the row's max m and sum l recomputed by a first pass over its keys: exact_rows)
//   dP = dO Vtᵀ                                                          scores microkernel
//   dS = σ P ∘ (dP − D) ∘ cap',  D = rowsum(dO ∘ O) precomputed once (cap' = 1 − tanh², or 1)
//   dV += Pᵀ dO,  dK += dSᵀ Q,  dQ += dS K                                accumulate microkernel
// With dropout (factors Z: 0 or 1/(1 − p), regenerated from the seed), dV += (P∘Z)ᵀ dO and
// dS = σ P ∘ (dP∘Z − D) ∘ cap'; D = rowsum(dO ∘ O) holds as it is.
// Memory per task: the group's packed Q, dO, dQ and the head's packed K and V — O(T·D), no T×T.
// Key blocks that no row of a query block sees (above the causal diagonal, before a sliding
// window) are skipped.
#include <cmath>
#include <limits>

#include "kernels/attention_params.h"
#include "kernels/attention_sinks.h"
#include "kernels/isa/attention_tiles.h"
#include "kernels/isa/simd.h"

namespace mhsa::kernels::MHSA_ISA {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kBr = 4 * kRows;           // query rows per block
constexpr int64_t kBc = 2 * kCols * kLanes;  // keys per block

// One task's packed operands. Rows of the group: r = (h − first head)·Tq + i.
struct Task {
  int64_t d_pad, dv_pad, rows, key_blocks;
  AlignedFloats q, dout, dq;   // [rows, d_pad], [rows, dv_pad], [rows, d_pad]
  std::vector<float> lse, di, di_tiles;  // [rows]
  std::vector<float> m, inv_l;           // [rows] P = exp(s − m)·inv_l: lse and 1, or exact_rows'
  std::vector<int64_t> begin, end;  // [rows] key_range, empty for a fully masked row
  AlignedFloats kt, vt;        // [key_blocks, D, kBc], [key_blocks, Dv, kBc]: transposed blocks
  AlignedFloats kn;            // [key_blocks·kBc, d_pad]: keys as rows
  AlignedFloats s, dp, pt, dst;  // [kBr, kBc] x2, [kBc, kBr] x2
  AlignedFloats dcap;            // [kBr, kBc] soft-capping's 1 − tanh², empty without it
  AlignedFloats z;               // [kBc] one row's dropout factors, empty without dropout
  AlignedFloats dk, dv;          // [kBc, d_pad], [kBc, dv_pad]
  std::vector<float> out_row;    // [Dv] one row of the forward's output
  Task(const AttentionParams& p)
      : d_pad(round_up(p.D, kLanes)), dv_pad(round_up(p.Dv, kLanes)), rows(p.Hq / p.Hkv * p.Tq),
        key_blocks((p.Tk + kBc - 1) / kBc),
        q(static_cast<size_t>(rows * d_pad)), dout(static_cast<size_t>(rows * dv_pad)),
        dq(static_cast<size_t>(rows * d_pad)), lse(static_cast<size_t>(rows)), di(static_cast<size_t>(rows)),
        di_tiles(static_cast<size_t>(rows)), m(static_cast<size_t>(rows)), inv_l(static_cast<size_t>(rows)),
        begin(static_cast<size_t>(rows)), end(static_cast<size_t>(rows)), kt(static_cast<size_t>(key_blocks * p.D * kBc)),
        vt(static_cast<size_t>(key_blocks * p.Dv * kBc)), kn(static_cast<size_t>(key_blocks * kBc * d_pad)),
        s(kBr * kBc), dp(kBr * kBc), pt(kBc * kBr), dst(kBc * kBr), dcap(p.softcap > 0.0f ? kBr * kBc : 0),
        z(p.dropout > 0.0f ? kBc : 0), dk(static_cast<size_t>(kBc * d_pad)),
        dv(static_cast<size_t>(kBc * dv_pad)), out_row(static_cast<size_t>(p.Dv)) {}
};

void pack(const AttentionParams& p, int64_t b, int64_t hk, Task& t) {
  const int64_t group = p.Hq / p.Hkv;
  for (int64_t r = 0; r < t.rows; ++r) {
    const int64_t h = hk * group + r / p.Tq, i = r % p.Tq;
    const float* q = p.q + b * p.q_stride[0] + h * p.q_stride[1] + i * p.q_stride[2];
    const float* o = p.out + b * p.out_stride[0] + h * p.out_stride[1] + i * p.out_stride[2];
    const float* g = p.dout + b * p.dout_stride[0] + h * p.dout_stride[1] + i * p.dout_stride[2];
    for (int64_t d = 0; d < t.d_pad; ++d) t.q[r * t.d_pad + d] = d < p.D ? q[d * p.q_stride[3]] : 0.0f;
    for (int64_t d = 0; d < t.dv_pad; ++d) t.dout[r * t.dv_pad + d] = d < p.Dv ? g[d * p.dout_stride[3]] : 0.0f;
    for (int64_t d = 0; d < p.Dv; ++d) t.out_row[d] = o[d * p.out_stride[3]];
    t.lse[r] = p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]];
    const KeyRange keys = t.lse[r] == kNegInf ? KeyRange{} : key_range(p, b, i);  // a fully masked row has no gradient
    // D twice. Summed like the dP tiles sum dO·v, for the keys that carry a row's whole weight
    // (P = 1): there O = v exactly, so D = dP and dS = 0 exactly, as it must be. In double for
    // every other key: D's error moves all of a row's dS the same way and so reaches dQ and dK
    // whole (summed in float, dQ and dK were 1.37x torch's error at the median and failed its 2x
    // bar on 3 seeds in 200 for 23 masked keys at scale 0.2; in double 1.21x, worst 1.87x of 300).
    t.di_tiles[r] = tile_dot(t.dout.data() + r * t.dv_pad, t.out_row.data(), p.Dv);
    double sum = 0.0;
    for (int64_t d = 0; d < p.Dv; ++d) sum += double(t.dout[r * t.dv_pad + d]) * double(t.out_row[d]);
    t.di[r] = static_cast<float>(sum);
    t.begin[r] = keys.begin;
    t.end[r] = keys.end;
    t.m[r] = t.lse[r];
    t.inv_l[r] = 1.0f;
  }
  std::fill(t.dq.begin(), t.dq.end(), 0.0f);
  const float* k = static_cast<const float*>(p.k) + b * p.k_stride[0] + hk * p.k_stride[1];
  const float* v = static_cast<const float*>(p.v) + b * p.v_stride[0] + hk * p.v_stride[1];
  for (int64_t j = 0; j < t.key_blocks * kBc; ++j) {
    const int64_t kb = j / kBc, jj = j % kBc;
    const bool real = j < p.Tk;
    for (int64_t d = 0; d < t.d_pad; ++d) {
      const float x = real && d < p.D ? k[j * p.k_stride[2] + d * p.k_stride[3]] : 0.0f;
      t.kn[j * t.d_pad + d] = x;
      if (d < p.D) t.kt[(kb * p.D + d) * kBc + jj] = x;
    }
    for (int64_t d = 0; d < p.Dv; ++d)
      t.vt[(kb * p.Dv + d) * kBc + jj] = real ? v[j * p.v_stride[2] + d * p.v_stride[3]] : 0.0f;
  }
}

// o[rows, cols] += a[rows, J] · m[J, cols], cols a multiple of kLanes: the accumulate tiles, each
// call's J-term sums a fresh chain added to o (gradients sum over thousands of rows and keys).
void accumulate(int64_t rows, int64_t cols, const float* a, int64_t lda, const float* m, int64_t ldm, int64_t J,
                float* o, int64_t ldo) {
  for (int64_t r = 0; r < rows; r += kRows)
    for (int64_t c = 0; c < cols; c += kCols * kLanes)
      tile_fn<AccumulateTile>(std::min<int64_t>(kRows, rows - r), std::min<int64_t>(kCols, (cols - c) / kLanes))(
          a + r * lda, lda, m + c, ldm, J, o + r * ldo + c, ldo);
}

// s[rows, kBc] = a[rows, D] · bt[D, kBc]: the scores tiles.
void scores(int64_t rows, const float* a, int64_t lda, const float* bt, int64_t D, float* s) {
  for (int64_t r = 0; r < rows; r += kRows)
    for (int64_t c = 0; c < kBc; c += kCols * kLanes)
      tile_fn<ScoresTile>(std::min<int64_t>(kRows, rows - r), kCols)(a + r * lda, lda, bt + c, kBc, D,
                                                                     s + r * kBc + c, kBc);
}

// Rows r0 .. r0 + n's scores against key block kb into t.s, as the forward computed them.
void block_scores(const AttentionParams& p, Task& t, bool decode, int64_t r0, int64_t n, int64_t kb) {
  const int64_t j0 = kb * kBc;
  if (decode)
    for (int64_t r = 0; r < n; ++r)
      for (int64_t jj = 0; jj < kBc; ++jj)
        t.s[r * kBc + jj] = decode_dot(t.q.data() + (r0 + r) * t.d_pad, t.kn.data() + (j0 + jj) * t.d_pad, p.D);
  else
    scores(n, t.q.data() + r0 * t.d_pad, t.d_pad, t.kt.data() + kb * p.D * kBc, p.D, t.s.data());
}

// The rows whose float lse is too coarse for exp(s − lse) (lse_too_coarse: |lse| ≥ 16): their max
// m and 1/l recomputed from their scores (finished as the main pass finishes them), the online
// softmax's running max with l summed in double across blocks. Only the query blocks that hold
// such a row compute S an extra time; every other row keeps m = lse, 1/l = 1, whose P is
// exp(s − lse)·1, today's bits.
void exact_rows(const AttentionParams& p, int64_t b, int64_t hk, Task& t, bool decode) {
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
    for (int64_t kb = 0; kb < t.key_blocks; ++kb) {
      const int64_t j0 = kb * kBc;
      if (!rows_see_keys(t.begin.data() + r0, t.end.data() + r0, n, j0, j0 + kBc)) continue;
      block_scores(p, t, decode, r0, n, kb);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t row = r0 + r, h = hk * group + row / p.Tq, i = row % p.Tq;
        const int64_t lo = std::clamp<int64_t>(t.begin[row] - j0, 0, kBc);
        const int64_t hi = std::clamp<int64_t>(t.end[row] - j0, lo, kBc);
        if (!coarse[r] || hi == lo) continue;
        float* s = t.s.data() + r * kBc;
        const float* mrow = p.mask ? p.mask + b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2] +
                                         j0 * p.mask_stride[3]
                                   : nullptr;
        const float pending = finish_scores(s, kBc, lo, hi, p.scale, p.softcap, mrow, p.mask_stride[3], nullptr);
        if (pending != 1.0f)
          for (int64_t jj = 0; jj < kBc; jj += kLanes) store(s + jj, load(s + jj) * splat(pending));
        Vec vmax = splat(-kInf);
        for (int64_t jj = 0; jj < kBc; jj += kLanes) vmax = max(vmax, load(s + jj));
        const float block_max = reduce_max(vmax);
        if (block_max == -kInf) continue;  // every key of the block masked
        if (block_max > m[r]) {
          l[r] = m[r] == -kInf ? 0.0 : l[r] * std::exp(double(m[r]) - double(block_max));
          m[r] = block_max;
        }
        const Vec mv = splat(m[r]);
        Vec sum = splat(0.0f);
        for (int64_t jj = 0; jj < kBc; jj += kLanes) sum += exp(load(s + jj) - mv);
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
  const int64_t group = p.Hq / p.Hkv;
  const bool decode = takes_decode_path(p);  // the forward's q·k came from decode_dot
  exact_rows(p, b, hk, t, decode);
  for (int64_t kb = 0; kb < t.key_blocks; ++kb) {
    const int64_t j0 = kb * kBc;
    std::fill(t.dk.begin(), t.dk.end(), 0.0f);
    std::fill(t.dv.begin(), t.dv.end(), 0.0f);
    for (int64_t r0 = 0; r0 < t.rows; r0 += kBr) {
      const int64_t n = std::min(kBr, t.rows - r0);
      if (!rows_see_keys(t.begin.data() + r0, t.end.data() + r0, n, j0, j0 + kBc)) continue;
      block_scores(p, t, decode, r0, n, kb);
      scores(n, t.dout.data() + r0 * t.dv_pad, t.dv_pad, t.vt.data() + kb * p.Dv * kBc, p.Dv, t.dp.data());
      for (int64_t r = 0; r < n; ++r) {
        const int64_t row = r0 + r, h = hk * group + row / p.Tq, i = row % p.Tq;
        const int64_t lo = std::clamp<int64_t>(t.begin[row] - j0, 0, kBc);
        const int64_t hi = std::clamp<int64_t>(t.end[row] - j0, lo, kBc);
        float* s = t.s.data() + r * kBc;
        float* dp = t.dp.data() + r * kBc;
        float* dcap = p.softcap > 0.0f ? t.dcap.data() + r * kBc : nullptr;
        // The scores exactly as the forward rounded them (its lse came from these), the exp in a
        // separate pass; −inf outside the row's keys, where exp gives exactly 0.
        const float* mrow = p.mask ? p.mask + b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2] +
                                         j0 * p.mask_stride[3]
                                   : nullptr;
        const float pending = finish_scores(s, kBc, lo, hi, p.scale, p.softcap, mrow, p.mask_stride[3], dcap);
        if (pending != 1.0f)
          for (int64_t jj = 0; jj < kBc; jj += kLanes) store(s + jj, load(s + jj) * splat(pending));
        // P = exp(s − m)·(1/l): m = lse and 1/l = 1 (exactly exp(s − lse)) unless exact_rows set them.
        const Vec m = splat(t.m[row]), inv_l = splat(t.inv_l[row]);
        const Vec di = splat(t.di[row]), di_tiles = splat(t.di_tiles[row]);
        const Vec one = splat(1.0f), ds_scale = splat(p.scale);
        const float* z = nullptr;
        if (p.dropout > 0.0f) {
          dropout_scales(p, b, h, i, j0, kBc, t.z.data());
          z = t.z.data();
        }
        for (int64_t jj = 0; jj < kBc; jj += kLanes) {  // P (dropped) into the dP buffer's place, dS into s
          Vec prob = hi > lo ? exp(load(s + jj) - m) * inv_l : Vec{}, dpz = load(dp + jj);
          if (z) dpz *= load(z + jj);
          Vec ds = prob * (dpz - (prob == one ? di_tiles : di));
          if (dcap) ds *= load(dcap + jj);
          if (z) prob *= load(z + jj);
          store(s + jj, ds * ds_scale);
          store(dp + jj, prob);
        }
        for (int64_t jj = 0; jj < kBc; ++jj) {  // transposed copies for dV = Pᵀ dO and dK = dSᵀ Q
          t.pt[jj * kBr + r] = dp[jj];
          t.dst[jj * kBr + r] = s[jj];
        }
      }
      accumulate(kBc, t.dv_pad, t.pt.data(), kBr, t.dout.data() + r0 * t.dv_pad, t.dv_pad, n, t.dv.data(), t.dv_pad);
      accumulate(kBc, t.d_pad, t.dst.data(), kBr, t.q.data() + r0 * t.d_pad, t.d_pad, n, t.dk.data(), t.d_pad);
      accumulate(n, t.d_pad, t.s.data(), kBc, t.kn.data() + j0 * t.d_pad, t.d_pad, kBc,
                 t.dq.data() + r0 * t.d_pad, t.d_pad);
    }
    for (int64_t jj = 0; jj < kBc && j0 + jj < p.Tk; ++jj) {
      const int64_t j = j0 + jj;
      float* dk = p.dk + b * p.dk_stride[0] + hk * p.dk_stride[1] + j * p.dk_stride[2];
      float* dv = p.dv + b * p.dv_stride[0] + hk * p.dv_stride[1] + j * p.dv_stride[2];
      for (int64_t d = 0; d < p.D; ++d) dk[d * p.dk_stride[3]] = t.dk[jj * t.d_pad + d];
      for (int64_t d = 0; d < p.Dv; ++d) dv[d * p.dv_stride[3]] = t.dv[jj * t.dv_pad + d];
    }
  }
  write_dq(p, b, hk, t.dq.data(), t.d_pad);
}

}  // namespace

void attention_backward(const AttentionParams& p) {
  for_each_kv_head<Task>(p, run_task);
}

}  // namespace mhsa::kernels::MHSA_ISA
