// nn/rope.h — rotary position embedding (RoPE) as Hugging Face's Llama computes it: within each
// head the first rotary_dim dimensions are rotated in pairs (i, i + rotary_dim/2) by the angle
// position·inv_freq[i] ("rotate_half"), the rest pass through. The frequencies include the
// "linear" and "llama3" rope_scaling rules. Positions are given per row (pos0 + r % T), so a KV
// cache's new rows continue where it stopped. Not public.
#pragma once

#include <cstdint>
#include <vector>

#include "mhsa/model_config.h"

namespace mhsa::nn {

struct Rope {
  int64_t rotary_dim = 0;       // rotated dimensions per head (even)
  std::vector<float> inv_freq;  // [rotary_dim / 2], float32 as transformers computes them
};

Rope make_rope(const ModelConfig& c);

// x: `rows` rows (ld apart) of `heads` heads of D floats each; row r is at position pos0 + r % T.
// Forward rotates by +angle; backward (the gradient, in place) by −angle.
void rope_forward(const Rope& rope, int64_t rows, int64_t T, int64_t pos0, int64_t heads, int64_t D, float* x,
                  int64_t ld);
void rope_backward(const Rope& rope, int64_t rows, int64_t T, int64_t pos0, int64_t heads, int64_t D, float* dx,
                   int64_t ld);

}  // namespace mhsa::nn
