// kernels/bf16_ref.cpp — the float64 twins of the 16-bit-weight kernels: bfloat16 (see bf16.h)
// and IEEE float16 (half.h).
#include "kernels/bf16.h"
#include "kernels/half.h"

namespace mhsa::kernels {

namespace {

// C = A · Bᵀ in float64 with B's 16-bit elements widened by `widen`.
template <class Widen>
void matmul_bt_16_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                      float* C, int64_t ldc, Widen widen) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += double{A[i * lda + k]} * widen(B[j * ldb + k]);
      C[i * ldc + j] = static_cast<float>(acc);
    }
}

}  // namespace

void matmul_bt_bf16_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                        float* C, int64_t ldc) {
  matmul_bt_16_ref(M, N, K, A, lda, B, ldb, C, ldc, bf16_to_float);
}

void matmul_bt_f16_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                       float* C, int64_t ldc) {
  matmul_bt_16_ref(M, N, K, A, lda, B, ldb, C, ldc, f16_to_float);
}

void gemm_bt_bf16_dot_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B,
                          int64_t ldb, float* C, int64_t ldc) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += double{bf16_to_float(float_to_bf16(A[i * lda + k]))} * bf16_to_float(B[j * ldb + k]);
      C[i * ldc + j] = static_cast<float>(acc);
    }
}

void gemm_bf16_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                   float* C, int64_t ldc, bool accumulate) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = accumulate ? double{C[i * ldc + j]} : 0.0;
      for (int64_t k = 0; k < K; ++k) acc += double{A[i * lda + k]} * bf16_to_float(B[k * ldb + j]);
      C[i * ldc + j] = static_cast<float>(acc);
    }
}

}  // namespace mhsa::kernels
