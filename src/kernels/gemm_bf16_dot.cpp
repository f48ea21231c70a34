// kernels/gemm_bf16_dot.cpp — C = bf16(A) · Bᵀ for a bfloat16 B [N, K] on AVX512_BF16's dot
// product (vdpbf16ps): prefill and training's forward over 16-bit weights on CPUs that have it
// (Zen 4 and later, Intel since Cooper Lake). Compiled only for x86 with -mavx512bf16 and called
// only where cpu::bf16_dot() says the CPU runs it (dispatch.h: gemm_bt_bf16_dot).
//
// What it computes (its float64 twin is bf16.h's gemm_bt_bf16_dot_ref): A is rounded to bfloat16
// (nearest even, vcvtne2ps2bf16), so every product of a bfloat16 pair is exact in float32, and each
// element of C is one float32 chain over K's pairs in ascending order, c = 0; for p = 0, 1, ...:
// c += a[2p+1]·b[2p+1], c += a[2p]·b[2p] (the instruction's order; K odd: a zero pair member).
// Both instructions treat bfloat16 denormals as zero. The chain is stored and reloaded between K
// blocks (exact), so blocking, tile shape, edges and the thread split cannot change a bit: the
// result depends on A, B and K only. Against gemm_bt_bf16 (A kept in float32) it differs by A's
// rounding, a relative 2^-9 per term at most, the precision transformers runs bfloat16 models in.
//
// Structure: gemm.cpp's BLIS loops. B is packed once per call into panels of kNR = 32 columns as
// pairs ([K/2][32] 32-bit words, a pair of bfloat16 each; two vectors per pair of K), A into row
// panels of kMR = 12 rows a cache block at a time ([kc/2][12] words); the micro-kernel keeps a
// 12 × 32 tile of C in 24 registers and per pair of K issues two loads of B, twelve broadcasts of
// A's pair and 24 vdpbf16ps (64 multiply-adds each against an FMA's 32).
#define MHSA_ISA avx512bf16
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>

#include "kernels/isa/transpose.h"

namespace mhsa::kernels::avx512bf16 {
namespace {

constexpr int kMR = 12;   // rows of a micro-tile
constexpr int kNR = 32;   // columns: two vectors of 16 float32
constexpr int64_t kKC2 = 128;  // pairs of K in a K block (256 of K; the B micro-panel is 16 KiB)
constexpr int64_t kMC = 4 * kMR;  // rows of a thread's tile
constexpr int64_t kNCP = 16;      // panels of a thread's tile
constexpr int64_t kKeepA = int64_t{1} << 20;  // words of packed A kept per thread for all of K

struct FreeDeleter {
  void operator()(uint32_t* p) const { std::free(p); }
};
struct Scratch {
  std::unique_ptr<uint32_t[], FreeDeleter> data;
  int64_t capacity = 0;
  uint32_t* reserve(int64_t n) {
    if (n > capacity) {
      const size_t bytes = (static_cast<size_t>(n) * sizeof(uint32_t) + 63) / 64 * 64;
      data.reset(static_cast<uint32_t*>(std::aligned_alloc(64, bytes)));
      capacity = n;
    }
    return data.get();
  }
};

inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh&>(v); }

// c[R, 32] (ldc) = (first ? 0 : c) + the pairs a[0:kc2, R] · b[0:kc2, 32]. a: a packed A panel
// ([kc2][kMR]), b: a packed B panel's K block ([kc2][32]).
template <int R>
void micro_tile(int64_t kc2, const uint32_t* a, const uint32_t* b, bool first, float* c, int64_t ldc) {
  __m512 acc[R][2];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    acc[r][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc);
    acc[r][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * ldc + 16);
  }
#pragma GCC unroll 2
  for (int64_t p = 0; p < kc2; ++p) {
    const __m512bh b0 = as_bh(_mm512_load_si512(b)), b1 = as_bh(_mm512_load_si512(b + 16));
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512bh ar = as_bh(_mm512_set1_epi32(static_cast<int>(a[r])));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], ar, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], ar, b1);
    }
    a += kMR;
    b += kNR;
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(c + r * ldc, acc[r][0]);
    _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
  }
}

using MicroTile = void (*)(int64_t, const uint32_t*, const uint32_t*, bool, float*, int64_t);
template <int... R>
constexpr std::array<MicroTile, sizeof...(R)> micro_table(std::integer_sequence<int, R...>) {
  return {&micro_tile<R + 1>...};
}
constexpr std::array<MicroTile, kMR> kMicro = micro_table(std::make_integer_sequence<int, kMR>{});

// The pair p (elements 2p, 2p+1) of a bfloat16 row of length K as one word; past K, zero.
inline uint32_t pair_word(const uint16_t* row, int64_t K, int64_t p) {
  const uint32_t lo = row[2 * p], hi = 2 * p + 1 < K ? row[2 * p + 1] : 0;
  return lo | hi << 16;
}

// Packs B's stored rows [j, j + n) (n <= kNR; B points at row j) into one panel [K2][kNR] of
// pairs, zero-padded. Whole panels: 8 rows × 8 words (16 of K) at a time as transposes.
void pack_b_panel(int64_t K, int64_t n, const uint16_t* B, int64_t ldb, uint32_t* panel) {
  const int64_t K2 = (K + 1) / 2;
  int64_t p_vec = 0;
  if (n == kNR) {
    p_vec = K / 16 * 8;  // pairs whose 16 elements are all inside K
    for (int64_t jj = 0; jj < kNR; jj += 8)
      for (int64_t p = 0; p < p_vec; p += 8) {
        __m256 v[8];
        for (int r = 0; r < 8; ++r) v[r] = _mm256_loadu_ps(reinterpret_cast<const float*>(B + (jj + r) * ldb + 2 * p));
        transpose8x8(v);
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(reinterpret_cast<float*>(panel + (p + i) * kNR + jj), v[i]);
      }
  }
  for (int64_t jj = 0; jj < kNR; ++jj)
    for (int64_t p = p_vec; p < K2; ++p) panel[p * kNR + jj] = jj < n ? pair_word(B + jj * ldb, K, p) : 0;
}

// Packs rows [0, rows) of A (lda) × K's pairs [p0, p0 + kc2) into panels of kMR rows, rounded to
// bfloat16: [rows/kMR][kc2][kMR] words (the unused rows of the last panel left as they are).
void pack_a(int64_t rows, int64_t K, int64_t p0, int64_t kc2, const float* A, int64_t lda, uint32_t* packed) {
  alignas(64) uint32_t words[16];
  for (int64_t i0 = 0; i0 < rows; i0 += kMR) {
    const int64_t r_end = std::min<int64_t>(kMR, rows - i0);
    uint32_t* panel = packed + i0 * kc2;
    for (int64_t r = 0; r < r_end; ++r) {
      const float* src = A + (i0 + r) * lda;
      for (int64_t p = 0; p < kc2; p += 16) {  // 32 of K, the part inside K loaded, the rest zero
        const int64_t k = 2 * (p0 + p), left = std::max<int64_t>(0, std::min<int64_t>(32, K - k));
        const __mmask16 lo = static_cast<__mmask16>(left >= 16 ? 0xffff : (1u << left) - 1);
        const __mmask16 hi = static_cast<__mmask16>(left >= 32 ? 0xffff : left <= 16 ? 0 : (1u << (left - 16)) - 1);
        const __m512bh bh = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, src + k + 16), _mm512_maskz_loadu_ps(lo, src + k));
        _mm512_store_si512(words, reinterpret_cast<const __m512i&>(bh));
        const int64_t count = std::min<int64_t>(16, kc2 - p);
        for (int64_t i = 0; i < count; ++i) panel[(p + i) * kMR + r] = words[i];
      }
    }
  }
}

// One micro-tile of `rows` × `n` columns (n < kNR: through a scratch tile).
void run_tile(int64_t rows, int64_t n, int64_t kc2, const uint32_t* a, const uint32_t* b, bool first, float* c,
              int64_t ldc) {
  const MicroTile tile = kMicro[rows - 1];
  if (n == kNR) return tile(kc2, a, b, first, c, ldc);
  alignas(64) float edge[kMR * kNR];
  if (!first)
    for (int64_t r = 0; r < rows; ++r) std::copy(c + r * ldc, c + r * ldc + n, edge + r * kNR);
  tile(kc2, a, b, first, edge, kNR);
  for (int64_t r = 0; r < rows; ++r) std::copy(edge + r * kNR, edge + r * kNR + n, c + r * ldc);
}

}  // namespace

void gemm_bt_bf16_dot(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                      float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
    return;
  }
  const int64_t K2 = (K + 1) / 2, panels = (N + kNR - 1) / kNR;
  thread_local Scratch packed_b_scratch;
  uint32_t* packed_b = packed_b_scratch.reserve(panels * K2 * kNR);  // [panels][K2][kNR]
  const int64_t m_blocks = (M + kMC - 1) / kMC, n_blocks = (panels + kNCP - 1) / kNCP;
  const int64_t mc = ((M + m_blocks - 1) / m_blocks + kMR - 1) / kMR * kMR;
  const int64_t ncp = (panels + n_blocks - 1) / n_blocks;
#pragma omp parallel if (M * N * K >= (int64_t{1} << 16))
  {
#pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t j = p * kNR;
      pack_b_panel(K, std::min<int64_t>(kNR, N - j), B + j * ldb, ldb, packed_b + p * K2 * kNR);
    }
    // The thread's packed row block of A for all of K, kept while its next tile is in the same
    // row block (gemm.cpp's gemm_packed does the same); past kKeepA words one K block at a time.
    const bool keep = mc * K2 <= kKeepA;
    thread_local Scratch packed_a_scratch;
    uint32_t* packed_a = packed_a_scratch.reserve(keep ? mc * K2 : mc * std::min(kKC2, K2));
    int64_t packed_ib = -1;
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t ib = 0; ib < m_blocks; ++ib)
      for (int64_t jb = 0; jb < n_blocks; ++jb) {
        const int64_t i0 = ib * mc, i_end = std::min(M, i0 + mc);
        const int64_t q0 = jb * ncp, q_end = std::min(panels, q0 + ncp);
        if (i0 >= M || q0 >= panels) continue;
        if (keep && ib != packed_ib) {
          for (int64_t pc = 0; pc < K2; pc += kKC2)
            pack_a(i_end - i0, K, pc, std::min(kKC2, K2 - pc), A + i0 * lda, lda, packed_a + mc * pc);
          packed_ib = ib;
        }
        for (int64_t pc = 0; pc < K2; pc += kKC2) {
          const int64_t kc2 = std::min(kKC2, K2 - pc);
          if (!keep) pack_a(i_end - i0, K, pc, kc2, A + i0 * lda, lda, packed_a);
          const uint32_t* a_block = keep ? packed_a + mc * pc : packed_a;  // [mc/kMR][kc2][kMR]
          for (int64_t q = q0; q < q_end; ++q) {
            const int64_t j = q * kNR, n = std::min<int64_t>(kNR, N - j);
            const uint32_t* b = packed_b + (q * K2 + pc) * kNR;
            for (int64_t i = i0; i < i_end; i += kMR)
              run_tile(std::min<int64_t>(kMR, i_end - i), n, kc2, a_block + (i - i0) * kc2, b, pc == 0,
                       C + i * ldc + j, ldc);
          }
        }
      }
  }
}

}  // namespace mhsa::kernels::avx512bf16
