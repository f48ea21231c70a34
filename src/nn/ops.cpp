// nn/ops.cpp — see ops.h. Every op runs on the per-ISA kernels (kernels/dispatch.h) but
// LayerNorm's backward, kept here as GPT-2's training has always computed it (bit for bit).
#include "nn/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/dispatch.h"
#include "kernels/half.h"
#include "mhsa/error.h"
#include "nn/linear.h"

namespace mhsa::nn {
namespace {

constexpr int64_t kLossRows = 256;   // rows of logits alive at once in lm_head_loss: kLossRows × V floats
// Up to kStreamRows rows the head is a stream over w (each row's logits the same bits for any
// row count: a batched serving step's sequences get what they get alone); beyond, a GEMM. At 16
// rows (a serving step of 16 sequences, GPT-2 124M, 1 thread) the stream took a step from 573 to
// 232 ms: the float GEMM path transposes all of w on every call.
constexpr int64_t kStreamRows = 64;
// Rows of a blocked head per gemm_blocked call: the in-place path's most (kernels/gemm.cpp), which
// reads w where it is; more rows would take the packed path, which copies all of w.
constexpr int64_t kHeadRows = 256;
constexpr int64_t kHeadChunk = 1024; // vocabulary rows per GEMM of a bfloat16 head (its packed B: 3 MiB at C = 768)

bool parallel_worth_it(int64_t elements) { return elements >= (int64_t{1} << 16); }

kernels::GluKind glu_kind(MlpKind k) { return k == MlpKind::swiglu ? kernels::GluKind::swiglu : kernels::GluKind::geglu; }

// LayerNorm's backward (see norm_backward).
void layer_norm_backward(int64_t rows, int64_t C, const float* x, const float* g, float eps, const float* dy,
                         float* dx, float* dg, float* db) {
  std::vector<double> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
#pragma omp parallel for schedule(static) if (parallel_worth_it(rows * C))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    double m = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) m += xr[c];
    m /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
    const double rs = 1.0 / std::sqrt(var / static_cast<double>(C) + eps);
    mean[static_cast<size_t>(r)] = m;
    rstd[static_cast<size_t>(r)] = rs;
    double a = 0, b = 0;  // mean of dx̂ and of dx̂·x̂
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (xr[c] - m) * rs, dxhat = double(dy[r * C + c]) * g[c];
      a += dxhat;
      b += dxhat * xhat;
    }
    a /= static_cast<double>(C);
    b /= static_cast<double>(C);
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (xr[c] - m) * rs, dxhat = double(dy[r * C + c]) * g[c];
      dx[r * C + c] += static_cast<float>(rs * (dxhat - a - xhat * b));
    }
  }
  std::vector<double> sg(static_cast<size_t>(C), 0.0), sb(static_cast<size_t>(C), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double m = mean[static_cast<size_t>(r)], rs = rstd[static_cast<size_t>(r)];
    for (int64_t c = 0; c < C; ++c) {
      sg[static_cast<size_t>(c)] += double(dy[r * C + c]) * (x[r * C + c] - m) * rs;
      sb[static_cast<size_t>(c)] += dy[r * C + c];
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    dg[c] += static_cast<float>(sg[static_cast<size_t>(c)]);
    if (db) db[c] += static_cast<float>(sb[static_cast<size_t>(c)]);
  }
}

}  // namespace

void add_into(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// ---- embedding -------------------------------------------------------------------------------

namespace {

// embedding_forward with row r of wte read as te(r)[0:C].
template <class Row>
void embed_rows(int64_t rows, int64_t T, int64_t pos0, const int32_t* ids, int64_t C, Row te, const Tensor* wpe,
                float scale, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const auto* e = te(ids[r]);
    float* o = out + r * C;
    if (wpe) {
      const float* pe = wpe->data() + (pos0 + r % T) * C;
      if (scale == 1.0f)
        for (int64_t c = 0; c < C; ++c) o[c] = kernels::widen(e[c]) + pe[c];
      else
        for (int64_t c = 0; c < C; ++c) o[c] = kernels::widen(e[c]) * scale + pe[c];
    } else {
      for (int64_t c = 0; c < C; ++c) o[c] = kernels::widen(e[c]) * scale;
    }
  }
}

// embed_rows with row r of wte written to a buffer by fill(r, row) (widened, dequantised, gathered).
template <class Fill>
void embed_filled_rows(int64_t rows, int64_t T, int64_t pos0, const int32_t* ids, int64_t C, Fill fill,
                       const Tensor* wpe, float scale, float* out) {
  std::vector<float> row(static_cast<size_t>(C));  // the row being read
  embed_rows(
      rows, T, pos0, ids, C,
      [&](int64_t i) {
        fill(i, row.data());
        return static_cast<const float*>(row.data());
      },
      wpe, scale, out);
}

}  // namespace

void embedding_forward(int64_t rows, int64_t T, int64_t pos0, const int32_t* ids, const Tensor& wte,
                       const Tensor* wpe, float scale, float* out) {
  const int64_t C = wte.dim(1);
  embed_rows(rows, T, pos0, ids, C, [&](int64_t i) { return wte.data() + i * C; }, wpe, scale, out);
}

void embedding_forward(int64_t rows, int64_t T, int64_t pos0, const int32_t* ids, const HalfMatrix& wte,
                       const Tensor* wpe, float scale, float* out) {
  if (wte.format == HalfFormat::bf16)
    return embed_rows(rows, T, pos0, ids, wte.cols, [&](int64_t i) { return wte.row(i); }, wpe, scale, out);
  embed_filled_rows(
      rows, T, pos0, ids, wte.cols,
      [&](int64_t i, float* row) { std::transform(wte.row(i), wte.row(i) + wte.cols, row, kernels::f16_to_float); },
      wpe, scale, out);
}

void embedding_forward(int64_t rows, int64_t T, int64_t pos0, const int32_t* ids, const Q8Matrix& wte,
                       const Tensor* wpe, float scale, float* out) {
  embed_filled_rows(
      rows, T, pos0, ids, wte.cols, [&](int64_t i, float* row) { kernels::dequantize_row_q8_0(wte.row(i), wte.cols, row); },
      wpe, scale, out);
}

void embedding_forward(int64_t rows, int64_t T, int64_t pos0, const int32_t* ids, const Q4Matrix& wte,
                       const Tensor* wpe, float scale, float* out) {
  embed_filled_rows(
      rows, T, pos0, ids, wte.cols,
      [&](int64_t i, float* row) { kernels::dequantize_row_q4_k_interleaved(wte.row(i), wte.cols, row); }, wpe, scale,
      out);
}

void embedding_forward(int64_t rows, int64_t T, int64_t pos0, const int32_t* ids, const BlockedMatrix& wte,
                       const Tensor* wpe, float scale, float* out) {
  embed_filled_rows(rows, T, pos0, ids, wte.cols, [&](int64_t i, float* row) { wte.row(i, row); }, wpe, scale, out);
}

void embedding_backward(int64_t rows, int64_t T, const int32_t* ids, const float* dout, float scale, Tensor& dwte,
                        Tensor* dwpe, int32_t padding_row) {
  const int64_t C = dwte.dim(1);
  for (int64_t r = 0; r < rows; ++r) {  // rows in order: the same sums for any thread count
    const float* d = dout + r * C;
    if (dwpe) add_into(dwpe->data() + (r % T) * C, d, C);
    if (ids[r] == padding_row) continue;
    float* g = dwte.data() + ids[r] * C;
    if (scale == 1.0f)
      add_into(g, d, C);
    else
      for (int64_t c = 0; c < C; ++c) g[c] += scale * d[c];
  }
}

// ---- norms -----------------------------------------------------------------------------------

void norm_forward(const NormSpec& s, int64_t rows, int64_t C, const float* x, int64_t ldx, const float* w,
                  const float* b, float* y, int64_t ldy) {
  const kernels::KernelTable& k = kernels::kernels();
  if (s.kind == NormKind::layer_norm) return k.layer_norm(rows, C, x, ldx, w, b, s.eps, y, ldy);
  k.rms_norm(rows, C, x, ldx, w, s.offset, s.eps, y, ldy);
}

void norm_backward(const NormSpec& s, int64_t rows, int64_t C, const float* x, const float* w, const float* dy,
                   float* dx, float* dw, float* db) {
  if (s.kind == NormKind::layer_norm) return layer_norm_backward(rows, C, x, w, s.eps, dy, dx, dw, db);
  kernels::kernels().rms_norm_backward(rows, C, x, C, w, s.offset, s.eps, dy, C, dx, C, dw);
}

// ---- activations -----------------------------------------------------------------------------

void gelu_forward(int64_t n, float* z) { kernels::kernels().gelu_tanh(n, z); }

void gelu_backward(int64_t n, const float* z, const float* du, float* dz) {
  kernels::kernels().gelu_tanh_backward(n, z, du, dz);
}

void gated_forward(MlpKind kind, int64_t rows, int64_t F, const float* gate, const float* up, float* a) {
  kernels::kernels().glu(glu_kind(kind), rows, F, gate, F, up, F, a, F);
}

void gated_backward(MlpKind kind, int64_t rows, int64_t F, const float* gate, const float* up, const float* da,
                    float* dgate, float* dup) {
  kernels::kernels().glu_backward(glu_kind(kind), rows, F, gate, F, up, F, da, F, dgate, F, dup, F);
}

void softcap_forward(int64_t rows, int64_t n, float cap, float* x) {
  kernels::kernels().softcap(rows, n, x, n, cap, x, n);
}

void softcap_backward(int64_t rows, int64_t n, float cap, const float* x, float* dx) {
  kernels::kernels().softcap_backward(rows, n, x, n, cap, dx, n);
}

// ---- the LM head -----------------------------------------------------------------------------

void lm_head_forward(int64_t rows, const float* h, int64_t ldh, const Tensor& w, float softcap, float* logits) {
  const kernels::KernelTable& k = kernels::kernels();
  const int64_t V = w.dim(0), C = w.dim(1);
  if (rows <= kStreamRows) {
    k.matmul_bt(rows, V, C, h, ldh, w.data(), C, logits, V);
  } else {
    // Transpose w a block of vocabulary at a time ([C, kChunk], L2-sized) and multiply.
    constexpr int64_t kChunk = 512;
    Tensor wt({C, kChunk});
    for (int64_t v0 = 0; v0 < V; v0 += kChunk) {
      const int64_t cols = std::min(kChunk, V - v0);
      for (int64_t v = 0; v < cols; ++v)
        for (int64_t c = 0; c < C; ++c) wt.data()[c * kChunk + v] = w.data()[(v0 + v) * C + c];
      k.gemm(rows, cols, C, h, ldh, wt.data(), kChunk, nullptr, logits + v0, V);
    }
  }
  if (softcap > 0) softcap_forward(rows, V, softcap, logits);
}

void lm_head_forward(int64_t rows, const float* h, int64_t ldh, const BlockedMatrix& w, float softcap, float* logits) {
  const kernels::KernelTable& k = kernels::kernels();
  const int64_t V = w.rows, C = w.cols;
  constexpr int64_t kTail = 32;
  alignas(64) float tail[kHeadRows * kTail];  // [R, 32]: the last, zero-padded panel's logits
  // At most kHeadRows rows at a time (beyond, gemm_blocked would pack a copy of all of w), in
  // even chunks: past kHeadRows every chunk has over 16 rows, so each row's logits are gemm's
  // chains for the whole call's row count (kernels/gemm.cpp's classes).
  const int64_t chunks = (rows + kHeadRows - 1) / kHeadRows;
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t r0 = rows * i / chunks, R = rows * (i + 1) / chunks - r0;
    const float* hr = h + r0 * ldh;
    float* out = logits + r0 * V;
    if (w.full > 0) k.gemm_blocked(R, w.full, C, hr, ldh, w.main.data(), nullptr, out, V);
    if (w.full == V) continue;
    k.gemm_blocked(R, kTail, C, hr, ldh, w.tail.data(), nullptr, tail, kTail);
    for (int64_t r = 0; r < R; ++r) std::copy_n(tail + r * kTail, V - w.full, out + r * V + w.full);
  }
  if (softcap > 0) softcap_forward(rows, V, softcap, logits);
}

void lm_head_forward(int64_t rows, const float* h, int64_t ldh, const HalfMatrix& w, float softcap, float* logits) {
  const kernels::KernelTable& k = kernels::kernels();
  const bool f16 = w.format == HalfFormat::f16;
  if (rows <= kStreamRows) {
    if (f16)
      k.matmul_bt_f16(rows, w.rows, w.cols, h, ldh, w.f16(), w.cols, logits, w.rows);
    else
      k.matmul_bt_bf16(rows, w.rows, w.cols, h, ldh, w.data.data(), w.cols, logits, w.rows);
  } else {  // a block of vocabulary at a time: the GEMM widens w's rows into its packed panels
    for (int64_t v0 = 0; v0 < w.rows; v0 += kHeadChunk) {
      const int64_t n = std::min(kHeadChunk, w.rows - v0);
      if (f16)
        k.gemm_bt_f16(rows, n, w.cols, h, ldh, w.f16(v0), w.cols, logits + v0, w.rows);
      else
        k.gemm_bt_bf16_many()(rows, n, w.cols, h, ldh, w.row(v0), w.cols, logits + v0, w.rows);
    }
  }
  if (softcap > 0) softcap_forward(rows, w.rows, softcap, logits);
}

void lm_head_forward(int64_t rows, const float* h, int64_t ldh, const Q8Matrix& w, float softcap, float* logits) {
  const kernels::KernelTable& k = kernels::kernels();
  if (rows <= kStreamRows)
    k.matmul_bt_q8_0(rows, w.rows, w.cols, h, ldh, w.data.data(), w.blocks_per_row(), logits, w.rows);
  else  // a block of vocabulary at a time: the GEMM dequantises w's rows into its packed panels
    for (int64_t v0 = 0; v0 < w.rows; v0 += kHeadChunk)
      k.gemm_bt_q8_0(rows, std::min(kHeadChunk, w.rows - v0), w.cols, h, ldh, w.row(v0), w.blocks_per_row(),
                     logits + v0, w.rows);
  if (softcap > 0) softcap_forward(rows, w.rows, softcap, logits);
}

void lm_head_forward(int64_t rows, const float* h, int64_t ldh, const Q4Matrix& w, float softcap, float* logits) {
  const kernels::KernelTable& k = kernels::kernels();
  if (rows <= kStreamRows)
    k.matmul_bt_q4_k(rows, w.rows, w.cols, h, ldh, w.data.data(), w.blocks_per_row(), logits, w.rows);
  else  // a block of vocabulary at a time: the GEMM dequantises w's rows into its packed panels
    for (int64_t v0 = 0; v0 < w.rows; v0 += kHeadChunk)
      k.gemm_bt_q4_k(rows, std::min(kHeadChunk, w.rows - v0), w.cols, h, ldh, w.row(v0), w.blocks_per_row(),
                     logits + v0, w.rows);
  if (softcap > 0) softcap_forward(rows, w.rows, softcap, logits);
}

namespace {

// lm_head_loss without gradients for a bfloat16, Q8_0 or Q4_K output matrix.
template <class Matrix>
double head_loss(int64_t rows, const float* h, const Matrix& w, float softcap, const int32_t* targets,
                 int64_t counted) {
  const kernels::KernelTable& k = kernels::kernels();
  const int64_t V = w.rows;
  double total = 0;
  const double inv = 1.0 / static_cast<double>(counted);
  std::vector<double> row_loss(static_cast<size_t>(std::min(kLossRows, rows)));
  for (int64_t r0 = 0; r0 < rows; r0 += kLossRows) {
    const int64_t R = std::min(kLossRows, rows - r0);
    Tensor logits({R, V});
    lm_head_forward(R, h + r0 * w.cols, w.cols, w, softcap, logits.data());
    k.softmax_cross_entropy(R, V, logits.data(), V, targets + r0, static_cast<float>(inv), row_loss.data());
    for (int64_t r = 0; r < R; ++r) total += row_loss[static_cast<size_t>(r)];  // rows in order
  }
  return total * inv;
}

}  // namespace

double lm_head_loss(int64_t rows, const float* h, const HalfMatrix& w, float softcap, const int32_t* targets,
                    int64_t counted) {
  return head_loss(rows, h, w, softcap, targets, counted);
}

double lm_head_loss(int64_t rows, const float* h, const Q8Matrix& w, float softcap, const int32_t* targets,
                    int64_t counted) {
  return head_loss(rows, h, w, softcap, targets, counted);
}

double lm_head_loss(int64_t rows, const float* h, const Q4Matrix& w, float softcap, const int32_t* targets,
                    int64_t counted) {
  return head_loss(rows, h, w, softcap, targets, counted);
}

double lm_head_loss(int64_t rows, const float* h, const BlockedMatrix& w, float softcap, const int32_t* targets,
                    int64_t counted) {
  return head_loss(rows, h, w, softcap, targets, counted);
}

namespace {

// lm_head_loss over blocks of kLossRows rows: logits_of(R, h, logits) sets the block's logits
// [R, V] from its h [R, C]; with dh, back(R, dlogits, dh) sets its dh [R, C] from the logits'
// gradient, and dw += dlogitsᵀ·h.
template <class Logits, class Back>
double blocked_head_loss(int64_t rows, int64_t V, int64_t C, const float* h, float softcap, const int32_t* targets,
                         int64_t counted, float* dh, Tensor* dw, const Logits& logits_of, const Back& back) {
  const kernels::KernelTable& k = kernels::kernels();
  Tensor no_bias;
  double total = 0;
  const double inv = 1.0 / static_cast<double>(counted);
  std::vector<double> row_loss(static_cast<size_t>(std::min(kLossRows, rows)));
  Tensor raw = softcap > 0 && dh ? Tensor({std::min(kLossRows, rows), V}) : Tensor();  // [R, V] before the cap
  for (int64_t r0 = 0; r0 < rows; r0 += kLossRows) {
    const int64_t R = std::min(kLossRows, rows - r0);
    Tensor logits({R, V});
    logits_of(R, h + r0 * C, logits.data());
    if (softcap > 0) {
      if (raw.defined()) std::copy_n(logits.data(), R * V, raw.data());
      softcap_forward(R, V, softcap, logits.data());
    }
    k.softmax_cross_entropy(R, V, logits.data(), V, targets + r0, static_cast<float>(inv), row_loss.data());
    for (int64_t r = 0; r < R; ++r) total += row_loss[static_cast<size_t>(r)];  // rows in order
    if (!dh) continue;
    if (softcap > 0) softcap_backward(R, V, softcap, raw.data(), logits.data());
    back(R, logits.data(), dh + r0 * C);
    if (dw) add_weight_grads(logits.data(), R, V, h + r0 * C, C, *dw, 0, no_bias);
  }
  return total * inv;
}

}  // namespace

double lm_head_loss(int64_t rows, const float* h, const Tensor& w, float softcap, const int32_t* targets,
                    int64_t counted, float* dh, Tensor* dw) {
  const kernels::KernelTable& k = kernels::kernels();
  const int64_t V = w.dim(0), C = w.dim(1);
  const Tensor wt = transposed(w.data(), V, C, C);  // [C, V]
  return blocked_head_loss(
      rows, V, C, h, softcap, targets, counted, dh, dw,
      [&](int64_t R, const float* hr, float* logits) { k.gemm(R, V, C, hr, C, wt.data(), V, nullptr, logits, V); },
      [&](int64_t R, const float* dl, float* dhr) { k.gemm(R, C, V, dl, V, w.data(), C, nullptr, dhr, C); });
}

double lm_head_loss(int64_t rows, const float* h, const HalfMatrix& w, float softcap, const int32_t* targets,
                    int64_t counted, float* dh, Tensor* dw) {
  if (w.format != HalfFormat::bf16)
    throw Error("lm_head_loss: w: expected bfloat16 copies of float32 weights for gradients, got a float16 matrix");
  const kernels::KernelTable& k = kernels::kernels();
  const int64_t V = w.rows, C = w.cols;
  return blocked_head_loss(
      rows, V, C, h, softcap, targets, counted, dh, dw,
      [&](int64_t R, const float* hr, float* logits) {  // a block of vocabulary at a time (bounded packed B)
        for (int64_t v0 = 0; v0 < V; v0 += kHeadChunk)
          k.gemm_bt_bf16_many()(R, std::min(kHeadChunk, V - v0), C, hr, C, w.row(v0), C, logits + v0, V);
      },
      [&](int64_t R, const float* dl, float* dhr) { k.gemm_bf16(R, C, V, dl, V, w.data.data(), C, dhr, C, false); });
}

}  // namespace mhsa::nn
