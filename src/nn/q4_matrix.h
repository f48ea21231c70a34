// nn/q4_matrix.h — a weight matrix kept as Q4_K blocks (4-bit weights, Model::load with
// WeightType::q4_k): 256 weights in 144 bytes (kernels/q4_k.h), a ninth of float32's bytes, so a
// decode step streams about an eighth of the float model's. Always stored [out, in] (GPT-2's
// Conv1D [in, out] weights are transposed before they are quantised), each row its own blocks, in
// tensor memory (huge pages from 2 MiB, as Tensor's). The row length must be a multiple of 256:
// the model keeps other matrices as Q8_0 (see mhsa/model.h). The blocks' quants are in the Q4_K
// kernels' order (kernels/q4_k.h: interleave_q4_k), not ggml's. Inference only. Not public.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kernels/q4_k.h"
#include "mhsa/tensor.h"

namespace mhsa::nn {

struct Q4Matrix {
  int64_t rows = 0, cols = 0;  // [out, in]; cols a multiple of 256
  std::vector<kernels::BlockQ4_K, AlignedAllocator<kernels::BlockQ4_K>> data;  // [rows, cols / 256], kernels' order

  // w quantised by kernels::quantize_row_q4_k (then interleaved): w [rows, cols] as it is, or, transposed, w [cols,
  // rows] stored [rows, cols]. Throws mhsa::Error naming `what` (the parameter) when the row
  // length is not a multiple of 256 or a value is not finite.
  static Q4Matrix quantized(const Tensor& w, bool transposed, std::string_view what);
  static bool fits(int64_t cols) { return cols > 0 && cols % kernels::kQ4KBlock == 0; }
  int64_t blocks_per_row() const { return cols / kernels::kQ4KBlock; }
  const kernels::BlockQ4_K* row(int64_t r) const { return data.data() + r * blocks_per_row(); }
  kernels::BlockQ4_K* row(int64_t r) { return data.data() + r * blocks_per_row(); }
  // The values the kernels multiply by, [rows, cols] float32.
  Tensor dequantized() const;
};

}  // namespace mhsa::nn
