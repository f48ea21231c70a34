// nn/ops.h — the row-wise ops of a decoder-only transformer as llm.c-style pairs: each *_forward
// computes its output from what the caller keeps, each *_backward adds the parameter gradients
// (accumulating, in a fixed row order, float64 where a sum crosses rows) and returns or adds the
// input gradient. Embedding, LayerNorm, RMSNorm, the MLP activations (GELU, SwiGLU, GeGLU), the
// logit soft-cap and the LM head with its fused softmax cross-entropy. The linear layer is in
// nn/linear.h, rotary positions in nn/rope.h, attention in nn/attention.h. Not public; no argument
// validation (the model layer validates once at its boundary).
#pragma once

#include <cstdint>

#include "mhsa/model_config.h"
#include "mhsa/tensor.h"
#include "nn/blocked_matrix.h"
#include "nn/half_matrix.h"
#include "nn/q4_matrix.h"
#include "nn/q8_matrix.h"

namespace mhsa::nn {

// x[0:n] += y[0:n]
void add_into(float* x, const float* y, int64_t n);

// ---- embedding -------------------------------------------------------------------------------
// out[r, :] = wte[ids[r], :]·scale (+ wpe[pos0 + r % T, :] when wpe is given)   out [rows, C]
void embedding_forward(int64_t rows, int64_t T, int64_t pos0, const int32_t* ids, const Tensor& wte,
                       const Tensor* wpe, float scale, float* out);
// The same with wte kept as bfloat16 (its rows widened).
void embedding_forward(int64_t rows, int64_t T, int64_t pos0, const int32_t* ids, const HalfMatrix& wte,
                       const Tensor* wpe, float scale, float* out);
// The same with wte kept as Q8_0 blocks (each row read dequantised).
void embedding_forward(int64_t rows, int64_t T, int64_t pos0, const int32_t* ids, const Q8Matrix& wte,
                       const Tensor* wpe, float scale, float* out);
// The same with wte kept as Q4_K blocks (each row read dequantised).
void embedding_forward(int64_t rows, int64_t T, int64_t pos0, const int32_t* ids, const Q4Matrix& wte,
                       const Tensor* wpe, float scale, float* out);
// The same with wte kept transposed and blocked (its rows gathered back, exact).
void embedding_forward(int64_t rows, int64_t T, int64_t pos0, const int32_t* ids, const BlockedMatrix& wte,
                       const Tensor* wpe, float scale, float* out);
// dwte[ids[r], :] += scale·dout[r, :] (but for ids[r] == padding_row: nn.Embedding's padding_idx),
// dwpe[r % T, :] += dout[r, :], rows in order (the same sums for any thread count).
void embedding_backward(int64_t rows, int64_t T, const int32_t* ids, const float* dout, float scale, Tensor& dwte,
                        Tensor* dwpe, int32_t padding_row = -1);

// ---- norms -----------------------------------------------------------------------------------
// LayerNorm (with bias) or RMSNorm ((offset + w) as the gain; Gemma's offset is 1), from the model.
struct NormSpec {
  NormKind kind = NormKind::layer_norm;
  float eps = 1e-5f;
  float offset = 0;
};
// y [rows, C] (ldy) = norm(x [rows, C] (ldx)); b is used by LayerNorm only. y may alias x.
void norm_forward(const NormSpec& s, int64_t rows, int64_t C, const float* x, int64_t ldx, const float* w,
                  const float* b, float* y, int64_t ldy);
// dx [rows, C] += ∂/∂x, dw += Σ_rows ∂/∂w, db += Σ_rows dy (LayerNorm; db may be null) from the
// forward's input x [rows, C] (contiguous) and dy [rows, C]. The row statistics are recomputed in
// float64.
void norm_backward(const NormSpec& s, int64_t rows, int64_t C, const float* x, const float* w, const float* dy,
                   float* dx, float* dw, float* db);

// ---- activations -----------------------------------------------------------------------------
// u = GELU_tanh(z) in place, and dz = du·GELU'(z) (dz may alias du).
void gelu_forward(int64_t n, float* z);
void gelu_backward(int64_t n, const float* z, const float* du, float* dz);
// a [rows, F] = act(gate)·up for swiglu (act = silu) or geglu (act = GELU_tanh), all [rows, F].
void gated_forward(MlpKind kind, int64_t rows, int64_t F, const float* gate, const float* up, float* a);
// dgate = da·up·act'(gate), dup = da·act(gate).
void gated_backward(MlpKind kind, int64_t rows, int64_t F, const float* gate, const float* up, const float* da,
                    float* dgate, float* dup);
// x [rows, n] ← cap·tanh(x / cap), in place; and dx ← dx·(1 − tanh²(x / cap)) from the input x.
void softcap_forward(int64_t rows, int64_t n, float cap, float* x);
void softcap_backward(int64_t rows, int64_t n, float cap, const float* x, float* dx);

// ---- the LM head -----------------------------------------------------------------------------
// logits [rows, V] = h [rows, C] (ldh) · wᵀ for the output matrix w [V, C], then the soft-cap (0:
// none). A stream over w for a few rows (decoding), a GEMM over blocks of w's rows otherwise.
void lm_head_forward(int64_t rows, const float* h, int64_t ldh, const Tensor& w, float softcap, float* logits);
void lm_head_forward(int64_t rows, const float* h, int64_t ldh, const HalfMatrix& w, float softcap, float* logits);
void lm_head_forward(int64_t rows, const float* h, int64_t ldh, const Q8Matrix& w, float softcap, float* logits);
void lm_head_forward(int64_t rows, const float* h, int64_t ldh, const Q4Matrix& w, float softcap, float* logits);
// The same with w kept transposed and blocked: gemm_blocked's chains (a row's logits depend on
// the row count's class: kernels/gemm.cpp), written in place.
void lm_head_forward(int64_t rows, const float* h, int64_t ldh, const BlockedMatrix& w, float softcap, float* logits);
// The mean cross-entropy of targets [rows] (−1: ignored) over `counted` targets, computed a block
// of rows at a time through the fused softmax cross-entropy (the [rows, V] logits never exist
// whole). With dh: dh [rows, C] = ∂loss/∂h and dw += ∂loss/∂w (when dw: null for a frozen matrix).
double lm_head_loss(int64_t rows, const float* h, const Tensor& w, float softcap, const int32_t* targets,
                    int64_t counted, float* dh, Tensor* dw);
// The same with the output matrix kept as bfloat16 [V, C] (training's bf16 copy of float32 master
// weights; dw has the master's shape): the logits and dh read w (widened while packed), dw comes
// from h and the logits' gradient. Bitwise the float lm_head_loss on the widened w when every
// block of rows has more than 16.
double lm_head_loss(int64_t rows, const float* h, const HalfMatrix& w, float softcap, const int32_t* targets,
                    int64_t counted, float* dh, Tensor* dw);
// The loss alone, for a bfloat16, Q8_0, Q4_K or blocked output matrix.
double lm_head_loss(int64_t rows, const float* h, const HalfMatrix& w, float softcap, const int32_t* targets,
                    int64_t counted);
double lm_head_loss(int64_t rows, const float* h, const Q8Matrix& w, float softcap, const int32_t* targets,
                    int64_t counted);
double lm_head_loss(int64_t rows, const float* h, const Q4Matrix& w, float softcap, const int32_t* targets,
                    int64_t counted);
double lm_head_loss(int64_t rows, const float* h, const BlockedMatrix& w, float softcap, const int32_t* targets,
                    int64_t counted);

}  // namespace mhsa::nn
