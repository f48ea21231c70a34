// kernels/q8_0.h — the Q8_0 block format of GGUF (ggml's block_q8_0), byte for byte: 32 weights
// as int8 with one f16 scale, weight = scale · q. 34 bytes per 32 weights (8.5 bits). This file
// says what a block is and how a row is quantised and restored; the kernels that multiply by
// quantised rows are dispatch.h's. Not public.
//
// Quantising a row of 32·n floats: per block, amax = max |x|, scale d = amax / 127, q = round(x / d)
// (half away from zero, as roundf; a zero block gets d = 0, q = 0), and d is stored as f16 (rounded
// to nearest even). This is ggml's reference quantiser, so a file we write equals one ggml writes
// from the same floats. Dequantising is f16_to_float(d) · q, exactly as ggml does.
#pragma once

#include <cstdint>

#include "mhsa/tensor.h"

namespace mhsa::kernels {

constexpr int64_t kQ8Block = 32;  // weights per block

using ::mhsa::BlockQ8_0;  // (mhsa/tensor.h: public, the element of a Q8_0 KV cache)
static_assert(kQ8Block == sizeof(BlockQ8_0::qs));

// x [n] → out [n / 32]; n must be a multiple of 32 (the caller checks and names its argument).
// Non-finite inputs are the caller's to reject: a NaN or inf makes the block's scale non-finite.
void quantize_row_q8_0(const float* x, int64_t n, BlockQ8_0* out);

// blocks [n / 32] → y [n].
void dequantize_row_q8_0(const BlockQ8_0* blocks, int64_t n, float* y);

// A row of activations x [n] (n a multiple of 32) quantised per 32-value block for the decode
// kernels' integer dot products: q [n] int8 and d [n / 32] float scales, x ≈ d·q. Per block as
// quantize_row_q8_0 (amax = max |x|, d = amax / 127, q = roundf(x · (1 / d)), ggml's reference
// rounding, half away from zero), but d stays float32 (not rounded to f16), and two cases ggml
// leaves undefined are fixed: a block holding a NaN or ±inf gets d = NaN (every product it
// enters is NaN, as the float product would be NaN or ±inf) and q = 0; a block whose d would be
// below FLT_MIN (zero or subnormal, where 1 / d overflows) gets d = 0 and q = 0.
void quantize_activations_q8(const float* x, int64_t n, int8_t* q, float* d);

// The float64 twin of dispatch.h's Q8_0 streams (matmul_bt_q8_0, matmul_bt_parts_q8_0): C[M, N]
// (ldc) = A[M, K] (lda) · B[N, K]ᵀ with B stored as Q8_0 blocks (ldb in blocks, K a multiple of
// 32), each row of A first quantised by quantize_activations_q8, then per block b the exact
// integer Σ qa·qb times dA_b · dB_b, summed in float64 — that is, the dequantised A times the
// dequantised B.
void matmul_bt_q8_0_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ8_0* B,
                        int64_t ldb, float* C, int64_t ldc);

// The float64 twin of gemm_bt_q8_0 (many rows: A stays float): A times B dequantised as
// dequantize_row_q8_0 does, summed in float64.
void gemm_bt_q8_0_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ8_0* B, int64_t ldb,
                      float* C, int64_t ldc);

}  // namespace mhsa::kernels
