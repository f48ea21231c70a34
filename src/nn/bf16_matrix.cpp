// nn/bf16_matrix.cpp — see bf16_matrix.h.
#include "nn/bf16_matrix.h"

#include <algorithm>

#include "core/check.h"
#include "kernels/bf16.h"

namespace mhsa::nn {

Bf16Matrix Bf16Matrix::rounded(const Tensor& w, bool transposed) {
  if (w.shape().size() != 2)
    detail::fail("Bf16Matrix::rounded", "w", "a matrix", detail::message(w.shape().size(), " dimensions"));
  Bf16Matrix m;
  m.rows = transposed ? w.dim(1) : w.dim(0);
  m.cols = transposed ? w.dim(0) : w.dim(1);
  m.data.resize(static_cast<size_t>(m.rows * m.cols));
  const float* src = w.data();
  uint16_t* dst = m.data.data();
  if (!transposed) {
    std::transform(src, src + m.rows * m.cols, dst, kernels::float_to_bf16);
    return m;
  }
  constexpr int64_t kTile = 32;  // tiles, so that both sides move whole cache lines
  for (int64_t r0 = 0; r0 < m.rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < m.cols; c0 += kTile)
      for (int64_t c = c0; c < std::min(m.cols, c0 + kTile); ++c)
        for (int64_t r = r0; r < std::min(m.rows, r0 + kTile); ++r)
          dst[r * m.cols + c] = kernels::float_to_bf16(src[c * m.rows + r]);
  return m;
}

}  // namespace mhsa::nn
