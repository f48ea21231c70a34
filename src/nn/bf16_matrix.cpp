// nn/bf16_matrix.cpp — see bf16_matrix.h.
#include "nn/bf16_matrix.h"

#include <algorithm>

#include "core/check.h"
#include "kernels/bf16.h"

namespace mhsa::nn {

Bf16Matrix Bf16Matrix::rounded(const Tensor& w, bool transposed) {
  Bf16Matrix m;
  m.round_from(w, transposed);
  return m;
}

void Bf16Matrix::round_from(const Tensor& w, bool transposed) {
  if (w.shape().size() != 2)
    detail::fail("Bf16Matrix::rounded", "w", "a matrix", detail::message(w.shape().size(), " dimensions"));
  rows = transposed ? w.dim(1) : w.dim(0);
  cols = transposed ? w.dim(0) : w.dim(1);
  data.resize(static_cast<size_t>(rows * cols));
  const float* src = w.data();
  uint16_t* dst = data.data();
  if (!transposed) {
    std::transform(src, src + rows * cols, dst, kernels::float_to_bf16);
    return;
  }
  constexpr int64_t kTile = 32;  // tiles, so that both sides move whole cache lines
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c)
        for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r)
          dst[r * cols + c] = kernels::float_to_bf16(src[c * rows + r]);
}

}  // namespace mhsa::nn
