// nn/linear.cpp — see linear.h. Every product is the library's GEMM (gemm for the plain
// forward, gemm_ex for transposed operands and accumulation, matmul_bt streaming an [out, in]
// weight for a few rows; their _bf16 and _q8_0 forms for 16-bit and 8-bit weights).
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

namespace {

constexpr int64_t kStreamRows = 8;  // up to here an [out, in] weight is streamed (decoding)

void add_bias(int64_t rows, int64_t out, const float* b, float* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < out; ++c) y[r * ldy + c] += b[c];
}

}  // namespace

void linear_forward(int64_t rows, const float* x, int64_t ldx, const Tensor& w, Layout layout, const float* b,
                    float* y, int64_t ldy) {
  const kernels::KernelTable& k = kernels::kernels();
  if (layout == Layout::in_out) return k.gemm(rows, w.dim(1), w.dim(0), x, ldx, w.data(), w.dim(1), b, y, ldy);
  if (layout == Layout::in_out_blocked) return k.gemm_blocked(rows, w.dim(1), w.dim(0), x, ldx, w.data(), b, y, ldy);
  const int64_t out = w.dim(0), in = w.dim(1);
  if (rows <= kStreamRows)
    k.matmul_bt(rows, out, in, x, ldx, w.data(), in, y, ldy);
  else
    k.gemm_ex(rows, out, in, x, ldx, /*trans_a=*/false, w.data(), in, /*trans_b=*/true, y, ldy, /*accumulate=*/false);
  if (b) add_bias(rows, out, b, y, ldy);
}

void linear_forward(int64_t rows, const float* x, int64_t ldx, const HalfMatrix& w, const float* b, float* y,
                    int64_t ldy) {
  const kernels::KernelTable& k = kernels::kernels();
  const bool f16 = w.format == HalfFormat::f16;
  if (rows <= kStreamRows && f16)
    k.matmul_bt_f16(rows, w.rows, w.cols, x, ldx, w.f16(), w.cols, y, ldy);
  else if (rows <= kStreamRows)
    k.matmul_bt_bf16(rows, w.rows, w.cols, x, ldx, w.data.data(), w.cols, y, ldy);
  else if (f16)
    k.gemm_bt_f16(rows, w.rows, w.cols, x, ldx, w.f16(), w.cols, y, ldy);
  else
    k.gemm_bt_bf16_many()(rows, w.rows, w.cols, x, ldx, w.data.data(), w.cols, y, ldy);
  if (b) add_bias(rows, w.rows, b, y, ldy);
}

void linear_forward(int64_t rows, const float* x, int64_t ldx, const Q8Matrix& w, const float* b, float* y,
                    int64_t ldy) {
  const kernels::KernelTable& k = kernels::kernels();
  if (rows <= kStreamRows)
    k.matmul_bt_q8_0(rows, w.rows, w.cols, x, ldx, w.data.data(), w.blocks_per_row(), y, ldy);
  else
    k.gemm_bt_q8_0(rows, w.rows, w.cols, x, ldx, w.data.data(), w.blocks_per_row(), y, ldy);
  if (b) add_bias(rows, w.rows, b, y, ldy);
}

void linear_forward(int64_t rows, const float* x, int64_t ldx, const Q4Matrix& w, const float* b, float* y,
                    int64_t ldy) {
  const kernels::KernelTable& k = kernels::kernels();
  if (rows <= kStreamRows)
    k.matmul_bt_q4_k(rows, w.rows, w.cols, x, ldx, w.data.data(), w.blocks_per_row(), y, ldy);
  else
    k.gemm_bt_q4_k(rows, w.rows, w.cols, x, ldx, w.data.data(), w.blocks_per_row(), y, ldy);
  if (b) add_bias(rows, w.rows, b, y, ldy);
}

void linear_forward_many(int64_t rows, const float* x, int64_t ldx, std::span<const LinearOut> outs) {
  constexpr size_t kMaxParts = 4;
  const bool few = rows <= kStreamRows && outs.size() <= kMaxParts;
  if (few && std::all_of(outs.begin(), outs.end(), [&](const LinearOut& o) {
        return o.w16 && o.w16->cols == outs[0].w16->cols && o.w16->format == outs[0].w16->format;
      })) {
    // One stream in the matrices' format: parts of `Part`, their elements from `elems`.
    const auto stream = [&](auto part, auto elems, auto product) {
      decltype(part) parts[kMaxParts];
      for (size_t i = 0; i < outs.size(); ++i) {
        const HalfMatrix& w = *outs[i].w16;
        parts[i] = {elems(w), w.cols, w.rows, outs[i].y, outs[i].ldy};
      }
      (kernels::kernels().*product)(rows, outs[0].w16->cols, x, ldx, parts, static_cast<int>(outs.size()));
    };
    if (outs[0].w16->format == HalfFormat::f16)
      stream(kernels::BtPartF16{}, [](const HalfMatrix& w) { return w.f16(); }, &kernels::KernelTable::matmul_bt_parts_f16);
    else
      stream(kernels::BtPart16{}, [](const HalfMatrix& w) { return w.data.data(); },
             &kernels::KernelTable::matmul_bt_parts_bf16);
    for (const LinearOut& o : outs)
      if (o.b) add_bias(rows, o.w16->rows, o.b, o.y, o.ldy);
    return;
  }
  if (few && std::all_of(outs.begin(), outs.end(), [&](const LinearOut& o) {
        return o.w8 && o.w8->cols == outs[0].w8->cols;
      })) {
    kernels::BtPartQ8 parts[kMaxParts];
    for (size_t i = 0; i < outs.size(); ++i) {
      const Q8Matrix& w = *outs[i].w8;
      parts[i] = {w.data.data(), w.blocks_per_row(), w.rows, outs[i].y, outs[i].ldy};
    }
    kernels::kernels().matmul_bt_parts_q8_0(rows, outs[0].w8->cols, x, ldx, parts, static_cast<int>(outs.size()));
    for (const LinearOut& o : outs)
      if (o.b) add_bias(rows, o.w8->rows, o.b, o.y, o.ldy);
    return;
  }
  if (few && std::all_of(outs.begin(), outs.end(), [&](const LinearOut& o) {
        return o.w4 && o.w4->cols == outs[0].w4->cols;
      })) {
    kernels::BtPartQ4K parts[kMaxParts];
    for (size_t i = 0; i < outs.size(); ++i) {
      const Q4Matrix& w = *outs[i].w4;
      parts[i] = {w.data.data(), w.blocks_per_row(), w.rows, outs[i].y, outs[i].ldy};
    }
    kernels::kernels().matmul_bt_parts_q4_k(rows, outs[0].w4->cols, x, ldx, parts, static_cast<int>(outs.size()));
    for (const LinearOut& o : outs)
      if (o.b) add_bias(rows, o.w4->rows, o.b, o.y, o.ldy);
    return;
  }
  const bool stream = few && std::all_of(outs.begin(), outs.end(), [&](const LinearOut& o) {
                        return !o.w16 && !o.w8 && !o.w4 && o.layout == Layout::out_in && o.w->dim(1) == outs[0].w->dim(1);
                      });
  if (!stream) {
    for (const LinearOut& o : outs) {
      if (o.w16)
        linear_forward(rows, x, ldx, *o.w16, o.b, o.y, o.ldy);
      else if (o.w8)
        linear_forward(rows, x, ldx, *o.w8, o.b, o.y, o.ldy);
      else if (o.w4)
        linear_forward(rows, x, ldx, *o.w4, o.b, o.y, o.ldy);
      else
        linear_forward(rows, x, ldx, *o.w, o.layout, o.b, o.y, o.ldy);
    }
    return;
  }
  kernels::BtPart parts[kMaxParts];
  for (size_t i = 0; i < outs.size(); ++i) {
    const Tensor& w = *outs[i].w;
    parts[i] = {w.data(), w.dim(1), w.dim(0), outs[i].y, outs[i].ldy};
  }
  kernels::kernels().matmul_bt_parts(rows, outs[0].w->dim(1), x, ldx, parts, static_cast<int>(outs.size()));
  for (const LinearOut& o : outs)
    if (o.b) add_bias(rows, o.w->dim(0), o.b, o.y, o.ldy);
}

namespace {

// linear_backward's dw += ∂/∂W (W [in, out] or [out, in] as layout says) and db += Σ_rows dy.
void weight_grads(int64_t rows, int64_t in, int64_t out, const float* x, int64_t ldx, const float* dy, int64_t ldy,
                  Layout layout, Tensor* dw, float* db) {
  const kernels::KernelTable& k = kernels::kernels();
  const bool io = layout == Layout::in_out;
  if (dw) {
    if (io)  // dW [in, out] += xᵀ·dy
      k.gemm_ex(in, out, rows, x, ldx, /*trans_a=*/true, dy, ldy, /*trans_b=*/false, dw->data(), out, true);
    else     // dW [out, in] += dyᵀ·x
      k.gemm_ex(out, in, rows, dy, ldy, /*trans_a=*/true, x, ldx, /*trans_b=*/false, dw->data(), in, true);
  }
  if (db) {  // summed apart in float64 (O(rows·out), exact enough), then added once
    std::vector<double> sum(static_cast<size_t>(out), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < out; ++c) sum[static_cast<size_t>(c)] += dy[r * ldy + c];
    for (int64_t c = 0; c < out; ++c) db[c] += static_cast<float>(sum[static_cast<size_t>(c)]);
  }
}

}  // namespace

void linear_backward(int64_t rows, const float* x, int64_t ldx, const float* dy, int64_t ldy, const Tensor& w,
                     Layout layout, Tensor* dw, float* db, float* dx, int64_t lddx, bool accumulate) {
  if (layout == Layout::in_out_blocked)  // callers refuse to train a model blocked for inference
    throw Error("linear_backward: layout: expected weights [in, out] or [out, in], got weights blocked for inference");
  const bool io = layout == Layout::in_out;
  const int64_t in = io ? w.dim(0) : w.dim(1), out = io ? w.dim(1) : w.dim(0);
  weight_grads(rows, in, out, x, ldx, dy, ldy, layout, dw, db);
  if (dx)  // dx = dy·Wᵀ: W [in, out] read transposed, W [out, in] as it is
    kernels::kernels().gemm_ex(rows, in, out, dy, ldy, /*trans_a=*/false, w.data(), io ? out : in, /*trans_b=*/io, dx,
                               lddx, accumulate);
}

void linear_backward(int64_t rows, const float* x, int64_t ldx, const float* dy, int64_t ldy, const HalfMatrix& w16,
                     Layout layout, Tensor* dw, float* db, float* dx, int64_t lddx, bool accumulate) {
  if (w16.format != HalfFormat::bf16)
    throw Error("linear_backward: w16: expected a bfloat16 copy of float32 weights, got a float16 matrix");
  const int64_t in = w16.cols, out = w16.rows;
  weight_grads(rows, in, out, x, ldx, dy, ldy, layout, dw, db);
  if (dx)  // dx [rows, in] = dy [rows, out] · W [out, in]
    kernels::kernels().gemm_bf16(rows, in, out, dy, ldy, w16.data.data(), in, dx, lddx, accumulate);
}

}  // namespace mhsa::nn
