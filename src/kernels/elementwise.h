// kernels/elementwise.h — the row-wise pieces of a transformer block around attention:
// LayerNorm and GELU. The fast versions are per ISA (kernels/elementwise.cpp, in the
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

}  // namespace mhsa::kernels
