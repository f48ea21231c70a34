// kernels/elementwise.cpp — LayerNorm and GELU, compiled once per ISA (see elementwise.h for
// the definitions and the float64 twins). Both are memory-bound row passes; the point is only
// to keep them off the critical path: vector exp instead of libm tanh (GELU runs on 4·C values
// per token, and std::tanh alone would cost as much as a quarter of a prefill).
#include <omp.h>

#include <algorithm>
#include <cmath>

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
