// kernels/elementwise.h — the row-wise pieces of a transformer block around attention:
// LayerNorm, RMSNorm (forward and backward), GELU, the gated MLPs' SwiGLU and GeGLU, rotary
// position embedding, logit soft-capping, and of training: the softmax cross-entropy head and
// AdamW. The fast versions are per ISA (kernels/elementwise.cpp, in the KernelTable); these
// float64 twins are their oracles. The rotary tables (rope_inv_freq, rope_table) are plain
// functions shared by both (kernels/rope.cpp). Not validated here: callers check arguments.
#pragma once

#include <cstdint>
#include <vector>

#include "mhsa/model_config.h"

namespace mhsa::kernels {

// y[r, :] = (x[r, :] − mean) / sqrt(var + eps) · gamma + beta over C columns, for each of `rows`
// rows (biased variance, as torch.nn.LayerNorm). y may alias x when ldy == ldx.
void layer_norm_ref(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* gamma, const float* beta,
                    float eps, float* y, int64_t ldy);
// Backward of layer_norm (x̂ = (x − mean)·rstd, statistics recomputed from x):
// dx[r, :] += rstd·(dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂)) with dx̂ = dy·gamma, and over all rows
// dgamma += Σ dy·x̂, dbeta += Σ dy, summed in float64 in row order (any thread count gives the
// same bits). dgamma and dbeta may be null (frozen parameters).
void layer_norm_backward_ref(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* gamma, float eps,
                             const float* dy, int64_t lddy, float* dx, int64_t lddx, float* dgamma, float* dbeta);

// RMSNorm: y[r, :] = x·rsqrt(mean(x²) + eps)·(w + offset) (offset 0, or 1 for Gemma's
// (1 + weight)). y may alias x when ldy == ldx.
void rms_norm_ref(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* w, float offset, float eps,
                  float* y, int64_t ldy);
// Backward: with x̂ = x·rstd and dx̂ = dy·(w + offset), dx[r, :] += rstd·(dx̂ − x̂·mean(dx̂·x̂)),
// and dw += Σ_rows dy·x̂ in float64, row order (dw may be null).
void rms_norm_backward_ref(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* w, float offset,
                           float eps, const float* dy, int64_t lddy, float* dx, int64_t lddx, float* dw);

// x ← GELU with the tanh approximation (GPT-2's "gelu_new"), in place:
// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
void gelu_tanh_ref(int64_t n, float* x);
// dz = du · d/dz GELU(z) for the same approximation (dz may alias du).
void gelu_tanh_backward_ref(int64_t n, const float* z, const float* du, float* dz);

// Gated MLP activations over rows × F (gate and up may be the two halves of one fused row):
// out = act(gate)·up, act = SiLU (SwiGLU: x·σ(x)) or GELU-tanh (GeGLU). out may alias gate or up.
// Backward: dgate = dout·up·act'(gate), dup = dout·act(gate); dgate may alias gate and dup up
// (each element is read before it is written).
enum class GluKind { swiglu, geglu };
void glu_ref(GluKind kind, int64_t rows, int64_t F, const float* gate, int64_t ldg, const float* up, int64_t ldu,
             float* out, int64_t ldo);
void glu_backward_ref(GluKind kind, int64_t rows, int64_t F, const float* gate, int64_t ldg, const float* up,
                      int64_t ldu, const float* dout, int64_t lddo, float* dgate, int64_t lddg, float* dup,
                      int64_t lddu);

// Logit soft-capping (Gemma 2's final logits): y = cap·tanh(x / cap) over rows × n; y may alias x.
// Backward from the input x: dy ← dy·(1 − tanh²(x / cap)), in place (the fast kernel gives 0
// where |x / cap| > 43.6 and the true factor is below 1e-37).
void softcap_ref(int64_t rows, int64_t n, const float* x, int64_t ldx, float cap, float* y, int64_t ldy);
void softcap_backward_ref(int64_t rows, int64_t n, const float* x, int64_t ldx, float cap, float* dy, int64_t lddy);

// Rotary position embedding, Hugging Face's rotate_half layout (LlamaForCausalLM):
// x is [rows, heads, head_dim], row r at x + r·ldx, head h at + h·head_dim; the first rotary_dim
// (even, ≤ head_dim) dimensions of each head are rotated, the rest pass through. With
// half = rotary_dim / 2 and i < half: (x[i], x[i + half]) ← (x[i]·cos − x[i + half]·sin,
// x[i + half]·cos + x[i]·sin), angle = positions[r]·inv_freq[i]. In place. backward rotates by
// −angle (the transpose), turning dy into dx.
//
// cos and sin are not computed per call: they come from a table that the caller builds once
// (rope_table) and grows when a position passes its end — row p of the table is
// [cos(p·f_0) … cos(p·f_{half−1}), sin(p·f_0) … sin(p·f_{half−1})] (float32). Computing them per
// call would cost rows·half sin/cos pairs for q and again for k in every layer (about 3% of a
// SmolLM2 prefill with libm), and the table makes every call a pure streaming pass. Every
// positions[r] must be < the table's rows.
void rope_ref(int64_t rows, int64_t heads, int64_t head_dim, int64_t rotary_dim, float* x, int64_t ldx,
              const int64_t* positions, const float* table, bool backward);

// The inverse frequencies of rotary_dim / 2 pairs as transformers computes them in float32
// (ROPE_INIT_FUNCTIONS: default, "linear", "llama3"; or llama.cpp's per-frequency factors, f_i /
// factors[i]): f_i = 1 / θ^(2i / rotary_dim), then the
// scaling. rope_inv_freq_ref does the same arithmetic in float64 (the oracle for the float32 one).
std::vector<float> rope_inv_freq(int64_t rotary_dim, double theta, const RopeScaling& scaling);
std::vector<double> rope_inv_freq_ref(int64_t rotary_dim, double theta, const RopeScaling& scaling);
// Rows [first, first + count) of the cos/sin table above, into table (count × rotary_dim floats):
// the angle is the float32 product float(p)·f_i (as transformers forms it), its cos and sin
// computed in float64 and rounded once.
void rope_table(const std::vector<float>& inv_freq, int64_t first, int64_t count, float* table);

// Softmax cross-entropy, each of `rows` rows of V logits (ld apart) in place: logits ->
// (softmax − onehot(targets[r]))·scale, loss[r] = logsumexp − logit[target]; a target of −1 gives
// a zero row and loss 0. The gradient of scale·Σ loss, as a training head needs it.
void softmax_cross_entropy_ref(int64_t rows, int64_t V, float* logits, int64_t ld, const int32_t* targets,
                               float scale, double* loss);
// One AdamW step over n elements: m = β1·m + (1−β1)·g, v = β2·v + (1−β2)·g², and
// w −= decay·w + lr·(m·inv_c1) / (sqrt(v·inv_c2) + eps), inv_c = 1 / (1 − β^step).
void adamw_ref(int64_t n, float* w, const float* g, float* m, float* v, float lr, float decay, float beta1,
               float beta2, float inv_c1, float inv_c2, float eps);

}  // namespace mhsa::kernels
