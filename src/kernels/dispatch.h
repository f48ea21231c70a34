// kernels/dispatch.h — the one boundary between portable code and per-ISA kernels.
//
// Every fast kernel is compiled once per ISA into namespace mhsa::kernels::<isa> (see
// cmake/isa.cmake and isa/simd.h); this header declares them all and kernels_for() hands out
// the table of one ISA. Callers above kernels/ never see an ISA. Not public.
#pragma once

#include <cstdint>

#include "core/cpu.h"
#include "kernels/attention_params.h"
#include "kernels/elementwise.h"
#include "kernels/q4_k.h"
#include "kernels/q8_0.h"
#include "mhsa/tensor.h"

namespace mhsa::kernels {

// One matrix of a matmul_bt_parts call: C[M, N] (ldc) = A · B[N, K]ᵀ (ldb).
struct BtPart {
  const float* B;
  int64_t ldb, N;
  float* C;
  int64_t ldc;
};

// matmul_bt_parts_bf16's part: B [N, K] (ldb) stored as bfloat16 (kernels/bf16.h).
struct BtPart16 {
  const uint16_t* B;
  int64_t ldb, N;
  float* C;
  int64_t ldc;
};

// matmul_bt_parts_f16's part: B [N, K] (ldb) stored as IEEE float16 (kernels/half.h).
struct BtPartF16 {
  const float16* B;
  int64_t ldb, N;
  float* C;
  int64_t ldc;
};

// matmul_bt_parts_q8_0's part: B [N, K] stored as Q8_0 blocks (kernels/q8_0.h), K a multiple of
// 32; ldb counts blocks (K / 32 for a whole matrix).
struct BtPartQ8 {
  const BlockQ8_0* B;
  int64_t ldb, N;
  float* C;
  int64_t ldc;
};

// matmul_bt_parts_q4_k's part: B [N, K] stored as Q4_K blocks in the kernels' order of quants
// (kernels/q4_k.h: interleave_q4_k), K a multiple of 256; ldb counts blocks (K / 256 for a whole matrix).
struct BtPartQ4K {
  const BlockQ4_K* B;
  int64_t ldb, N;
  float* C;
  int64_t ldc;
};

#define MHSA_DECLARE_ISA_KERNELS(isa)                                                                      \
  namespace isa {                                                                                          \
  void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,     \
            const float* bias, float* C, int64_t ldc);                                                     \
  void gemm_ex(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, bool trans_a, const float* B,  \
               int64_t ldb, bool trans_b, float* C, int64_t ldc, bool accumulate);                         \
  void gemm_blocked(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,           \
                    const float* bias, float* C, int64_t ldc);                                             \
  void attention_forward(const AttentionParams* ps, int64_t count);                                        \
  void attention_backward(const AttentionParams& p);                                                       \
  void layer_norm(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* gamma, const float* beta, \
                  float eps, float* y, int64_t ldy);                                                       \
  void layer_norm_backward(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* gamma, float eps,  \
                           const float* dy, int64_t lddy, float* dx, int64_t lddx, float* dgamma, float* dbeta);   \
  void rms_norm(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* w, float offset, float eps,    \
                float* y, int64_t ldy);                                                                    \
  void rms_norm_backward(int64_t rows, int64_t C, const float* x, int64_t ldx, const float* w, float offset,      \
                         float eps, const float* dy, int64_t lddy, float* dx, int64_t lddx, float* dw);           \
  void gelu_tanh(int64_t n, float* x);                                                                     \
  void glu(GluKind kind, int64_t rows, int64_t F, const float* gate, int64_t ldg, const float* up, int64_t ldu,  \
           float* out, int64_t ldo);                                                                       \
  void glu_backward(GluKind kind, int64_t rows, int64_t F, const float* gate, int64_t ldg, const float* up,       \
                    int64_t ldu, const float* dout, int64_t lddo, float* dgate, int64_t lddg, float* dup,         \
                    int64_t lddu);                                                                         \
  void softcap(int64_t rows, int64_t n, const float* x, int64_t ldx, float cap, float* y, int64_t ldy);          \
  void softcap_backward(int64_t rows, int64_t n, const float* x, int64_t ldx, float cap, float* dy,             \
                        int64_t lddy);                                                                     \
  void rope(int64_t rows, int64_t heads, int64_t head_dim, int64_t rotary_dim, float* x, int64_t ldx,            \
            const int64_t* positions, const float* table, bool backward);                                  \
  void gelu_tanh_backward(int64_t n, const float* z, const float* du, float* dz);                           \
  void matmul_bt(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,  \
                 float* C, int64_t ldc);                                                                   \
  void matmul_bt_parts(int64_t M, int64_t K, const float* A, int64_t lda, const BtPart* parts, int count);    \
  void matmul_bt_bf16(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B,        \
                      int64_t ldb, float* C, int64_t ldc);                                                   \
  void matmul_bt_parts_bf16(int64_t M, int64_t K, const float* A, int64_t lda, const BtPart16* parts,         \
                            int count);                                                                      \
  void gemm_bt_bf16(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B,          \
                    int64_t ldb, float* C, int64_t ldc);                                                     \
  void matmul_bt_q8_0(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ8_0* B,      \
                      int64_t ldb, float* C, int64_t ldc);                                                   \
  void matmul_bt_parts_q8_0(int64_t M, int64_t K, const float* A, int64_t lda, const BtPartQ8* parts,         \
                            int count);                                                                      \
  void gemm_bt_q8_0(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ8_0* B,          \
                    int64_t ldb, float* C, int64_t ldc);                                                     \
  void matmul_bt_q4_k(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ4_K* B,      \
                      int64_t ldb, float* C, int64_t ldc);                                                   \
  void matmul_bt_parts_q4_k(int64_t M, int64_t K, const float* A, int64_t lda, const BtPartQ4K* parts,        \
                            int count);                                                                      \
  void gemm_bt_q4_k(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ4_K* B,          \
                    int64_t ldb, float* C, int64_t ldc);                                                     \
  void gemm_bf16(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B,             \
                 int64_t ldb, float* C, int64_t ldc, bool accumulate);                                     \
  void matmul_bt_f16(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float16* B,          \
                     int64_t ldb, float* C, int64_t ldc);                                                    \
  void matmul_bt_parts_f16(int64_t M, int64_t K, const float* A, int64_t lda, const BtPartF16* parts,         \
                           int count);                                                                       \
  void gemm_bt_f16(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float16* B,            \
                   int64_t ldb, float* C, int64_t ldc);                                                      \
  void softmax_cross_entropy(int64_t rows, int64_t V, float* logits, int64_t ld, const int32_t* targets,     \
                             float scale, double* loss);                                                   \
  void adamw(int64_t n, float* w, const float* g, float* m, float* v, float lr, float decay, float beta1,    \
             float beta2, float inv_c1, float inv_c2, float eps);                                          \
  }
MHSA_DECLARE_ISA_KERNELS(portable)
MHSA_DECLARE_ISA_KERNELS(avx2)
MHSA_DECLARE_ISA_KERNELS(avx512)
#undef MHSA_DECLARE_ISA_KERNELS

// AVX512_BF16's dot product (kernels/gemm_bf16_dot.cpp), on x86 builds only; run where cpu::bf16_dot().
namespace avx512bf16 {
void gemm_bt_bf16_dot(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                      float* C, int64_t ldc);
bool attention_forward_bf16_dot(const AttentionParams& p);
bool attention_backward_bf16_dot(const AttentionParams& p);
}

// The Q8_0 streams built with AVX512_VNNI and with AVX-VNNI (kernels/matmul_q8_0.cpp), on x86
// builds only; the AVX-512 and AVX2 tables' entries where cpu::vnni(isa).
#define MHSA_DECLARE_VNNI_STREAMS(ns)                                                                           \
  namespace ns {                                                                                                \
  void matmul_bt_q8_0(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ8_0* B,          \
                      int64_t ldb, float* C, int64_t ldc);                                                      \
  void matmul_bt_parts_q8_0(int64_t M, int64_t K, const float* A, int64_t lda, const BtPartQ8* parts, int count); \
  }
MHSA_DECLARE_VNNI_STREAMS(avx512vnni)
MHSA_DECLARE_VNNI_STREAMS(avx2vnni)
#undef MHSA_DECLARE_VNNI_STREAMS

struct KernelTable {
  // C[M, N] = A[M, K] · B[K, N] + bias[N] (bias may be null); row-major with leading dimensions.
  // Deterministic: each element of C is summed by one thread in a fixed order.
  decltype(&portable::gemm) gemm;
  // C[M, N] (+)= op(A) · op(B): op(A) is A [M, K] (lda), or with trans_a the transpose of A stored
  // [K, M]; op(B) is B [K, N], or with trans_b the transpose of B stored [N, K]. accumulate: C +=.
  // For backward passes (dW += Xᵀ·dY, dX = dY·Wᵀ); deterministic like gemm.
  decltype(&portable::gemm_ex) gemm_ex;
  // gemm with B stored blocked (kernels/gemm.h: block_b; can_block(K, N), ldb N): bit for bit gemm
  // on the unblocked B, for every M (the same chains, read in another order). GPT-2's [in, out]
  // weights in the CLI's inference models, where 2–16-row decode steps read them 1.35x faster.
  decltype(&portable::gemm_blocked) gemm_blocked;
  // The FlashAttention forward (kernels/flash_attention.cpp) of `count` independent calls: lse, and
  // out when set. Calls on the decode path share one parallel region (a batched decode step).
  decltype(&portable::attention_forward) attention_forward;
  // The FlashAttention backward (kernels/flash_backward.cpp): dq, dk, dv.
  decltype(&portable::attention_backward) attention_backward;
  // LayerNorm and GELU (tanh approximation) rows; float64 twins in kernels/elementwise.h.
  decltype(&portable::layer_norm) layer_norm;
  decltype(&portable::gelu_tanh) gelu_tanh;
  decltype(&portable::gelu_tanh_backward) gelu_tanh_backward;  // dz = du · GELU'(z)
  // C[M, N] = A[M, K] · B[N, K]ᵀ for small M (kernels/matmul_bt.cpp), a bandwidth-bound stream
  // over B; deterministic like gemm.
  decltype(&portable::matmul_bt) matmul_bt;
  // matmul_bt of one A against several B matrices (q | k | v, gate | up) in one pass, their rows
  // shared by the threads in contiguous ranges (isa/bt_parts.h); each C element's bits are matmul_bt's.
  decltype(&portable::matmul_bt_parts) matmul_bt_parts;
  // Training: the softmax cross-entropy head and AdamW (float64 twins in kernels/elementwise.h).
  decltype(&portable::softmax_cross_entropy) softmax_cross_entropy;
  decltype(&portable::adamw) adamw;
  // The model families' row kernels, each defined by its float64 twin in kernels/elementwise.h:
  // the norms' backward passes (dx, dgamma, dbeta accumulated; sums across rows in float64, row
  // order), RMSNorm, the gated MLP activations, logit soft-capping, rotary embedding.
  decltype(&portable::layer_norm_backward) layer_norm_backward;
  decltype(&portable::rms_norm) rms_norm;
  decltype(&portable::rms_norm_backward) rms_norm_backward;
  decltype(&portable::glu) glu;
  decltype(&portable::glu_backward) glu_backward;
  decltype(&portable::softcap) softcap;
  decltype(&portable::softcap_backward) softcap_backward;
  decltype(&portable::rope) rope;
  // 16-bit weights: matmul_bt, matmul_bt_parts and gemm_ex's C = A·Bᵀ (gemm_bt_bf16, for many
  // rows: B widened while packed) with B [N, K] stored as bfloat16; each bitwise the float
  // kernel's on the widened B (widening is exact). Twin: matmul_bt_bf16_ref (kernels/bf16.h).
  decltype(&portable::matmul_bt_bf16) matmul_bt_bf16;
  decltype(&portable::matmul_bt_parts_bf16) matmul_bt_parts_bf16;
  decltype(&portable::gemm_bt_bf16) gemm_bt_bf16;
  // 8-bit weights: the same three with B [N, K] stored as Q8_0 blocks (K a multiple of 32, ldb in
  // blocks). The streams (matmul_bt_q8_0, _parts_q8_0; decoding, any M they are given) quantise
  // each row of A per 32-value block (kernels::quantize_activations_q8: int8 quants, a float
  // scale, ggml's reference rounding) and sum each block's products as exact integers in 8 lanes
  // of 4, each lane then one FMA with the product of the two scales, the 8 lane chains over the
  // blocks added by one fixed tree (the contract is spelled out at dot_q8 in matmul_bt.cpp): the
  // same bits whatever the grouping, the thread count or the number of rows, and on every ISA
  // with FMA. Twin: matmul_bt_q8_0_ref (kernels/q8_0.h), the dequantised A times the dequantised
  // B in float64. gemm_bt_q8_0 (many rows: prefill) keeps A in float32 and dequantises B while
  // packing (d·q, one rounding: dequantize_row_q8_0's values), so its bits are gemm_ex's on the
  // dequantised B. Twin: gemm_bt_q8_0_ref.
  decltype(&portable::matmul_bt_q8_0) matmul_bt_q8_0;
  decltype(&portable::matmul_bt_parts_q8_0) matmul_bt_parts_q8_0;
  decltype(&portable::gemm_bt_q8_0) gemm_bt_q8_0;
  // 4-bit weights: the same three with B [N, K] stored as Q4_K blocks in the kernels' order of
  // quants (kernels/q4_k.h; K a multiple of 256, ldb in blocks; kernels/matmul_q4_k.cpp). The streams quantise A as the Q8_0 streams do and sum each
  // 32-weight sub-block's Σ q·qa as an exact integer (the nibbles unsigned against the signed
  // quants); lane s of 8 holds sub-block s, one FMA with d·sc·dA and one with −dmin·m and dA·Σqa
  // per block, the lanes added by one fixed tree (spelled out at the top of matmul_q4_k.cpp): the
  // same bits whatever the grouping, the thread count or the number of rows, and on every ISA
  // with FMA. Twin: matmul_bt_q4_k_ref (kernels/q4_k.h), the dequantised A times B in float64.
  // gemm_bt_q4_k keeps A in float32 and dequantises B while packing (dequantize_row_q4_k's
  // values, dequantize_row_q4_k_interleaved), so its bits are gemm_ex's on the dequantised B. Twin: gemm_bt_q4_k_ref.
  decltype(&portable::matmul_bt_q4_k) matmul_bt_q4_k;
  decltype(&portable::matmul_bt_parts_q4_k) matmul_bt_parts_q4_k;
  decltype(&portable::gemm_bt_q4_k) gemm_bt_q4_k;
  // Training with bfloat16 weights (mhsa train --dtype bf16): C[M, N] (+)= A[M, K] · B[K, N] with
  // B stored as bfloat16 (dX = dY·W of a weight W [out, in]), B widened while packed: bitwise
  // gemm_ex's packed path on the widened B (gemm_ex's own bits when it accumulates, or for M >
  // 16 rows, where its plain chains are gemm's too). Twin: gemm_bf16_ref (kernels/bf16.h).
  decltype(&portable::gemm_bf16) gemm_bf16;
  // 16-bit weights stored as IEEE float16 (F16 checkpoints kept as stored): the three bfloat16
  // kernels above with B [N, K] of float16, widened exactly (F16C's vcvtph2ps where the ISA has
  // it), so each is bitwise the float kernel's on the widened B. Twin: matmul_bt_f16_ref
  // (kernels/half.h).
  decltype(&portable::matmul_bt_f16) matmul_bt_f16;
  decltype(&portable::matmul_bt_parts_f16) matmul_bt_parts_f16;
  decltype(&portable::gemm_bt_f16) gemm_bt_f16;
  // C[M, N] = bf16(A) · B[N, K]ᵀ with B stored as bfloat16 and A rounded to bfloat16 (nearest
  // even), each element one float32 chain over K's pairs (vdpbf16ps; spelled out in
  // kernels/gemm_bf16_dot.cpp): prefill and training's forward over bfloat16 weights, about twice
  // gemm_bt_bf16's arithmetic rate. Null unless the CPU has AVX512_BF16 and the table is
  // AVX-512's (cpu::bf16_dot()); callers fall back to gemm_bt_bf16. Twin: gemm_bt_bf16_dot_ref.
  decltype(&avx512bf16::gemm_bt_bf16_dot) gemm_bt_bf16_dot = nullptr;
  // The attention forward for bfloat16 q, k, v (p.bf16_values) with Q·Kᵀ and P·V on bfloat16 pairs,
  // P rounded to bfloat16 (kernels/flash_attention_bf16.cpp); false, having done nothing, for the
  // shapes it does not take (decode, float16 or paged caches). Null where
  // gemm_bt_bf16_dot is. Twin: attention_forward_ref (within the rounding of P).
  decltype(&avx512bf16::attention_forward_bf16_dot) attention_forward_bf16_dot = nullptr;
  // The attention backward for bfloat16 inputs (p.bf16_values) with its five products on bfloat16
  // pairs, P and dS rounded to bfloat16 (kernels/flash_backward_bf16.cpp); false, having done
  // nothing, for the shapes the forward's dot product does not take. Set where
  // attention_forward_bf16_dot is. Twin: attention_backward_ref (within the rounding of P and dS).
  decltype(&avx512bf16::attention_backward_bf16_dot) attention_backward_bf16_dot = nullptr;
  // The GEMM for many rows over bfloat16 weights: gemm_bt_bf16_dot where there is one.
  decltype(&portable::gemm_bt_bf16) gemm_bt_bf16_many() const { return gemm_bt_bf16_dot ? gemm_bt_bf16_dot : gemm_bt_bf16; }
};

const KernelTable& kernels_for(cpu::Isa isa);
inline const KernelTable& kernels() { return kernels_for(cpu::best_isa()); }

}  // namespace mhsa::kernels
