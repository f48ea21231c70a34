// kernels/gemm.cpp — the fast matrix multiply, compiled once per ISA (MHSA_ISA, see dispatch.h).
// C[M, N] = A[M, K] · B[K, N] + bias; rows of C split across threads, each element summed in a
// fixed order, so results do not depend on the thread count.
#include "kernels/isa/simd.h"

namespace mhsa::kernels::MHSA_ISA {

void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
          const float* bias, float* C, int64_t ldc) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < M; ++i) {
    float* c = C + i * ldc;
    for (int64_t j = 0; j < N; ++j) c[j] = bias ? bias[j] : 0.0f;
    for (int64_t kk = 0; kk < K; ++kk) {
      const float a = A[i * lda + kk];
      const float* b = B + kk * ldb;
      for (int64_t j = 0; j < N; ++j) c[j] += a * b[j];
    }
  }
}

}  // namespace mhsa::kernels::MHSA_ISA
