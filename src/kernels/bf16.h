// kernels/bf16.h — bfloat16 (the upper 16 bits of a float32) for 16-bit weights: the scalar
// conversions, and the float64 twin of the kernels that read a bfloat16 B (dispatch.h's
// matmul_bt_bf16, matmul_bt_parts_bf16, gemm_bt_bf16, gemm_bf16). Storage only: no bfloat16 arithmetic,
// every product is float32 after exact widening. Not public.
#pragma once

#include <cstdint>
#include <cstring>

namespace mhsa::kernels {

inline float bf16_to_float(uint16_t h) {
  const uint32_t w = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &w, sizeof(float));
  return f;
}

inline float widen(float x) { return x; }
inline float widen(uint16_t h) { return bf16_to_float(h); }

// Rounded to nearest, ties to even (as torch's .to(torch.bfloat16)); NaN stays NaN (quiet, sign
// kept), ±inf and values that round past the largest bfloat16 become ±inf.
inline uint16_t float_to_bf16(float f) {
  uint32_t w;
  std::memcpy(&w, &f, sizeof(float));
  if ((w & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((w >> 16) | 0x0040u);
  w += 0x7fffu + ((w >> 16) & 1u);
  return static_cast<uint16_t>(w >> 16);
}

// C[M, N] (ldc) = A[M, K] (lda) · B[N, K]ᵀ (ldb, bfloat16), summed in float64. Rows of C are
// independent; the OpenMP split cannot change results.
void matmul_bt_bf16_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                        float* C, int64_t ldc);

// C[M, N] (ldc) (+)= A[M, K] (lda) · B[K, N] (ldb, bfloat16), summed in float64 (from C's value
// when accumulate).
void gemm_bf16_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                   float* C, int64_t ldc, bool accumulate);

// gemm_bt_bf16_dot's twin: C[M, N] (ldc) = bf16(A)[M, K] (lda) · B[N, K]ᵀ (ldb, bfloat16), A
// rounded to bfloat16 by float_to_bf16 and the products summed in float64.
void gemm_bt_bf16_dot_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B,
                          int64_t ldb, float* C, int64_t ldc);

}  // namespace mhsa::kernels
