// nn/rope.h — rotary position embedding (RoPE) as Hugging Face's Llama computes it: within each
// head the first rotary_dim dimensions are rotated in pairs (i, i + rotary_dim/2) by the angle
// position·inv_freq[i] ("rotate_half"), the rest pass through; the frequencies include the
// "linear" and "llama3" rope_scaling rules and a GGUF file's per-frequency factors
// (kernels::rope_inv_freq). One call's cos/sin table covers its rows' positions only (pos0 + r % T,
// or each sequence's own run of positions in a batched step), built once and used by every layer.
// The rotation itself is the per-ISA rope kernel. Not public.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mhsa/model_config.h"
#include "mhsa/tensor.h"

namespace mhsa::nn {

struct Rope {
  int64_t rotary_dim = 0;       // rotated dimensions per head (even)
  std::vector<float> inv_freq;  // [rotary_dim / 2], float32 as transformers computes them
};

Rope make_rope(const ModelConfig& c);

// The cos/sin rows of positions pos0 .. pos0 + T − 1, and each of `rows` rows' index into them.
struct RopeTable {
  int64_t rotary_dim = 0;
  Tensor table;                  // [T, rotary_dim]: cos of each pair, then sin
  std::vector<int64_t> row_pos;  // [rows]: r % T
};
RopeTable rope_table(const Rope& rope, int64_t rows, int64_t T, int64_t pos0);
// Several sequences' rows one after another (a batched step): run i's `rows` rows stand at
// positions pos0 .. pos0 + rows − 1. The table has a row per row, each row's bits those of
// rope_table's for the same position.
struct PositionRun {
  int64_t pos0 = 0, rows = 0;
};
RopeTable rope_table(const Rope& rope, std::span<const PositionRun> runs);

// x: `rows` rows (ld apart) of `heads` heads of D floats each, rotated in place by +angle
// (forward) or, for a gradient, by −angle (backward).
void rope_forward(const RopeTable& t, int64_t rows, int64_t heads, int64_t D, float* x, int64_t ld);
void rope_backward(const RopeTable& t, int64_t rows, int64_t heads, int64_t D, float* dx, int64_t ld);

}  // namespace mhsa::nn
