// nn/linear.cpp — see linear.h.
#include "nn/linear.h"

#include <algorithm>
#include <vector>

#include "kernels/dispatch.h"

namespace mhsa::nn {

// dst[cols, rows] = src[rows, cols] (lds apart), in 32 × 32 tiles so that both sides move whole
// cache lines.
Tensor transposed(const float* src, int64_t rows, int64_t cols, int64_t lds) {
  constexpr int64_t kTile = 32;
  Tensor t({cols, rows});
  float* dst = t.data();
#pragma omp parallel for collapse(2) schedule(static) if (rows * cols >= (1 << 18))
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r_end = std::min(rows, r0 + kTile), c_end = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c_end; ++c)
        for (int64_t r = r0; r < r_end; ++r) dst[c * rows + r] = src[r * lds + c];
    }
  return t;
}

// grad[:, col : col + n] += aᵀ · g  with a [M, K], g [M, n] (rows of both M apart by K and n);
// bias_grad[col : col + n] += Σ_rows g (when defined).
void add_weight_grads(const float* a, int64_t M, int64_t K, const float* g, int64_t n, Tensor& grad, int64_t col,
                      Tensor& bias_grad) {
  kernels::kernels().gemm_ex(K, n, M, a, K, /*trans_a=*/true, g, n, /*trans_b=*/false, grad.data() + col, grad.dim(1),
                             /*accumulate=*/true);
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
  Tensor out({B, T, K});
  kernels::kernels().gemm_ex(B * T, K, n, g, n, /*trans_a=*/false, w.data() + col, w.dim(1), /*trans_b=*/true,
                             out.data(), K, /*accumulate=*/false);
  return out;
}

}  // namespace mhsa::nn
