// core/tensor.cpp — the owning Tensor.
#include "mhsa/tensor.h"

#include "core/check.h"

namespace mhsa {

Tensor::Tensor(std::vector<int64_t> dims) : shape_(std::move(dims)) {
  if (shape_.empty() || shape_.size() > kMaxDims)
    detail::fail("Tensor", "dims", "1 to 4 dimensions", std::to_string(shape_.size()));
  int64_t n = 1;
  for (int64_t d : shape_) {
    if (d < 0) detail::fail("Tensor", "dims", "non-negative sizes", std::to_string(d));
    n *= d;
  }
  storage_.assign(static_cast<size_t>(n), 0.0f);
}

}  // namespace mhsa
