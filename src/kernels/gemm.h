// kernels/gemm.h — the matrix multiply under every projection: C = A·B (+ bias).
// Row-major with leading dimensions, so column blocks of a fused weight (W_q, W_kv inside
// W_qkv) are used in place. Not a BLAS: no transposes, no alpha/beta, float32 only.
#pragma once

#include <cstdint>

namespace mhsa::kernels {

// C[M, N] = A[M, K] · B[K, N] + bias[N] (bias may be null). Scalar, float64 accumulation: the
// oracle for fast GEMMs. Rows of C are independent; the OpenMP split cannot change results.
void gemm_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
              int64_t ldb, const float* bias, float* C, int64_t ldc);

}  // namespace mhsa::kernels
