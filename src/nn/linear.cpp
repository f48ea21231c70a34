// nn/linear.cpp — see linear.h.
#include "nn/linear.h"

#include <vector>

#include "kernels/dispatch.h"

namespace mhsa::nn {

// dst[cols, rows] = src[rows, cols] (lds apart)
Tensor transposed(const float* src, int64_t rows, int64_t cols, int64_t lds) {
  Tensor t({cols, rows});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t.data()[c * rows + r] = src[r * lds + c];
  return t;
}

// grad[:, col : col + n] += aᵀ · g  with a [M, K], g [M, n] (rows of both M apart by K and n);
// bias_grad[col : col + n] += Σ_rows g (when defined).
void add_weight_grads(const float* a, int64_t M, int64_t K, const float* g, int64_t n, Tensor& grad, int64_t col,
                      Tensor& bias_grad) {
  const Tensor at = transposed(a, M, K, K);  // [K, M]
  Tensor prod({K, n});
  kernels::kernels().gemm(K, n, M, at.data(), M, g, n, nullptr, prod.data(), n);
  const int64_t width = grad.dim(1);
  for (int64_t r = 0; r < K; ++r)
    for (int64_t c = 0; c < n; ++c) grad.data()[r * width + col + c] += prod.data()[r * n + c];
  if (bias_grad.defined()) {  // summed apart in float64 (O(M·n), exact enough), then added once
    std::vector<double> sum(static_cast<size_t>(n), 0.0);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t c = 0; c < n; ++c) sum[c] += g[m * n + c];
    for (int64_t c = 0; c < n; ++c) bias_grad.data()[col + c] += static_cast<float>(sum[c]);
  }
}

// g [B, T, n] · w[:, col : col + n]ᵀ  ->  [B, T, K]   (w is [K, width])
Tensor times_transposed(const float* g, int64_t B, int64_t T, int64_t n, const Tensor& w, int64_t col) {
  const int64_t K = w.dim(0);
  const Tensor wt = transposed(w.data() + col, K, n, w.dim(1));  // [n, K]
  Tensor out({B, T, K});
  kernels::kernels().gemm(B * T, K, n, g, n, wt.data(), K, nullptr, out.data(), K);
  return out;
}

}  // namespace mhsa::nn
