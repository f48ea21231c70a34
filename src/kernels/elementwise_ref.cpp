// kernels/elementwise_ref.cpp — float64 LayerNorm and GELU: the oracles (see elementwise.h).
#include <algorithm>
#include <cmath>

#include "kernels/elementwise.h"

namespace mhsa::kernels {

void layer_norm_ref(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* gamma, const float* beta,
                    float eps, float* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += xr[c];
    mean /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(C) + eps);
    float* yr = y + r * ldy;
    for (int64_t c = 0; c < C; ++c) yr[c] = static_cast<float>((xr[c] - mean) * rstd * gamma[c] + beta[c]);
  }
}

void gelu_tanh_ref(int64_t n, float* x) {
  const double k = std::sqrt(2.0 / M_PI);
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    x[i] = static_cast<float>(0.5 * v * (1.0 + std::tanh(k * (v + 0.044715 * v * v * v))));
  }
}

void gelu_tanh_backward_ref(int64_t n, const float* z, const float* du, float* dz) {
  const double k = std::sqrt(2.0 / M_PI);
  for (int64_t i = 0; i < n; ++i) {
    const double v = z[i], t = std::tanh(k * (v + 0.044715 * v * v * v));
    const double d = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * v * v);
    dz[i] = static_cast<float>(du[i] * d);
  }
}

void softmax_cross_entropy_ref(int64_t rows, int64_t V, float* logits, int64_t ld, const int32_t* targets,
                               float scale, double* loss) {
  for (int64_t r = 0; r < rows; ++r) {
    float* x = logits + r * ld;
    const int32_t t = targets[r];
    if (t < 0) {
      std::fill(x, x + V, 0.0f);
      loss[r] = 0.0;
      continue;
    }
    double m = -INFINITY, sum = 0.0;
    for (int64_t i = 0; i < V; ++i) m = std::max(m, double(x[i]));
    for (int64_t i = 0; i < V; ++i) sum += std::exp(x[i] - m);
    const double lse = m + std::log(sum);
    loss[r] = lse - x[t];
    for (int64_t i = 0; i < V; ++i) x[i] = static_cast<float>(std::exp(x[i] - lse) * scale - (i == t ? scale : 0.0));
  }
}

void adamw_ref(int64_t n, float* w, const float* g, float* m, float* v, float lr, float decay, float beta1,
               float beta2, float inv_c1, float inv_c2, float eps) {
  for (int64_t i = 0; i < n; ++i) {
    const double mi = double(beta1) * m[i] + (1.0 - beta1) * double(g[i]);
    const double vi = double(beta2) * v[i] + (1.0 - beta2) * double(g[i]) * g[i];
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    w[i] = static_cast<float>(w[i] - double(decay) * w[i] - lr * (mi * inv_c1) / (std::sqrt(vi * inv_c2) + eps));
  }
}

}  // namespace mhsa::kernels
