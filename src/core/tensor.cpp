// core/tensor.cpp — the owning Tensor.
#include "mhsa/tensor.h"

#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/check.h"

namespace mhsa {

namespace detail {

namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kHugeFrom = std::size_t{4} << 20;
}  // namespace

void* allocate_tensor_memory(std::size_t bytes) {
  if (bytes < kHugeFrom) return ::operator new(bytes, std::align_val_t{64});
  const std::size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = ::operator new(rounded, std::align_val_t{kHugePage});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  (void)madvise(p, rounded, MADV_HUGEPAGE);  // a hint: without THP the pages stay 4 KiB
#endif
  return p;
}

void free_tensor_memory(void* p, std::size_t bytes) noexcept {
  if (bytes < kHugeFrom)
    ::operator delete(p, std::align_val_t{64});
  else
    ::operator delete(p, std::align_val_t{kHugePage});
}

}  // namespace detail

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

Tensor contiguous(const ConstTensorView& v) {
  Tensor t(std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.ndim));
  std::array<int64_t, 4> n{1, 1, 1, 1}, st{0, 0, 0, 0};  // right-aligned to 4 dimensions
  for (int i = 0; i < v.ndim; ++i) n[4 - v.ndim + i] = v.shape[i], st[4 - v.ndim + i] = v.stride[i];
  float* out = t.data();
  for (int64_t a = 0; a < n[0]; ++a)
    for (int64_t b = 0; b < n[1]; ++b)
      for (int64_t c = 0; c < n[2]; ++c)
        for (int64_t d = 0; d < n[3]; ++d) *out++ = v.data[a * st[0] + b * st[1] + c * st[2] + d * st[3]];
  return t;
}

}  // namespace mhsa
