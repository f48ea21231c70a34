// kernels/elementwise_ref.cpp — the float64 row kernels: the oracles of kernels/elementwise.cpp
// (see elementwise.h). Plain scalar loops, written for clarity, never for speed.
#include <algorithm>
#include <cmath>
#include <vector>

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

void layer_norm_backward_ref(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* gamma, float eps,
                             const float* dy, int64_t lddy, float* dx, int64_t lddx, float* dgamma, float* dbeta) {
  std::vector<double> sg(static_cast<size_t>(C), 0.0), sb(static_cast<size_t>(C), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * ldx, *dyr = dy + r * lddy;
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += xr[c];
    mean /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(C) + eps);
    double a = 0, b = 0;  // means of dx̂ and of dx̂·x̂
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (xr[c] - mean) * rstd, g = double(dyr[c]) * gamma[c];
      a += g;
      b += g * xhat;
      sg[static_cast<size_t>(c)] += double(dyr[c]) * xhat;
      sb[static_cast<size_t>(c)] += dyr[c];
    }
    a /= static_cast<double>(C);
    b /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (xr[c] - mean) * rstd, g = double(dyr[c]) * gamma[c];
      dx[r * lddx + c] = static_cast<float>(dx[r * lddx + c] + rstd * (g - a - xhat * b));
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    if (dgamma) dgamma[c] = static_cast<float>(dgamma[c] + sg[static_cast<size_t>(c)]);
    if (dbeta) dbeta[c] = static_cast<float>(dbeta[c] + sb[static_cast<size_t>(c)]);
  }
}

void rms_norm_ref(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* w, float offset, float eps,
                  float* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * ldx;
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += double(xr[c]) * xr[c];
    const double rstd = 1.0 / std::sqrt(ms / static_cast<double>(C) + eps);
    float* yr = y + r * ldy;
    for (int64_t c = 0; c < C; ++c) yr[c] = static_cast<float>(xr[c] * rstd * (double(w[c]) + offset));
  }
}

void rms_norm_backward_ref(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* w, float offset,
                           float eps, const float* dy, int64_t lddy, float* dx, int64_t lddx, float* dw) {
  std::vector<double> sw(static_cast<size_t>(C), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * ldx, *dyr = dy + r * lddy;
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += double(xr[c]) * xr[c];
    const double rstd = 1.0 / std::sqrt(ms / static_cast<double>(C) + eps);
    double b = 0;  // mean of dx̂·x̂
    for (int64_t c = 0; c < C; ++c) {
      b += double(dyr[c]) * (double(w[c]) + offset) * xr[c] * rstd;
      sw[static_cast<size_t>(c)] += double(dyr[c]) * xr[c] * rstd;
    }
    b /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const double g = double(dyr[c]) * (double(w[c]) + offset);
      dx[r * lddx + c] = static_cast<float>(dx[r * lddx + c] + rstd * (g - xr[c] * rstd * b));
    }
  }
  if (dw)
    for (int64_t c = 0; c < C; ++c) dw[c] = static_cast<float>(dw[c] + sw[static_cast<size_t>(c)]);
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

namespace {

// act(g) and act'(g) in float64 (see glu_ref).
void glu_act_ref(GluKind kind, double g, double& value, double& slope) {
  if (kind == GluKind::swiglu) {
    const double s = 1.0 / (1.0 + std::exp(-g));
    value = g * s;
    slope = s * (1.0 + g * (1.0 - s));
  } else {
    const double k = std::sqrt(2.0 / M_PI), t = std::tanh(k * (g + 0.044715 * g * g * g));
    value = 0.5 * g * (1.0 + t);
    slope = 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * g * g);
  }
}

}  // namespace

void glu_ref(GluKind kind, int64_t rows, int64_t F, const float* gate, int64_t ldg, const float* up, int64_t ldu,
             float* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < F; ++c) {
      double value, slope;
      glu_act_ref(kind, gate[r * ldg + c], value, slope);
      out[r * ldo + c] = static_cast<float>(value * up[r * ldu + c]);
    }
}

void glu_backward_ref(GluKind kind, int64_t rows, int64_t F, const float* gate, int64_t ldg, const float* up,
                      int64_t ldu, const float* dout, int64_t lddo, float* dgate, int64_t lddg, float* dup,
                      int64_t lddu) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < F; ++c) {
      double value, slope;
      glu_act_ref(kind, gate[r * ldg + c], value, slope);
      const double d = dout[r * lddo + c], u = up[r * ldu + c];
      dgate[r * lddg + c] = static_cast<float>(d * u * slope);
      dup[r * lddu + c] = static_cast<float>(d * value);
    }
}

void softcap_ref(int64_t rows, int64_t n, const float* x, int64_t ldx, float cap, float* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) y[r * ldy + i] = static_cast<float>(cap * std::tanh(double(x[r * ldx + i]) / cap));
}

void softcap_backward_ref(int64_t rows, int64_t n, const float* x, int64_t ldx, float cap, float* dy, int64_t lddy) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const double sech = 1.0 / std::cosh(double(x[r * ldx + i]) / cap);  // 1 − tanh² without cancellation
      dy[r * lddy + i] = static_cast<float>(dy[r * lddy + i] * sech * sech);
    }
}

void rope_ref(int64_t rows, int64_t heads, int64_t head_dim, int64_t rotary_dim, float* x, int64_t ldx,
              const int64_t* positions, const float* table, bool backward) {
  const int64_t half = rotary_dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* cs = table + positions[r] * rotary_dim;
    for (int64_t h = 0; h < heads; ++h) {
      float* xh = x + r * ldx + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const double a = xh[i], b = xh[i + half], c = cs[i], s = backward ? -double(cs[half + i]) : cs[half + i];
        xh[i] = static_cast<float>(a * c - b * s);
        xh[i + half] = static_cast<float>(b * c + a * s);
      }
    }
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
