// kernels/elementwise.cpp — the row kernels (norms and their backward passes, GELU, the gated
// MLP activations, soft-capping, rotary embedding, the cross-entropy head, AdamW), compiled once
// per ISA (see elementwise.h for the definitions and the float64 twins). All are memory-bound row
// passes; the point is only to keep them off the critical path: vector exp instead of libm tanh
// (GELU runs on 4·C values per token, and std::tanh alone would cost as much as a quarter of a
// prefill). Sums across rows (the norms' weight gradients) run in float64 in row order, split
// across threads by column, so they do not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/isa/simd.h"

namespace mhsa::kernels::MHSA_ISA {
namespace {

// Enough work per call to be worth waking the thread team.
bool parallel_worth_it(int64_t elements) { return elements >= (int64_t{1} << 16); }

float row_sum(const float* x, int64_t n) {
  Vec acc = splat(0.0f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc += load(x + i);
  if (i < n) acc += load_partial(x + i, static_cast<int>(n - i), 0.0f);
  return reduce_sum(acc);
}

float row_centered_sq_sum(const float* x, int64_t n, float mean) {
  const Vec m = splat(mean);
  Vec acc = splat(0.0f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const Vec d = load(x + i) - m;
    acc = fma(d, d, acc);
  }
  if (i < n) {
    const Vec d = load_partial(x + i, static_cast<int>(n - i), mean) - m;
    acc = fma(d, d, acc);
  }
  return reduce_sum(acc);
}

// Applies f(i, n) to the column stretches [i, i + n) of a row: full vectors, then one partial.
template <class F>
void for_each_vector(int64_t n, F&& f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) f(i, kLanes);
  if (i < n) f(i, static_cast<int>(n - i));
}
Vec load_n(const float* p, int n) { return n == kLanes ? load(p) : load_partial(p, n, 0.0f); }
void store_n(float* p, Vec v, int n) {
  if (n == kLanes)
    store(p, v);
  else
    store_partial(p, v, n);
}

// sums[c] += Σ_r term(r, c) for c < C, each column summed in float64 in row order. Threads take
// whole column stretches, so the result does not depend on how many there are.
template <class Term>
void column_sums(int64_t rows, int64_t C, Term&& term, float* sums) {
  constexpr int64_t kColumns = 64;
  const int64_t stretches = (C + kColumns - 1) / kColumns;
#pragma omp parallel for schedule(static) if (parallel_worth_it(rows * C))
  for (int64_t s = 0; s < stretches; ++s) {
    const int64_t c0 = s * kColumns, n = std::min(kColumns, C - c0);
    double acc[kColumns] = {};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < n; ++c) acc[c] += term(r, c0 + c);
    for (int64_t c = 0; c < n; ++c) sums[c0 + c] += static_cast<float>(acc[c]);
  }
}

}  // namespace

void layer_norm(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* gamma, const float* beta,
                float eps, float* y, int64_t ldy) {
#pragma omp parallel for schedule(static) if (parallel_worth_it(rows * C))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    const float mean = row_sum(xr, C) / static_cast<float>(C);  // two passes: no cancellation
    const float var = row_centered_sq_sum(xr, C, mean) / static_cast<float>(C);
    const Vec rstd = splat(1.0f / std::sqrt(var + eps)), m = splat(mean);
    int64_t c = 0;
    for (; c + kLanes <= C; c += kLanes)
      store(yr + c, fma((load(xr + c) - m) * rstd, load(gamma + c), load(beta + c)));
    for (; c < C; ++c) yr[c] = (xr[c] - mean) * rstd[0] * gamma[c] + beta[c];
  }
}

// Statistics as layer_norm computes them (the same roundings), then per row
// dx += rstd·(dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂)); the parameter gradients by column_sums.
void layer_norm_backward(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* gamma, float eps,
                         const float* dy, int64_t lddy, float* dx, int64_t lddx, float* dgamma, float* dbeta) {
  std::vector<float> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  const float inv_c = 1.0f / static_cast<float>(C);
#pragma omp parallel for schedule(static) if (parallel_worth_it(rows * C))
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * ldx, *dyr = dy + r * lddy;
    const float m = row_sum(xr, C) / static_cast<float>(C);
    const float rs = 1.0f / std::sqrt(row_centered_sq_sum(xr, C, m) / static_cast<float>(C) + eps);
    mean[static_cast<size_t>(r)] = m;
    rstd[static_cast<size_t>(r)] = rs;
    Vec sa = splat(0.0f), sb = splat(0.0f);
    for_each_vector(C, [&](int64_t c, int n) {
      const Vec g = load_n(dyr + c, n) * load_n(gamma + c, n), xhat = (load_n(xr + c, n) - splat(m)) * splat(rs);
      sa += g;
      sb = fma(g, xhat, sb);  // lanes past n hold 0 in g
    });
    const Vec a = splat(reduce_sum(sa) * inv_c), b = splat(reduce_sum(sb) * inv_c);
    float* dxr = dx + r * lddx;
    for_each_vector(C, [&](int64_t c, int n) {
      const Vec g = load_n(dyr + c, n) * load_n(gamma + c, n), xhat = (load_n(xr + c, n) - splat(m)) * splat(rs);
      store_n(dxr + c, load_n(dxr + c, n) + splat(rs) * (g - a - xhat * b), n);
    });
  }
  if (dgamma)
    column_sums(rows, C, [&](int64_t r, int64_t c) {
      const size_t i = static_cast<size_t>(r);
      return double(dy[r * lddy + c]) * double((x[r * ldx + c] - mean[i]) * rstd[i]);
    }, dgamma);
  if (dbeta) column_sums(rows, C, [&](int64_t r, int64_t c) { return double(dy[r * lddy + c]); }, dbeta);
}

void rms_norm(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* w, float offset, float eps, float* y,
              int64_t ldy) {
#pragma omp parallel for schedule(static) if (parallel_worth_it(rows * C))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    const Vec rs = splat(1.0f / std::sqrt(row_centered_sq_sum(xr, C, 0.0f) / static_cast<float>(C) + eps));
    for_each_vector(C, [&](int64_t c, int n) {
      store_n(yr + c, load_n(xr + c, n) * rs * (load_n(w + c, n) + splat(offset)), n);
    });
  }
}

// dx = rstd·dx̂ − x·rstd³·mean(dx̂·x) with dx̂ = dy·(w + offset); dw by column_sums.
void rms_norm_backward(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* w, float offset, float eps,
                       const float* dy, int64_t lddy, float* dx, int64_t lddx, float* dw) {
  std::vector<float> rstd(static_cast<size_t>(rows));
#pragma omp parallel for schedule(static) if (parallel_worth_it(rows * C))
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * ldx, *dyr = dy + r * lddy;
    const float rs = 1.0f / std::sqrt(row_centered_sq_sum(xr, C, 0.0f) / static_cast<float>(C) + eps);
    rstd[static_cast<size_t>(r)] = rs;
    Vec acc = splat(0.0f);
    for_each_vector(C, [&](int64_t c, int n) {
      acc = fma(load_n(dyr + c, n) * (load_n(w + c, n) + splat(offset)), load_n(xr + c, n), acc);
    });
    const Vec k = splat(rs * rs * rs * (reduce_sum(acc) / static_cast<float>(C))), vrs = splat(rs);
    float* dxr = dx + r * lddx;
    for_each_vector(C, [&](int64_t c, int n) {
      const Vec g = load_n(dyr + c, n) * (load_n(w + c, n) + splat(offset));
      store_n(dxr + c, load_n(dxr + c, n) + (vrs * g - load_n(xr + c, n) * k), n);
    });
  }
  if (dw)
    column_sums(rows, C, [&](int64_t r, int64_t c) {
      return double(dy[r * lddy + c]) * double(x[r * ldx + c] * rstd[static_cast<size_t>(r)]);
    }, dw);
}

// 0.5·x·(1 + tanh(u)) = x / (1 + e^(−2u)): one exp and one division, exact at both tails.
void gelu_tanh(int64_t n, float* x) {
  constexpr float k = 0.7978845608028654f;  // √(2/π)
  const auto gelu = [&](Vec v) {
    const Vec u = splat(k) * fma(v * v, splat(0.044715f), splat(1.0f)) * v;
    return v / (splat(1.0f) + exp(splat(-2.0f) * u));
  };
  const int64_t full = n / kLanes * kLanes;
#pragma omp parallel for schedule(static) if (parallel_worth_it(n))
  for (int64_t i = 0; i < full; i += kLanes) store(x + i, gelu(load(x + i)));
  if (full < n) store_partial(x + full, gelu(load_partial(x + full, static_cast<int>(n - full), 0.0f)),
                              static_cast<int>(n - full));
}

// dz = du · GELU'(z), with GELU(z) = z·σ(2u), u = √(2/π)(z + 0.044715 z³):
// GELU'(z) = σ(2u) + z·σ(2u)(1 − σ(2u))·2u'  where u' = √(2/π)(1 + 3·0.044715 z²).
void gelu_tanh_backward(int64_t n, const float* z, const float* du, float* dz) {
  constexpr float k = 0.7978845608028654f;
  const auto grad = [&](Vec v, Vec d) {
    const Vec u = splat(k) * fma(v * v, splat(0.044715f), splat(1.0f)) * v;
    const Vec s = splat(1.0f) / (splat(1.0f) + exp(splat(-2.0f) * u));  // σ(2u)
    const Vec du_dz = splat(2.0f * k) * fma(v * v, splat(3.0f * 0.044715f), splat(1.0f));
    return d * fma(v * s * (splat(1.0f) - s), du_dz, s);
  };
  const int64_t full = n / kLanes * kLanes;
#pragma omp parallel for schedule(static) if (parallel_worth_it(n))
  for (int64_t i = 0; i < full; i += kLanes) store(dz + i, grad(load(z + i), load(du + i)));
  if (full < n) {
    const int rest = static_cast<int>(n - full);
    store_partial(dz + full, grad(load_partial(z + full, rest, 0.0f), load_partial(du + full, rest, 0.0f)), rest);
  }
}

namespace {

// act(g) and act'(g) of the gated MLPs: SiLU g·σ(g), σ(g)·(1 + g·(1 − σ(g))); GELU-tanh g·σ(2u),
// σ(2u) + g·σ(2u)(1 − σ(2u))·2u' with u = √(2/π)(g + 0.044715 g³).
struct GluAct {
  Vec value, slope;
};
template <GluKind kKind>
GluAct glu_act(Vec g) {
  if constexpr (kKind == GluKind::swiglu) {
    const Vec s = splat(1.0f) / (splat(1.0f) + exp(-g));
    return {g * s, s * fma(g, splat(1.0f) - s, splat(1.0f))};
  } else {
    constexpr float k = 0.7978845608028654f;
    const Vec u = splat(k) * fma(g * g, splat(0.044715f), splat(1.0f)) * g;
    const Vec s = splat(1.0f) / (splat(1.0f) + exp(splat(-2.0f) * u));
    const Vec du = splat(2.0f * k) * fma(g * g, splat(3.0f * 0.044715f), splat(1.0f));
    return {g * s, fma(g * s * (splat(1.0f) - s), du, s)};
  }
}

template <GluKind kKind>
void glu_rows(int64_t rows, int64_t F, const float* gate, int64_t ldg, const float* up, int64_t ldu, float* out,
              int64_t ldo) {
#pragma omp parallel for schedule(static) if (parallel_worth_it(rows * F))
  for (int64_t r = 0; r < rows; ++r) {
    const float *g = gate + r * ldg, *u = up + r * ldu;
    float* o = out + r * ldo;
    for_each_vector(F, [&](int64_t c, int n) {
      store_n(o + c, glu_act<kKind>(load_n(g + c, n)).value * load_n(u + c, n), n);
    });
  }
}

template <GluKind kKind>
void glu_backward_rows(int64_t rows, int64_t F, const float* gate, int64_t ldg, const float* up, int64_t ldu,
                       const float* dout, int64_t lddo, float* dgate, int64_t lddg, float* dup, int64_t lddu) {
#pragma omp parallel for schedule(static) if (parallel_worth_it(rows * F))
  for (int64_t r = 0; r < rows; ++r) {
    const float *g = gate + r * ldg, *u = up + r * ldu, *d = dout + r * lddo;
    float *dg = dgate + r * lddg, *du = dup + r * lddu;
    for_each_vector(F, [&](int64_t c, int n) {
      const GluAct a = glu_act<kKind>(load_n(g + c, n));
      const Vec dv = load_n(d + c, n), uv = load_n(u + c, n);
      store_n(dg + c, dv * uv * a.slope, n);
      store_n(du + c, dv * a.value, n);
    });
  }
}

}  // namespace

void glu(GluKind kind, int64_t rows, int64_t F, const float* gate, int64_t ldg, const float* up, int64_t ldu,
         float* out, int64_t ldo) {
  if (kind == GluKind::swiglu)
    glu_rows<GluKind::swiglu>(rows, F, gate, ldg, up, ldu, out, ldo);
  else
    glu_rows<GluKind::geglu>(rows, F, gate, ldg, up, ldu, out, ldo);
}

void glu_backward(GluKind kind, int64_t rows, int64_t F, const float* gate, int64_t ldg, const float* up, int64_t ldu,
                  const float* dout, int64_t lddo, float* dgate, int64_t lddg, float* dup, int64_t lddu) {
  if (kind == GluKind::swiglu)
    glu_backward_rows<GluKind::swiglu>(rows, F, gate, ldg, up, ldu, dout, lddo, dgate, lddg, dup, lddu);
  else
    glu_backward_rows<GluKind::geglu>(rows, F, gate, ldg, up, ldu, dout, lddo, dgate, lddg, dup, lddu);
}

void softcap(int64_t rows, int64_t n, const float* x, int64_t ldx, float cap, float* y, int64_t ldy) {
  const Vec c = splat(cap), inv = splat(1.0f / cap);
#pragma omp parallel for schedule(static) if (parallel_worth_it(rows * n))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* yr = y + r * ldy;
    for_each_vector(n, [&](int64_t i, int k) { store_n(yr + i, c * tanh(load_n(xr + i, k) * inv), k); });
  }
}

// 1 − tanh²(u) = 4e / (1 + e)² with e = e^(−2|u|): no cancellation near |tanh| = 1.
void softcap_backward(int64_t rows, int64_t n, const float* x, int64_t ldx, float cap, float* dy, int64_t lddy) {
  const Vec inv = splat(1.0f / cap);
#pragma omp parallel for schedule(static) if (parallel_worth_it(rows * n))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    float* dr = dy + r * lddy;
    for_each_vector(n, [&](int64_t i, int k) {
      const Vec u = load_n(xr + i, k) * inv, e = exp(splat(-2.0f) * max(u, -u)), d = splat(1.0f) + e;
      store_n(dr + i, load_n(dr + i, k) * (splat(4.0f) * e / (d * d)), k);
    });
  }
}

// Each head of row r: (x1, x2) ← (x1·cos − x2·sin, x2·cos + x1·sin) over the first rotary_dim
// dimensions, cos and sin from the table's row positions[r] (sin negated for the backward).
void rope(int64_t rows, int64_t heads, int64_t head_dim, int64_t rotary_dim, float* x, int64_t ldx,
          const int64_t* positions, const float* table, bool backward) {
  const int64_t half = rotary_dim / 2;
  const Vec sign = splat(backward ? -1.0f : 1.0f);
#pragma omp parallel for schedule(static) if (parallel_worth_it(rows * heads * rotary_dim))
  for (int64_t r = 0; r < rows; ++r) {
    const float* cs = table + positions[r] * rotary_dim;
    for (int64_t h = 0; h < heads; ++h) {
      float* x1 = x + r * ldx + h * head_dim;
      float* x2 = x1 + half;
      for_each_vector(half, [&](int64_t i, int n) {
        const Vec a = load_n(x1 + i, n), b = load_n(x2 + i, n);
        const Vec c = load_n(cs + i, n), s = load_n(cs + half + i, n) * sign;
        store_n(x1 + i, a * c - b * s, n);
        store_n(x2 + i, b * c + a * s, n);
      });
    }
  }
}

// Each row in place: logits -> (softmax − onehot(target))·scale, loss[r] = logsumexp − logit[target]
// (float64). The exponentials are summed in float vectors over stretches of kSumChunk and the
// stretches in float64, so a 50,257-wide row loses nothing to the long sum. Rows are independent.
void softmax_cross_entropy(int64_t rows, int64_t V, float* logits, int64_t ld, const int32_t* targets, float scale,
                           double* loss) {
  constexpr int64_t kSumChunk = 512;
  const int64_t full = V / kLanes * kLanes;
  const int rest = static_cast<int>(V - full);
#pragma omp parallel for schedule(static) if (parallel_worth_it(rows * V))
  for (int64_t r = 0; r < rows; ++r) {
    float* x = logits + r * ld;
    const int32_t t = targets[r];
    if (t < 0) {
      std::fill(x, x + V, 0.0f);
      loss[r] = 0.0;
      continue;
    }
    Vec mx = splat(-INFINITY);
    for (int64_t i = 0; i < full; i += kLanes) mx = max(mx, load(x + i));
    if (rest) mx = max(mx, load_partial(x + full, rest, -INFINITY));
    const float m = reduce_max(mx);
    double sum = 0.0;
    for (int64_t c0 = 0; c0 < V; c0 += kSumChunk) {
      const int64_t c_end = std::min(V, c0 + kSumChunk);
      Vec acc = splat(0.0f);
      int64_t i = c0;
      for (; i + kLanes <= c_end; i += kLanes) acc += exp(load(x + i) - splat(m));
      if (i < c_end) acc += exp(load_partial(x + i, static_cast<int>(c_end - i), -INFINITY) - splat(m));
      sum += reduce_sum(acc);
    }
    const double lse = m + std::log(sum);
    loss[r] = lse - x[t];
    const Vec shift = splat(static_cast<float>(lse)), s = splat(scale);
    for (int64_t i = 0; i < full; i += kLanes) store(x + i, exp(load(x + i) - shift) * s);
    if (rest) store_partial(x + full, exp(load_partial(x + full, rest, 0.0f) - shift) * s, rest);
    x[t] -= scale;
  }
}

// AdamW, element by element (see mhsa::AdamW): m, v the moments, bias corrections 1/(1 − β^t)
// given as inv_c1 and inv_c2, decoupled decay w −= decay·w.
void adamw(int64_t n, float* w, const float* g, float* m, float* v, float lr, float decay, float beta1, float beta2,
           float inv_c1, float inv_c2, float eps) {
  const auto update = [&](Vec wv, Vec gv, Vec& mv, Vec& vv) {
    mv = fma(splat(beta1), mv, splat(1.0f - beta1) * gv);
    vv = fma(splat(beta2), vv, splat(1.0f - beta2) * gv * gv);
    const Vec denom = sqrt(vv * splat(inv_c2)) + splat(eps);
    return wv - splat(decay) * wv - splat(lr) * (mv * splat(inv_c1)) / denom;
  };
  const int64_t full = n / kLanes * kLanes;
#pragma omp parallel for schedule(static) if (parallel_worth_it(n))
  for (int64_t i = 0; i < full; i += kLanes) {
    Vec mv = load(m + i), vv = load(v + i);
    store(w + i, update(load(w + i), load(g + i), mv, vv));
    store(m + i, mv);
    store(v + i, vv);
  }
  if (full < n) {
    const int rest = static_cast<int>(n - full);
    Vec mv = load_partial(m + full, rest, 0.0f), vv = load_partial(v + full, rest, 0.0f);
    store_partial(w + full, update(load_partial(w + full, rest, 0.0f), load_partial(g + full, rest, 0.0f), mv, vv),
                  rest);
    store_partial(m + full, mv, rest);
    store_partial(v + full, vv, rest);
  }
}

}  // namespace mhsa::kernels::MHSA_ISA
