// nn/q8_matrix.cpp — see q8_matrix.h.
#include "nn/q8_matrix.h"

#include <cmath>

#include "core/check.h"
#include "nn/linear.h"

namespace mhsa::nn {

Q8Matrix Q8Matrix::quantized(const Tensor& w, bool transposed, std::string_view what) {
  constexpr std::string_view fn = "Q8Matrix::quantized";
  if (w.shape().size() != 2) detail::fail(fn, what, "a matrix", detail::message(w.shape().size(), " dimensions"));
  Q8Matrix m;
  m.rows = transposed ? w.dim(1) : w.dim(0);
  m.cols = transposed ? w.dim(0) : w.dim(1);
  if (!fits(m.cols))
    detail::fail(fn, what, "rows of a multiple of 32 weights (Q8_0 blocks)", detail::message(m.cols, " weights"));
  const float* src = w.data();
  for (int64_t i = 0; i < w.numel(); ++i)
    if (!std::isfinite(src[i]))
      detail::fail(fn, what, "finite weights (Q8_0 scales cannot hold NaN or infinity)",
                   detail::message(src[i], " at index ", i));
  const Tensor t = transposed ? nn::transposed(src, m.cols, m.rows, m.rows) : Tensor();  // [rows, cols]
  if (transposed) src = t.data();
  const int64_t blocks =
      detail::checked_count("Q8Matrix::quantized: blocks", {m.rows, m.blocks_per_row()}, sizeof(kernels::BlockQ8_0));
  m.data.resize(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static) if (m.rows * m.cols >= (int64_t{1} << 18))
  for (int64_t r = 0; r < m.rows; ++r)
    kernels::quantize_row_q8_0(src + r * m.cols, m.cols, m.data.data() + r * m.blocks_per_row());
  return m;
}

}  // namespace mhsa::nn
