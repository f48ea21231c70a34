// nn/rope.cpp — see rope.h.
#include "nn/rope.h"

#include "kernels/dispatch.h"
#include "kernels/elementwise.h"

namespace mhsa::nn {

Rope make_rope(const ModelConfig& c) {
  Rope rope;
  rope.rotary_dim = c.rotary_dim > 0 ? c.rotary_dim : c.head_dim;
  rope.inv_freq = kernels::rope_inv_freq(rope.rotary_dim, c.rope_theta, c.rope_scaling);
  return rope;
}

RopeTable rope_table(const Rope& rope, int64_t rows, int64_t T, int64_t pos0) {
  RopeTable t;
  t.rotary_dim = rope.rotary_dim;
  t.table = Tensor({T, rope.rotary_dim});
  kernels::rope_table(rope.inv_freq, pos0, T, t.table.data());
  t.row_pos.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) t.row_pos[static_cast<size_t>(r)] = r % T;
  return t;
}

RopeTable rope_table(const Rope& rope, std::span<const PositionRun> runs) {
  int64_t rows = 0;
  for (const PositionRun& r : runs) rows += r.rows;
  RopeTable t;
  t.rotary_dim = rope.rotary_dim;
  t.table = Tensor({rows, rope.rotary_dim});
  int64_t r0 = 0;
  for (const PositionRun& r : runs) {
    kernels::rope_table(rope.inv_freq, r.pos0, r.rows, t.table.data() + r0 * rope.rotary_dim);
    r0 += r.rows;
  }
  t.row_pos.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) t.row_pos[static_cast<size_t>(r)] = r;
  return t;
}

void rope_forward(const RopeTable& t, int64_t rows, int64_t heads, int64_t D, float* x, int64_t ld) {
  kernels::kernels().rope(rows, heads, D, t.rotary_dim, x, ld, t.row_pos.data(), t.table.data(), false);
}

void rope_backward(const RopeTable& t, int64_t rows, int64_t heads, int64_t D, float* dx, int64_t ld) {
  kernels::kernels().rope(rows, heads, D, t.rotary_dim, dx, ld, t.row_pos.data(), t.table.data(), true);
}

}  // namespace mhsa::nn
