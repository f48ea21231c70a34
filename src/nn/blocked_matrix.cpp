// nn/blocked_matrix.cpp — see blocked_matrix.h.
#include "nn/blocked_matrix.h"

#include "kernels/gemm.h"

namespace mhsa::nn {

namespace {
constexpr int64_t kPanel = 32;  // columns gemm_blocked needs whole (gemm.h's can_block)
}

BlockedMatrix BlockedMatrix::of(const Tensor& w) {
  BlockedMatrix b;
  b.rows = w.dim(0), b.cols = w.dim(1);
  b.full = b.rows / kPanel * kPanel;
  if (b.full > 0) {
    b.main = Tensor({b.cols, b.full});
    kernels::block_bt(b.cols, b.full, w.data(), b.cols, b.full, b.main.data());
  }
  if (b.full < b.rows) {
    b.tail = Tensor({b.cols, kPanel});
    kernels::block_bt(b.cols, kPanel, w.data() + b.full * b.cols, b.cols, b.rows - b.full, b.tail.data());
  }
  return b;
}

void BlockedMatrix::row(int64_t r, float* out) const {
  const bool in_main = r < full;
  const float* src = in_main ? main.data() : tail.data();
  const int64_t n = in_main ? full : kPanel, j = in_main ? r : r - full;
  for (int64_t k = 0; k < cols; ++k) out[k] = src[kernels::blocked_index(k, j, n)];
}

}  // namespace mhsa::nn
