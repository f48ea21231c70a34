// kernels/q8_0.cpp — the Q8_0 reference quantiser and dequantiser (kernels/q8_0.h). Scalar: run
// once per weight at load or when writing a file, never on the decode path; the activations'
// quantiser as the decode kernels define it; and the float64 twins of the kernels that multiply
// by Q8_0 rows.
#include "kernels/q8_0.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/half.h"

namespace mhsa::kernels {

void quantize_row_q8_0(const float* x, int64_t n, BlockQ8_0* out) {
  for (int64_t b = 0; b < n / kQ8Block; ++b) {
    const float* xb = x + b * kQ8Block;
    float amax = 0.0f;
    for (int64_t i = 0; i < kQ8Block; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    out[b].d = float_to_f16(d);
    for (int64_t i = 0; i < kQ8Block; ++i) out[b].qs[i] = static_cast<int8_t>(std::roundf(xb[i] * id));
  }
}

void dequantize_row_q8_0(const BlockQ8_0* blocks, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQ8Block; ++b) {
    const float d = f16_to_float(blocks[b].d);
    for (int64_t i = 0; i < kQ8Block; ++i) y[b * kQ8Block + i] = d * static_cast<float>(blocks[b].qs[i]);
  }
}

void quantize_activations_q8(const float* x, int64_t n, int8_t* q, float* d) {
  for (int64_t b = 0; b < n / kQ8Block; ++b) {
    const float* xb = x + b * kQ8Block;
    int8_t* qb = q + b * kQ8Block;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < kQ8Block; ++i) {
      finite = finite && std::isfinite(xb[i]);
      amax = std::fmax(amax, std::fabs(xb[i]));
    }
    d[b] = !finite ? std::numeric_limits<float>::quiet_NaN() : amax / 127.0f;
    if (!(d[b] >= std::numeric_limits<float>::min())) {  // NaN, zero or subnormal
      if (finite) d[b] = 0.0f;
      std::fill(qb, qb + kQ8Block, int8_t{0});
      continue;
    }
    const float id = 1.0f / d[b];
    for (int64_t i = 0; i < kQ8Block; ++i) qb[i] = static_cast<int8_t>(std::roundf(xb[i] * id));
  }
}

void matmul_bt_q8_0_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ8_0* B,
                        int64_t ldb, float* C, int64_t ldc) {
  const int64_t nb = K / kQ8Block;
  std::vector<int8_t> qa(static_cast<size_t>(M * K));
  std::vector<float> da(static_cast<size_t>(M * nb));
  for (int64_t i = 0; i < M; ++i) quantize_activations_q8(A + i * lda, K, qa.data() + i * K, da.data() + i * nb);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < N; ++j)
    for (int64_t i = 0; i < M; ++i) {
      double acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const BlockQ8_0& w = B[j * ldb + b];
        const int8_t* x = qa.data() + i * K + b * kQ8Block;
        int64_t s = 0;
        for (int64_t k = 0; k < kQ8Block; ++k) s += int64_t{x[k]} * w.qs[k];
        acc += double{da[static_cast<size_t>(i * nb + b)]} * f16_to_float(w.d) * static_cast<double>(s);
      }
      C[i * ldc + j] = static_cast<float>(acc);
    }
}

void gemm_bt_q8_0_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ8_0* B, int64_t ldb,
                      float* C, int64_t ldc) {
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < N; ++j) {
    std::vector<float> b(static_cast<size_t>(K));
    dequantize_row_q8_0(B + j * ldb, K, b.data());
    for (int64_t i = 0; i < M; ++i) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += double{A[i * lda + k]} * b[static_cast<size_t>(k)];
      C[i * ldc + j] = static_cast<float>(acc);
    }
  }
}

}  // namespace mhsa::kernels
