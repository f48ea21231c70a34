// nn/half_matrix.h — a weight matrix kept in 16 bits (16-bit weights, Model::load with
// WeightType::bf16 or f16): half the bytes of every decode step's stream over the weights.
// bfloat16 (float32's upper half: its range, 8 significant bits) or IEEE float16 (11 significant
// bits, range ±65504: an F16 checkpoint kept exactly as stored). Always stored [out, in]
// (torch.nn.Linear's layout; GPT-2's Conv1D [in, out] weights are transposed when rounded), in
// tensor memory (huge pages from 2 MiB, as Tensor's). A 16-bit model's weights are for inference
// only; training with --dtype bf16 keeps float32 master weights and a bfloat16 copy of them that
// its forward and input gradients read (re-rounded after every optimiser step). Not public.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "mhsa/tensor.h"

namespace mhsa::nn {

enum class HalfFormat { bf16, f16 };

struct HalfMatrix {
  HalfFormat format = HalfFormat::bf16;
  int64_t rows = 0, cols = 0;  // [out, in]
  std::vector<uint16_t, AlignedAllocator<uint16_t>> data;  // the bits

  // w rounded to the format (nearest-even, NaN kept): w [rows, cols] as it is, or, transposed,
  // w [cols, rows] stored [rows, cols]. A finite value beyond float16's range (|w| ≥ 65520, which
  // would round to infinity) is refused, naming `name` and the value: such a checkpoint needs
  // bf16 or f32.
  static HalfMatrix rounded(const Tensor& w, bool transposed, HalfFormat format = HalfFormat::bf16,
                            std::string_view name = "w");
  // The same into this matrix in its format, reusing its storage when the shape is unchanged.
  void round_from(const Tensor& w, bool transposed, std::string_view name = "w");
  const uint16_t* row(int64_t r) const { return data.data() + r * cols; }
  // The bits as float16 elements (format f16), for the kernels that widen them.
  const float16* f16(int64_t r = 0) const { return reinterpret_cast<const float16*>(row(r)); }
};

}  // namespace mhsa::nn
