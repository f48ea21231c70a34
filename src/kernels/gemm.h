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

// ---- B stored blocked (gemm_blocked) -----------------------------------------------------------
// B [K, N] as [K/16][N/16][16][16]: row blocks of 16 rows, each cut into 16-column panels of 16 ×
// 16 floats (row-major inside), the panels of a row block one after another. gemm's small-M paths
// walk 16 rows of B across all columns a 16-column panel at a time; on the [K, N] layout that reads
// 16 interleaved streams, ldb apart, while blocked it is one ascending stream (GPT-2's 48
// projections at 8 rows on a 2-core Zen 3: 1.25-1.35x, bench/bench_blocked_b.cpp; an 8-sequence
// decode step 1.13x, docs/performance-history.md). Only for K a multiple of 16 and N of 32 (every panel of
// every ISA's micro-tile whole).
constexpr int64_t kBlockedB = 16;
inline bool can_block(int64_t K, int64_t N) { return K > 0 && N > 0 && K % 16 == 0 && N % 32 == 0; }
// Where B[k, j] is in the blocked layout.
inline int64_t blocked_index(int64_t k, int64_t j, int64_t N) {
  return ((k / kBlockedB * (N / kBlockedB) + j / kBlockedB) * kBlockedB + k % kBlockedB) * kBlockedB + j % kBlockedB;
}
// out = B [K, N] (row-major) blocked, and back (can_block(K, N); out does not alias B).
void block_b(int64_t K, int64_t N, const float* B, float* out);
void unblock_b(int64_t K, int64_t N, const float* blocked, float* out);
// B blocked where it is, a row block at a time through a buffer of one (16·N floats): no second
// copy of the matrix, no new pages (a model's weights are blocked at load this way).
void block_b_in_place(int64_t K, int64_t N, float* B);
// out = B [K, N] blocked, for the B with B[k, j] = Bt[j·ldbt + k] for j < n and 0 for n <= j < N: a
// matrix stored transposed ([n, K]: an LM head's [V, C]) blocked as gemm_blocked reads it, its
// columns padded with zeros to N (can_block(K, N), 0 < n <= N; out does not alias Bt).
void block_bt(int64_t K, int64_t N, const float* Bt, int64_t ldbt, int64_t n, float* out);

}  // namespace mhsa::kernels
