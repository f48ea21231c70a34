// nn/bf16_matrix.h — a weight matrix kept as bfloat16 (16-bit weights, Model::load with
// Dtype::bf16): half the bytes of every decode step's stream over the weights. Always stored
// [out, in] (torch.nn.Linear's layout; GPT-2's Conv1D [in, out] weights are transposed when
// rounded), in tensor memory (huge pages from 2 MiB, as Tensor's). A bf16 model's weights are
// for inference only; training with --dtype bf16 keeps float32 master weights and a bfloat16 copy
// of them that its forward and input gradients read (re-rounded after every optimiser step). Not
// public.
#pragma once

#include <cstdint>
#include <vector>

#include "mhsa/tensor.h"

namespace mhsa::nn {

struct Bf16Matrix {
  int64_t rows = 0, cols = 0;  // [out, in]
  std::vector<uint16_t, AlignedAllocator<uint16_t>> data;

  // w rounded to bfloat16 (nearest-even, NaN kept): w [rows, cols] as it is, or, transposed,
  // w [cols, rows] stored [rows, cols].
  static Bf16Matrix rounded(const Tensor& w, bool transposed);
  // The same into this matrix, reusing its storage when the shape is unchanged.
  void round_from(const Tensor& w, bool transposed);
  const uint16_t* row(int64_t r) const { return data.data() + r * cols; }
};

}  // namespace mhsa::nn
