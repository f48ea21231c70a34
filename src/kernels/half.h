// kernels/half.h — IEEE binary16 (f16) to and from float32, exact and portable (no F16C needed):
// widening is exact; narrowing rounds to nearest, ties to even, overflows to ±inf, keeps NaN a NaN.
// Used by the safetensors reader/writer, GGUF, the Q8_0 block scales and 16-bit weights stored
// as float16 (Model::load with WeightType::f16), whose kernels' float64 twin is declared here.
// Not public.
#pragma once

#include <cstdint>
#include <cstring>

namespace mhsa::kernels {

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    uint32_t m = mant;
    do {
      ++e;
      m <<= 1;
    } while ((m & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Branch-free (a 16-bit KV cache narrows every new key and value: 1.1 ns an element against the
// 4.2 of a branching form, and bit for bit that form's result for all 2^32 inputs, checked
// exhaustively). |f| ≥ 2^-14 rebias the exponent and round at bit 13
// (adding 0xfff plus the kept part's lowest bit: ties to even; a carry may reach the exponent, up
// to inf at 65520); |f| < 2^-14 (f16 subnormals and zero) add 0.5f, whose sum's low mantissa bits
// are the f16 subnormal, rounded to nearest even by the float add itself (the default rounding
// mode); |f| ≥ 65536, ±inf → ±inf; NaN → a quiet NaN of its sign (0x7e00).
inline uint16_t float_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  const uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  float magnitude;
  std::memcpy(&magnitude, &a, 4);
  const float shifted = magnitude + 0.5f;
  uint32_t s;
  std::memcpy(&s, &shifted, 4);
  const uint32_t subnormal = s - 0x3f000000u;
  const uint32_t huge = a > 0x7f800000u ? 0x7e00u : 0x7c00u;
  return static_cast<uint16_t>(sign | (a >= 0x47800000u ? huge : a < 0x38800000u ? subnormal : normal));
}

// C[M, N] (ldc) = A[M, K] (lda) · B[N, K]ᵀ (ldb, IEEE float16 bits), summed in float64: the twin
// of dispatch.h's matmul_bt_f16, matmul_bt_parts_f16 and gemm_bt_f16 (kernels/bf16_ref.cpp).
void matmul_bt_f16_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                       float* C, int64_t ldc);

}  // namespace mhsa::kernels
