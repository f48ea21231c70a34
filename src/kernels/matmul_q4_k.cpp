// kernels/matmul_q4_k.cpp — C[M, N] = A[M, K] · B[N, K]ᵀ for a few rows M with B stored as Q4_K
// blocks (kernels/q4_k.h: 144 bytes per 256 weights, a ninth of float32's bytes), compiled once
// per ISA: the weight streams of decoding a 4-bit model. The same plan as matmul_bt.cpp's
// streams: several matrices that multiply one A are one call, their rows one row space that the
// threads share in groups of kGroup rows, contiguous ranges read in order (isa/bt_parts.h: one
// even range a thread for one row of A, claimed ones for more); with one row of A, row i of each
// quarter of a range side by side, each row its own
// ascending stream (as the 16-bit and Q8_0 one-row streams). B's quants are in the
// kernels' order (kernels/q4_k.h), and so are A's quants here (activations_in_kernel_order), so
// that a block's eight byte-product vectors add up vertically: 1.37× ggml's order's horizontal
// tree on one core with B in L3 (docs/performance-history.md,
// "Q4_K decode: quants in an order whose byte products add vertically").
//
// The arithmetic: each row of A is quantised once per call per 32-value block, bit for bit as the
// Q8_0 streams quantise it (kernels::quantize_activations_q8; isa/q8_activations.h), and Q4_K's
// 32-weight sub-blocks line up with those blocks. Sub-block s of block b holds weights
// scale·q − offset (scale = d·sc[s], offset = dmin·m[s], each one exact float product of the f16
// d or dmin and the 6-bit integer, as the dequantiser rounds them) with q in 0..15: an unsigned
// operand for vpmaddubsw against the signed activation quants, no sign trick. With dA the A
// block's scale, Σqa its quants' sum (both per call, per A block: dA·Σqa is precomputed, one
// rounding) and Σq·qa the exact integer sum, an element of C is, on every ISA:
//
//   for each block b in order, for each lane s < 8 (the sub-block):
//     acc[s] = fma(scale · dA, Σ q·qa, acc[s])
//     acc[s] = fma(−offset, dA·Σqa, acc[s])
//   C = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))
//
// scale · dA is one float product; the integer sums are exact (|Σ q·qa| ≤ 32·15·127, exact as a
// float too); fma is fused where the ISA has FMA (AVX2, AVX-512, NEON; the portable build on x86
// multiplies and adds); the last line is simd.h's 8-lane tree. So the chain depends on nothing
// but the inputs: not the grouping, the thread count, the number of rows, nor (given FMA) the
// ISA. The AVX-512 build runs the same 256-bit code as AVX2 (as the Q8_0 streams do). A block of
// A holding a NaN or ±inf has dA = NaN: every output of its row is NaN. Its float64 twin:
// matmul_bt_q4_k_ref, the dequantised A times B's values scale·q − offset. Not for large M:
// gemm_bt_q4_k (gemm.cpp), which keeps A in float32.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/isa/simd.h"
#include "kernels/isa/bt_parts.h"
#include "kernels/isa/q8_activations.h"

namespace mhsa::kernels::MHSA_ISA {
namespace {

constexpr int kSubs = static_cast<int>(kQ4KBlock / kQ4KSub);  // 8 sub-blocks: the 8 lanes

// A block's eight 6-bit scales (low word) and mins (high word), one byte each in sub-block order,
// unpacked from ggml's packing (q4_k_scale_min) a 32-bit word at a time (little-endian): bytes
// 0–3 of scales[] hold sc[0..3] and, in their top 2 bits, the high bits of sc[4..7]; bytes 4–7
// likewise m[0..3] and m[4..7]'s; bytes 8–11 the low 4 bits of sc[4..7] (low nibble) and
// m[4..7] (high nibble).
inline void unpack_scales(const BlockQ4_K& blk, uint64_t* sc, uint64_t* m) {
  uint32_t w[3];
  std::memcpy(w, blk.scales, sizeof(w));
  const uint32_t sc_lo = w[0] & 0x3F3F3F3Fu, m_lo = w[1] & 0x3F3F3F3Fu;
  const uint32_t sc_hi = (w[2] & 0x0F0F0F0Fu) | ((w[0] >> 2) & 0x30303030u);
  const uint32_t m_hi = ((w[2] >> 4) & 0x0F0F0F0Fu) | ((w[1] >> 2) & 0x30303030u);
  *sc = sc_lo | uint64_t{sc_hi} << 32;
  *m = m_lo | uint64_t{m_hi} << 32;
}

#if defined(__AVX2__)  // the avx2 and avx512 builds: 256-bit integer dot products
// 8 bytes as 8 float lanes (exact).
inline Lanes byte_lanes(uint64_t bytes) {
  return (Lanes)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(bytes))));
}

// The block's 8 exact sums Σ q·qa, sub-block s in lane s, as floats; qs in the kernels' order and
// qa the 256 activation quants under the block in the same order (kernels/q4_k.h: byte 4s + u of
// each 32-byte vector belongs to sub-block s). vpmaddubsw multiplies the nibbles (unsigned) by qa
// (signed, never −128) and adds pairs into int16 (|pair| ≤ 2·15·127); the eight vectors' int16
// lanes add vertically (each lane 8 pairs: |sum| ≤ 16·15·127 < 2¹⁵, no wrap-around), lanes 2s and
// 2s + 1 sub-block s's, and vpmaddwd adds each such pair into int32 lane s.
inline Lanes sub_block_sums(const uint8_t* qs, const int8_t* qa) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256i sum = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {  // vectors 2c (low nibbles) and 2c + 1 (high nibbles)
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
    const __m256i a_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa + 64 * c));
    const __m256i a_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa + 64 * c + 32));
    sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(_mm256_and_si256(w, low), a_lo));
    sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(w, 4), low), a_hi));
  }
  return (Lanes)_mm256_cvtepi32_ps(_mm256_madd_epi16(sum, _mm256_set1_epi16(1)));
}
#else  // 4-lane vectors: scalar integer sums
inline Lanes byte_lanes(uint64_t bytes) {
  float v[kSubs];
  for (int s = 0; s < kSubs; ++s) v[s] = static_cast<float>((bytes >> (8 * s)) & 0xFF);
  return load8(v);
}

inline Lanes sub_block_sums(const uint8_t* qs, const int8_t* qa) {  // both in the kernels' order
  float sums[kSubs];
  for (int s = 0; s < kSubs; ++s) {
    int32_t sum = 0;
    for (int v = 0; v < 8; ++v)
      for (int u = 0; u < 4; ++u)
        sum += ((qs[32 * (v / 2) + 4 * s + u] >> (4 * (v % 2))) & 15) * int32_t{qa[32 * v + 4 * s + u]};
    sums[s] = static_cast<float>(sum);
  }
  return load8(sums);
}
#endif

// One row of the quantised A (K values) into the kernels' order, block by block: byte 32v +
// 4s + u of a 256-value block ← value 32s + 4v + u (an 8 × 8 transpose of 4-byte words).
inline void activations_in_kernel_order(const int8_t* q, int64_t K, int8_t* out) {
  for (int64_t b = 0; b < K / kQ4KBlock; ++b) {
    uint32_t w[kSubs][kSubs], t[kSubs][kSubs];  // [s][v] → [v][s]
    std::memcpy(w, q + b * kQ4KBlock, sizeof(w));
    for (int s = 0; s < kSubs; ++s)
      for (int v = 0; v < kSubs; ++v) t[v][s] = w[s][v];
    std::memcpy(out + b * kQ4KBlock, t, sizeof(t));
  }
}

// One block's coefficients, sub-block s in lane s: scale = d·sc[s] and −offset = −(dmin·m[s]).
struct Coefficients {
  Lanes scale, neg_offset;
};
inline Coefficients coefficients(const BlockQ4_K& blk) {
  uint64_t sc, m;
  unpack_scales(blk, &sc, &m);
  return {mul8(splat8(f16_scalar(blk.d)), byte_lanes(sc)), mul8(splat8(-f16_scalar(blk.dmin)), byte_lanes(m))};
}

// A quantised, with dA·Σqa per block: sums [M, nb] (rows nb apart).
struct Activations {
  QuantizedA a;
  const float* sums;
};

// out[r·ldc + j·apart] = row m + r of A · B row j·apart for R rows of A and J rows of B (`apart`
// rows of ldb blocks from each other): the chain above for each (r, j), the same whatever R, J
// and apart. With one row of A, each row of B is its own ascending stream, prefetched
// kQ4Prefetch bytes ahead once per block (past the row: the next row, when rows are contiguous).
constexpr int64_t kQ4Prefetch = 2048;

template <int R, int J>
void dot_q4k(const Activations& x, int64_t m, const BlockQ4_K* B, int64_t ldb, int64_t apart, float* out,
             int64_t ldc) {
  const QuantizedA& a = x.a;
  Lanes acc[R][J] = {};
  for (int64_t b = 0; b < a.nb / kSubs; ++b) {
    for (int j = 0; j < J; ++j) {
      const BlockQ4_K& blk = B[j * apart * ldb + b];
      if constexpr (R == 1)
        for (int line = 0; line < 3; ++line)
          __builtin_prefetch(reinterpret_cast<const char*>(&blk) + kQ4Prefetch + 64 * line);
      const Coefficients co = coefficients(blk);
      for (int r = 0; r < R; ++r) {
        const int64_t ib = (m + r) * a.nb + b * kSubs;  // the row's first A block under this block
        const Lanes sums = sub_block_sums(blk.qs, a.q + (m + r) * a.K + b * kQ4KBlock);
        acc[r][j] = fused8(mul8(co.scale, load8(a.d + ib)), sums, acc[r][j]);
        acc[r][j] = fused8(co.neg_offset, load8(x.sums + ib), acc[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) out[r * ldc + j * apart] = sum8(acc[r][j]);
}

// C[M, rows] = A · B[rows, K/256 blocks]ᵀ (ldb in blocks) with A quantised, in stream_rows' order
// (isa/bt_parts.h): one row of A against four rows of B at a time, a quarter of the range apart,
// or each group of kGroup rows in turn against kRows rows of A at a time. Four rows: GPT-2 124M's
// Q4_K weights from memory, 2 threads, pass-by-pass alternation on a Zen 5: 1.13-1.15x two rows,
// three 1.08x, six 1.09x, eight 1.07x (docs/performance-history.md,
// "A Zen 5: the 8-row tiles in 512-bit registers").
void range_product(const Activations& x, int64_t M, const BlockQ4_K* B, int64_t ldb, int64_t rows, float* C,
                   int64_t ldc) {
  stream_rows<4>(M, rows, [&](auto R, auto J, int64_t m, int64_t n, int64_t apart) {
    dot_q4k<decltype(R)::value, decltype(J)::value>(x, m, B + n * ldb, ldb, apart, C + m * ldc + n, ldc);
  });
}

}  // namespace

void matmul_bt_parts_q4_k(int64_t M, int64_t K, const float* A, int64_t lda, const BtPartQ4K* parts, int count) {
  const QuantizedA a = quantize_a(M, K, A, lda);
  thread_local std::vector<float> sums;  // dA·Σqa per A block: the calling thread's scratch
  if (static_cast<int64_t>(sums.size()) < M * a.nb) sums.resize(static_cast<size_t>(M * a.nb));
  for (int64_t i = 0; i < M * a.nb; ++i) {
    int32_t s = 0;
    for (int64_t k = 0; k < kQ8Block; ++k) s += a.q[i * kQ8Block + k];
    sums[static_cast<size_t>(i)] = a.d[i] * static_cast<float>(s);
  }
  thread_local std::vector<int8_t> ordered;  // A's quants in the kernels' order (kernels/q4_k.h)
  if (static_cast<int64_t>(ordered.size()) < M * K) ordered.resize(static_cast<size_t>(M * K));
  for (int64_t i = 0; i < M; ++i) activations_in_kernel_order(a.q + i * K, K, ordered.data() + i * K);
  const Activations x{{ordered.data(), a.d, a.K, a.nb}, sums.data()};
  parts_product(K, parts, count, /*even=*/M == 1, [&](const BtPartQ4K& part, int64_t n0, int64_t n) {
    range_product(x, M, part.B + n0 * part.ldb, part.ldb, n, part.C + n0, part.ldc);
  });
}

void matmul_bt_q4_k(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ4_K* B, int64_t ldb,
                    float* C, int64_t ldc) {
  const BtPartQ4K part{B, ldb, N, C, ldc};
  matmul_bt_parts_q4_k(M, K, A, lda, &part, 1);
}

}  // namespace mhsa::kernels::MHSA_ISA
