// kernels/matmul_bt.cpp — C[M, N] = A[M, K] · B[N, K]ᵀ for a few rows M, compiled once per ISA:
// the output projection of a language model (logits = h · wteᵀ with wte stored [V, C]) while
// decoding, when it is a stream over the whole embedding matrix. Each row of B is read once,
// from memory, and dotted with up to kRows rows of A held in L1; later groups of A rows find the
// same block of B in L2. Threads split N. Not for large M: that is a GEMM (see model/gpt2.cpp).
#include <omp.h>

#include <algorithm>

#include "kernels/isa/simd.h"

namespace mhsa::kernels::MHSA_ISA {
namespace {

constexpr int kRows = 4;         // rows of A per pass over a block of B
constexpr int64_t kBlockN = 64;  // rows of B per block: 64·K floats, well inside L2 for K ≤ 2048

template <int R>
void dot_rows(int64_t K, const float* A, int64_t lda, const float* b, float* out, int64_t ldc) {
  Vec acc[R] = {};
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes) {
    const Vec bv = load(b + k);
    for (int r = 0; r < R; ++r) acc[r] = fma(load(A + r * lda + k), bv, acc[r]);
  }
  if (k < K) {
    const int rest = static_cast<int>(K - k);
    const Vec bv = load_partial(b + k, rest, 0.0f);
    for (int r = 0; r < R; ++r) acc[r] = fma(load_partial(A + r * lda + k, rest, 0.0f), bv, acc[r]);
  }
  for (int r = 0; r < R; ++r) out[r * ldc] = reduce_sum(acc[r]);
}

}  // namespace

void matmul_bt(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
               int64_t ldc) {
  const int64_t blocks = (N + kBlockN - 1) / kBlockN;
#pragma omp parallel for schedule(static) if (N * K >= (int64_t{1} << 15))
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t n0 = blk * kBlockN, n1 = std::min(N, n0 + kBlockN);
    for (int64_t m = 0; m < M; m += kRows) {
      const int64_t rows = std::min<int64_t>(kRows, M - m);
      for (int64_t n = n0; n < n1; ++n) {
        const float* b = B + n * ldb;
        float* out = C + m * ldc + n;
        const float* a = A + m * lda;
        switch (rows) {
          case 4: dot_rows<4>(K, a, lda, b, out, ldc); break;
          case 3: dot_rows<3>(K, a, lda, b, out, ldc); break;
          case 2: dot_rows<2>(K, a, lda, b, out, ldc); break;
          default: dot_rows<1>(K, a, lda, b, out, ldc); break;
        }
      }
    }
  }
}

}  // namespace mhsa::kernels::MHSA_ISA
