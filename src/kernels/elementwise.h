// kernels/elementwise.h — the row-wise pieces of a transformer block around attention:
// LayerNorm and GELU, and of training: the softmax cross-entropy head and AdamW. The fast versions are per ISA (kernels/elementwise.cpp, in the
// KernelTable); these float64 twins are their oracles.
#pragma once

#include <cstdint>

namespace mhsa::kernels {

// y[r, :] = (x[r, :] − mean) / sqrt(var + eps) · gamma + beta over C columns, for each of `rows`
// rows (biased variance, as torch.nn.LayerNorm). y may alias x when ldy == ldx.
void layer_norm_ref(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* gamma, const float* beta,
                    float eps, float* y, int64_t ldy);
// x ← GELU with the tanh approximation (GPT-2's "gelu_new"), in place:
// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
void gelu_tanh_ref(int64_t n, float* x);
// dz = du · d/dz GELU(z) for the same approximation (dz may alias du).
void gelu_tanh_backward_ref(int64_t n, const float* z, const float* du, float* dz);

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
