// kernels/gemm_ref.cpp — the reference matrix multiply (see gemm.h).
#include <cstddef>
#include <vector>

#include "kernels/gemm.h"

namespace mhsa::kernels {

void gemm_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
              int64_t ldb, const float* bias, float* C, int64_t ldc) {
#pragma omp parallel
  {
    std::vector<double> acc(static_cast<size_t>(N));  // [N] one row of C
#pragma omp for schedule(static)
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) acc[j] = bias ? bias[j] : 0.0;
      for (int64_t kk = 0; kk < K; ++kk) {
        const double a = A[i * lda + kk];
        const float* b_row = B + kk * ldb;
        for (int64_t j = 0; j < N; ++j) acc[j] += a * static_cast<double>(b_row[j]);
      }
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = static_cast<float>(acc[j]);
    }
  }
}

void block_b(int64_t K, int64_t N, const float* B, float* out) {
#pragma omp parallel for schedule(static) if (K * N >= (int64_t{1} << 18))
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < N; ++j) out[blocked_index(k, j, N)] = B[k * N + j];
}

void unblock_b(int64_t K, int64_t N, const float* blocked, float* out) {
#pragma omp parallel for schedule(static) if (K * N >= (int64_t{1} << 18))
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < N; ++j) out[k * N + j] = blocked[blocked_index(k, j, N)];
}

}  // namespace mhsa::kernels
