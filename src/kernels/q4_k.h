// kernels/q4_k.h — the Q4_K block format of GGUF (ggml's block_q4_K), byte for byte: 256 weights in
// eight sub-blocks of 32, each weight a 4-bit quant q, each sub-block s a 6-bit scale sc[s] and a
// 6-bit min m[s], the block an f16 d and an f16 dmin: weight = (d·sc[s])·q − dmin·m[s]. 144 bytes
// per 256 weights (4.5 bits). This file says what a block is and how a row is quantised and
// restored; the kernels that multiply by Q4_K rows are dispatch.h's. Not public.
//
// Quantising (mhsa's own rule, not ggml's): per sub-block, the affine fit x ≈ a·q − b (q in
// 0..15, b ≥ 0) minimising the squared error, by a small grid of starting ranges each refined by
// alternating rounding and least squares; then d = max a / 63 and dmin = max b / 63 (as f16), the
// 6-bit sc, m rounded against them, and alternately the quants re-chosen and (d, dmin) refitted by
// least squares over the whole block, keeping the best. The result is judged by the squared error
// of the dequantised values, computed exactly as dequantize_row_q4_k computes them.
//
// Dequantising is ggml's (and the gguf Python package's) arithmetic, in float32 without fused
// multiply-adds: (d·sc)·q − dmin·m, each product rounded.
#pragma once

#include <cstdint>

namespace mhsa::kernels {

constexpr int64_t kQ4KBlock = 256;  // weights per block
constexpr int64_t kQ4KSub = 32;     // weights per sub-block

struct BlockQ4_K {
  uint16_t d;            // scale of the sub-block scales, IEEE f16
  uint16_t dmin;         // scale of the sub-block mins, IEEE f16
  uint8_t scales[12];    // eight 6-bit scales and eight 6-bit mins, packed as ggml packs them
  uint8_t qs[128];       // quants: byte 32·p + l holds weight 64·p + l (low nibble) and 64·p + 32 + l (high)
};
static_assert(sizeof(BlockQ4_K) == 144, "BlockQ4_K must match ggml's 144-byte block_q4_K");

// Sub-block s's 6-bit scale and min (s in 0..7).
inline void q4_k_scale_min(const BlockQ4_K& b, int s, int* sc, int* m) {
  const uint8_t* q = b.scales;
  if (s < 4) {
    *sc = q[s] & 63;
    *m = q[s + 4] & 63;
  } else {
    *sc = (q[s + 4] & 0x0f) | ((q[s - 4] >> 6) << 4);
    *m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
  }
}

// x [n] → out [n / 256]; n must be a multiple of 256 (the caller checks and names its argument).
// Non-finite inputs are the caller's to reject.
void quantize_row_q4_k(const float* x, int64_t n, BlockQ4_K* out);

// blocks [n / 256] → y [n].
void dequantize_row_q4_k(const BlockQ4_K* blocks, int64_t n, float* y);

// ---- The kernels' layout -----------------------------------------------------------------------
// The Q4_K kernels (dispatch.h's matmul_bt_q4_k, matmul_bt_parts_q4_k, gemm_bt_q4_k and their
// twins below) and nn::Q4Matrix keep a block's quants in an order of their own; d, dmin and the
// scales stay as ggml packs them. Numbering ggml's 32-byte runs of quants c = 0..3, each a vector
// of low nibbles (v = 2c) and one of high nibbles (v = 2c + 1), byte 4s + u (s < 8, u < 4) of
// vector v holds weight 32s + 4v + u of the block: every vector holds four weights of each of the
// eight sub-blocks, sub-block s in bytes 4s..4s+3. So the decode stream's eight byte products per
// block (vpmaddubsw against activations stored in the same order) add up vertically, lane pair s
// the sub-block s, where ggml's order (a vector per sub-block) needs a horizontal tree of seven
// vphaddw. The sums, and so every result, are the same; the order is the kernels' business only:
// files (GGUF) hold ggml's order, and quantize_row_q4_k / dequantize_row_q4_k read and write it.
//
//   qs[32c + 4s + u] = q(32s + 8c + u) | q(32s + 8c + 4 + u) << 4,   q(k) the block's k-th quant
void interleave_q4_k(BlockQ4_K* blocks, int64_t count);    // ggml's order → the kernels', in place
void deinterleave_q4_k(BlockQ4_K* blocks, int64_t count);  // the kernels' order → ggml's, in place
// dequantize_row_q4_k for blocks in the kernels' order.
void dequantize_row_q4_k_interleaved(const BlockQ4_K* blocks, int64_t n, float* y);

// The float64 twin of dispatch.h's Q4_K streams (matmul_bt_q4_k, matmul_bt_parts_q4_k): C[M, N]
// (ldc) = A[M, K] (lda) · B[N, K]ᵀ with B stored as Q4_K blocks (ldb in blocks, K a multiple of
// 256; B in the kernels' order), each row of A first quantised by quantize_activations_q8 (kernels/q8_0.h), then per
// 32-weight sub-block dA · (scale·Σ q·qa − offset·Σ qa) with the exact integer sums and the
// dequantiser's scale = d·sc, offset = dmin·m, summed in float64 — that is, the dequantised A
// times B's values scale·q − offset (dequantize_row_q4_k's values before their last rounding).
void matmul_bt_q4_k_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ4_K* B,
                        int64_t ldb, float* C, int64_t ldc);

// The float64 twin of gemm_bt_q4_k (many rows: A stays float; B in the kernels' order): A times
// B dequantised as dequantize_row_q4_k does, summed in float64.
void gemm_bt_q4_k_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ4_K* B, int64_t ldb,
                      float* C, int64_t ldc);

}  // namespace mhsa::kernels
