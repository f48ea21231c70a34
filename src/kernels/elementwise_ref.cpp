// kernels/elementwise_ref.cpp — float64 LayerNorm and GELU: the oracles (see elementwise.h).
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

}  // namespace mhsa::kernels
