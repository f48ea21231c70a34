// nn/q8_matrix.h — a weight matrix kept as Q8_0 blocks (8-bit weights, Model::load with
// WeightType::q8_0): 32 int8 quants and one f16 scale per 32 weights (kernels/q8_0.h), 34 bytes
// where float32 takes 128, so a decode step streams about a quarter of the bytes. Always stored
// [out, in] (GPT-2's Conv1D [in, out] weights are transposed before they are quantised), each row
// its own blocks, in tensor memory (huge pages from 2 MiB, as Tensor's). The row length must be a
// multiple of 32: the model keeps other matrices in float32 (as llama.cpp does). Inference only:
// nothing computes gradients of it. Not public.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "kernels/q8_0.h"
#include "mhsa/tensor.h"

namespace mhsa::nn {

struct Q8Matrix {
  int64_t rows = 0, cols = 0;  // [out, in]; cols a multiple of 32
  std::vector<kernels::BlockQ8_0, AlignedAllocator<kernels::BlockQ8_0>> data;  // [rows, cols / 32]

  // w quantised by ggml's reference rule (kernels::quantize_row_q8_0): w [rows, cols] as it is,
  // or, transposed, w [cols, rows] stored [rows, cols]. Throws mhsa::Error naming `what` (the
  // parameter) when the row length is not a multiple of 32 or a value is not finite.
  static Q8Matrix quantized(const Tensor& w, bool transposed, std::string_view what);
  static bool fits(int64_t cols) { return cols > 0 && cols % kernels::kQ8Block == 0; }
  int64_t blocks_per_row() const { return cols / kernels::kQ8Block; }
  const kernels::BlockQ8_0* row(int64_t r) const { return data.data() + r * blocks_per_row(); }
};

}  // namespace mhsa::nn
