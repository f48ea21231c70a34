// nn/linear.h — the linear layer y = x·W (+ b) as a forward/backward pair, for weights stored
// either way: [in, out] (GPT-2's Conv1D layout) or [out, in] (torch.nn.Linear's, every other
// family), read in place (the transposed operand is handled by the GEMM's packing or by the
// small-M stream, never copied). Weight gradients are accumulated by the GEMM itself (no
// temporary product). Also the older helpers MultiHeadAttention's backward uses. Not public.
#pragma once

#include <cstdint>
#include <span>

#include "mhsa/tensor.h"
#include "nn/half_matrix.h"
#include "nn/q4_matrix.h"
#include "nn/q8_matrix.h"

namespace mhsa::nn {

// W stored [in, out] (Conv1D) or [out, in] (nn.Linear); in_out_blocked: [in, out] stored blocked
// (kernels/gemm.h, block_b; the tensor keeps the shape [in, out]) for an inference model's decode
// steps, bit for bit in_out's results, no backward.
enum class Layout { in_out, out_in, in_out_blocked };

// y [rows, out] (ldy) = x [rows, in] (ldx) · W + b   (b may be null; W's layout as given)
void linear_forward(int64_t rows, const float* x, int64_t ldx, const Tensor& w, Layout layout, const float* b,
                    float* y, int64_t ldy);
// The same with W [out, in] kept as bfloat16 (widened in the kernels, float32 sums).
void linear_forward(int64_t rows, const float* x, int64_t ldx, const HalfMatrix& w, const float* b, float* y,
                    int64_t ldy);
// The same with W [out, in] kept as Q8_0 blocks (float32 sums; see kernels/dispatch.h).
void linear_forward(int64_t rows, const float* x, int64_t ldx, const Q8Matrix& w, const float* b, float* y,
                    int64_t ldy);
// The same with W [out, in] kept as Q4_K blocks.
void linear_forward(int64_t rows, const float* x, int64_t ldx, const Q4Matrix& w, const float* b, float* y,
                    int64_t ldy);
// One output of linear_forward_many: y [rows, out] (ldy) = x · W + b, W the float w (in its
// layout) or, when w16, w8 or w4 is set, that bfloat16, Q8_0 or Q4_K matrix.
struct LinearOut {
  const Tensor* w;
  Layout layout;
  const float* b;  // may be null
  float* y;
  int64_t ldy;
  const HalfMatrix* w16 = nullptr;
  const Q8Matrix* w8 = nullptr;
  const Q4Matrix* w4 = nullptr;
};
// Several linears of the same x [rows, in] (q, k, v; gate, up): for a few rows and [out, in]
// weights one stream over all of them (one pass, the threads splitting their rows evenly), else
// linear_forward each (all float, all bfloat16, all Q8_0 or all Q4_K). The bits are linear_forward's either way.
void linear_forward_many(int64_t rows, const float* x, int64_t ldx, std::span<const LinearOut> outs);

// From dy [rows, out] (ldy) and the forward's x [rows, in] (ldx): dw += ∂/∂W (when dw),
// db += Σ_rows dy in float64 (when db), and dx [rows, in] (lddx) = dy·Wᵀ, or += with accumulate
// (when dx).
void linear_backward(int64_t rows, const float* x, int64_t ldx, const float* dy, int64_t ldy, const Tensor& w,
                     Layout layout, Tensor* dw, float* db, float* dx, int64_t lddx, bool accumulate);

// The same with the forward's W [out, in] kept as bfloat16 (training's bf16 copy of float32 master
// weights): dx = dy·W reads w16 (widened while packed, kernels' gemm_bf16); dw (the master's shape,
// in its `layout`) and db come from x and dy alone, as above. Bitwise the float linear_backward on
// the widened weights when rows > 16 (or accumulate): the GEMMs' chains are the same.
void linear_backward(int64_t rows, const float* x, int64_t ldx, const float* dy, int64_t ldy, const HalfMatrix& w16,
                     Layout layout, Tensor* dw, float* db, float* dx, int64_t lddx, bool accumulate);

// dst[cols, rows] = src[rows, cols] (src rows lds apart)
Tensor transposed(const float* src, int64_t rows, int64_t cols, int64_t lds);

// grad[:, col : col + n] += aᵀ · g  with a [M, K], g [M, n] (rows of both M apart by K and n);
// bias_grad[col : col + n] += Σ_rows g (when defined), summed in float64.
void add_weight_grads(const float* a, int64_t M, int64_t K, const float* g, int64_t n, Tensor& grad, int64_t col,
                      Tensor& bias_grad);

// g [B, T, n] · w[:, col : col + n]ᵀ  ->  [B, T, K]   (w is [K, width])
Tensor times_transposed(const float* g, int64_t B, int64_t T, int64_t n, const Tensor& w, int64_t col);

}  // namespace mhsa::nn
