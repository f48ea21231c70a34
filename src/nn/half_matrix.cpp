// nn/half_matrix.cpp — see half_matrix.h.
#include "nn/half_matrix.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kernels/bf16.h"
#include "kernels/half.h"

namespace mhsa::nn {

HalfMatrix HalfMatrix::rounded(const Tensor& w, bool transposed, HalfFormat format, std::string_view name) {
  HalfMatrix m;
  m.format = format;
  m.round_from(w, transposed, name);
  return m;
}

void HalfMatrix::round_from(const Tensor& w, bool transposed, std::string_view name) {
  constexpr std::string_view fn = "HalfMatrix::rounded";
  if (w.shape().size() != 2) detail::fail(fn, name, "a matrix", detail::message(w.shape().size(), " dimensions"));
  const float* src = w.data();
  const int64_t n = w.numel();
  if (format == HalfFormat::f16)
    for (int64_t i = 0; i < n; ++i)
      if (std::isfinite(src[i]) && std::abs(src[i]) >= 65520.0f)  // rounds to ±inf
        detail::fail(fn, name, "weights within float16's range (|w| < 65520; use dtype bf16 or f32)",
                     detail::message(src[i], " at element ", i));
  const auto narrow = format == HalfFormat::f16 ? kernels::float_to_f16 : kernels::float_to_bf16;
  rows = transposed ? w.dim(1) : w.dim(0);
  cols = transposed ? w.dim(0) : w.dim(1);
  data.resize(static_cast<size_t>(rows * cols));
  uint16_t* dst = data.data();
  if (!transposed) {
    std::transform(src, src + rows * cols, dst, narrow);
    return;
  }
  constexpr int64_t kTile = 32;  // tiles, so that both sides move whole cache lines
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c)
        for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r) dst[r * cols + c] = narrow(src[c * rows + r]);
}

}  // namespace mhsa::nn
