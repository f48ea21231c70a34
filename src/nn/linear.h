// nn/linear.h — the products behind a linear layer's backward, shared by MultiHeadAttention and
// the GPT trainer: weights are [in, out] (GPT-2's Conv1D layout), activations rows of [M, in].
// The transposed operands are read in place by gemm_ex's packing, and weight gradients are
// accumulated by the GEMM itself (no temporary product). Not public.
#pragma once

#include <cstdint>

#include "mhsa/tensor.h"

namespace mhsa::nn {

// dst[cols, rows] = src[rows, cols] (src rows lds apart)
Tensor transposed(const float* src, int64_t rows, int64_t cols, int64_t lds);

// grad[:, col : col + n] += aᵀ · g  with a [M, K], g [M, n] (rows of both M apart by K and n);
// bias_grad[col : col + n] += Σ_rows g (when defined), summed in float64.
void add_weight_grads(const float* a, int64_t M, int64_t K, const float* g, int64_t n, Tensor& grad, int64_t col,
                      Tensor& bias_grad);

// g [B, T, n] · w[:, col : col + n]ᵀ  ->  [B, T, K]   (w is [K, width])
Tensor times_transposed(const float* g, int64_t B, int64_t T, int64_t n, const Tensor& w, int64_t col);

}  // namespace mhsa::nn
