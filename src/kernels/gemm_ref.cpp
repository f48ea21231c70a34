// kernels/gemm_ref.cpp — the reference matrix multiply (see gemm.h).
#include <cstddef>
#include <cstring>
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

// A row block's rows, 16 floats at a time, in the order the blocked layout stores them.
void block_b(int64_t K, int64_t N, const float* B, float* out) {
  for (int64_t k0 = 0; k0 < K; k0 += kBlockedB)
    for (int64_t j = 0; j < N; j += kBlockedB)
      for (int64_t kk = 0; kk < kBlockedB; ++kk, out += kBlockedB)
        std::memcpy(out, B + (k0 + kk) * N + j, kBlockedB * sizeof(float));
}

void block_b_in_place(int64_t K, int64_t N, float* B) {
  std::vector<float> rows(static_cast<size_t>(kBlockedB * N));
  for (int64_t k0 = 0; k0 < K; k0 += kBlockedB) {  // a row block fills the same floats either way
    std::memcpy(rows.data(), B + k0 * N, rows.size() * sizeof(float));
    block_b(kBlockedB, N, rows.data(), B + k0 * N);
  }
}

void block_bt(int64_t K, int64_t N, const float* Bt, int64_t ldbt, int64_t n, float* out) {
  const int64_t blocks = K / kBlockedB, panels = N / kBlockedB;
#pragma omp parallel for schedule(static) if (K * N >= (int64_t{1} << 20))
  for (int64_t p = 0; p < panels; ++p)  // a panel's 16 rows of Bt, every row block of them
    for (int64_t b = 0; b < blocks; ++b) {
      float* dst = out + (b * panels + p) * kBlockedB * kBlockedB;
      for (int64_t kk = 0; kk < kBlockedB; ++kk)
        for (int64_t jj = 0; jj < kBlockedB; ++jj) {
          const int64_t j = p * kBlockedB + jj, k = b * kBlockedB + kk;
          dst[kk * kBlockedB + jj] = j < n ? Bt[j * ldbt + k] : 0.0f;
        }
    }
}

void unblock_b(int64_t K, int64_t N, const float* blocked, float* out) {
  for (int64_t k0 = 0; k0 < K; k0 += kBlockedB)
    for (int64_t j = 0; j < N; j += kBlockedB)
      for (int64_t kk = 0; kk < kBlockedB; ++kk, blocked += kBlockedB)
        std::memcpy(out + (k0 + kk) * N + j, blocked, kBlockedB * sizeof(float));
}

}  // namespace mhsa::kernels
