// nn/q4_matrix.cpp — see q4_matrix.h.
#include "nn/q4_matrix.h"

#include <cmath>

#include "core/check.h"
#include "nn/linear.h"

namespace mhsa::nn {

Q4Matrix Q4Matrix::quantized(const Tensor& w, bool transposed, std::string_view what) {
  constexpr std::string_view fn = "Q4Matrix::quantized";
  if (w.shape().size() != 2) detail::fail(fn, what, "a matrix", detail::message(w.shape().size(), " dimensions"));
  Q4Matrix m;
  m.rows = transposed ? w.dim(1) : w.dim(0);
  m.cols = transposed ? w.dim(0) : w.dim(1);
  if (!fits(m.cols))
    detail::fail(fn, what, "rows of a multiple of 256 weights (Q4_K blocks)", detail::message(m.cols, " weights"));
  const float* src = w.data();
  for (int64_t i = 0; i < w.numel(); ++i)
    if (!std::isfinite(src[i]))
      detail::fail(fn, what, "finite weights (Q4_K scales cannot hold NaN or infinity)",
                   detail::message(src[i], " at index ", i));
  const Tensor t = transposed ? nn::transposed(src, m.cols, m.rows, m.rows) : Tensor();  // [rows, cols]
  if (transposed) src = t.data();
  const int64_t blocks =
      detail::checked_count("Q4Matrix::quantized: blocks", {m.rows, m.blocks_per_row()}, sizeof(kernels::BlockQ4_K));
  m.data.resize(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(dynamic, 16) if (m.rows * m.cols >= (int64_t{1} << 16))
  for (int64_t r = 0; r < m.rows; ++r) {
    kernels::quantize_row_q4_k(src + r * m.cols, m.cols, m.row(r));
    kernels::interleave_q4_k(m.row(r), m.blocks_per_row());
  }
  return m;
}

Tensor Q4Matrix::dequantized() const {
  Tensor t({rows, cols});
  for (int64_t r = 0; r < rows; ++r) kernels::dequantize_row_q4_k_interleaved(row(r), cols, t.data() + r * cols);
  return t;
}

}  // namespace mhsa::nn
