// kernels/gemm.cpp — the fast matrix multiply, compiled once per ISA (MHSA_ISA, see dispatch.h).
//
// C[M, N] = A[M, K] · B[K, N] + bias[N], float32, row-major with leading dimensions. The classic
// BLIS structure written against simd.h's Vec: B is packed once per call into column panels of
// kNR = 2 vectors ([N/kNR][K][kNR], zero-padded), A into row panels of kMR rows per cache block
// ([kc][kMR]), and a register-blocked micro-kernel keeps a kMR × kNR tile of C in registers
// (AVX-512 12 × 32, AVX2 6 × 16, portable 6 × 8), broadcasting one A value against two B
// vectors per step. Up to kInPlaceMaxM rows (decode, short prompts) B is not packed but read in
// place, once, K block by K block along its rows: packing would only add memory traffic.
//
// Determinism, stronger than the contract asks: every element of C is the same chain,
// c = bias (or 0); for k = 0, 1, ..., K-1: c = fma(A[i,k], B[k,j], c), carried in one register
// lane and stored/reloaded between K blocks (exact) — or, for M <= kFreshMaxM, the same chain
// restarted every kFreshKC terms and added on (more accurate where it costs nothing), in
// kFreshParts fixed parts of K whose sums are added in order (gemm_in_place). Packing,
// blocking, tile shape, edge handling and the thread split therefore cannot change a single bit:
// the result depends on the inputs and on M's class only — M <= kStreamMaxM (4: decode, B
// streamed with K split in fixed parts, gemm_stream), M <= kFreshMaxM (16), larger — (per ISA:
// portable code without FMA rounds the product separately, consistently).
//
// gemm_ex adds what backward passes need: either operand stored transposed, and C += A·B (the
// chains start from C). It always takes the packed path (the transposes are in packing only), so
// its chains are the plain ones; for M <= kFreshMaxM they differ from gemm's blocked chains.
// gemm_bt_bf16 is gemm_ex's C = A·Bᵀ with B [N, K] stored as bfloat16 (16-bit weights): B is
// widened while it is packed (exact), so no float copy of B exists beyond the packed panels, and
// its bits are gemm_ex's on the widened B; gemm_bf16 is gemm_ex's C (+)= A·B with B [K, N] stored
// as bfloat16 (training's dX = dY·W of a bfloat16 weight), likewise widened while packed, its
// chains the packed path's (gemm_ex's bits when it accumulates or M > kFreshMaxM). gemm_bt_q8_0
// gemm_bt_f16 is gemm_bt_bf16 for IEEE float16 B (F16C's exact vcvtph2ps). gemm_bt_q8_0
// and gemm_bt_q4_k are the same as gemm_bt_bf16 for B stored as Q8_0 or Q4_K blocks
// (kernels/q8_0.h, q4_k.h), dequantised while packed. Not a BLAS:
// no alpha/beta, no other types. Block sizes and their measurements are below the micro-kernel.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <type_traits>
#include <utility>

#include <omp.h>

#include "kernels/dispatch.h"
#include "kernels/gemm.h"
#include "kernels/isa/simd.h"
#include "kernels/isa/transpose.h"
#include "kernels/q4_k.h"
#include "kernels/q8_0.h"

namespace mhsa::kernels::MHSA_ISA {
namespace {

constexpr int kNR = 2 * kLanes;              // columns of a micro-tile: two vectors
constexpr int kMR = kLanes == 16 ? 12 : 6;   // rows: 2·kMR accumulators + 2 B vectors + 1 broadcast
                                             // fit the 32 (AVX-512) / 16 (AVX2, SSE) registers

constexpr int64_t kPrefetchAhead = 2 * kNR;
// B blocked (gemm.h): a micro-tile's second vector is in the same 16-column panel (kLanes < 16) or
// the next one (AVX-512), and the stream is read in address order: prefetched 2 KiB ahead.
constexpr int64_t kBlockedHi = kLanes >= 16 ? kBlockedB * kBlockedB : kLanes;
constexpr int64_t kBlockedAhead = 512;

// c[R, kNR] (ldc) = start + a[0:kc, R] · b[0:kc, kNR], k ascending; `a` is a packed A panel
// ([kc][kMR], rows r < R used), `b` rows are `ldb` apart (kNR when packed, B's own ldb in place).
// start = the row vector init[0:kNR] for every row when init is given (bias or zeros), else the
// current contents of c (continuing an earlier K block). kStream: B is read in place; prefetch
// the same row kPrefetchAhead floats on, the tile two panels later (the loop body alone keeps too
// few misses in flight once R > 1). A prefetch past the end of B is harmless: it never faults.
//
// kFresh: the accumulators start at 0 and the tile's sum is added to the start value at the end,
// so a short K block is a chain of its own (blocked summation, see kFreshKC).
// kCopy: the B values read are also stored to `copy` ([kc][kNR]), for the next tiles of the panel.
// kBlocked: B blocked (b at row k0 of a 16-column panel, k0 a multiple of 16; ldb the floats
// between one row block and the next, 16·N): rows 16 floats apart within a block, the second
// vector at kBlockedHi, the prefetch kBlockedAhead on in address order.
template <int R, bool kStream, bool kFresh, bool kCopy = false, bool kBlocked = false>
void micro_tile(int64_t kc, const float* a, const float* b, int64_t ldb, const float* init, float* c,
                int64_t ldc, float* copy = nullptr) {
  Vec acc[R][2];
  if (kFresh) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = Vec{};
  } else if (init) {
    const Vec i0 = load(init), i1 = load(init + kLanes);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r][0] = i0, acc[r][1] = i1;
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r][0] = load(c + r * ldc), acc[r][1] = load(c + r * ldc + kLanes);
  }
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    constexpr int64_t kHi = kBlocked ? kBlockedHi : kLanes, kAhead = kBlocked ? kBlockedAhead : kPrefetchAhead;
    const Vec b0 = load(b), b1 = load(b + kHi);
    if constexpr (kStream) {
      __builtin_prefetch(b + kAhead);
      __builtin_prefetch(b + kAhead + kHi);
    }
    if constexpr (kCopy) {
      store(copy, b0);
      store(copy + kLanes, b1);
      copy += kNR;
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const Vec ar = splat(a[r]);
      acc[r][0] = fma(ar, b0, acc[r][0]);
      acc[r][1] = fma(ar, b1, acc[r][1]);
    }
    a += kMR;
    if constexpr (kBlocked)  // the same panel of the next row block after every 16th row
      b += (k + 1) % kBlockedB == 0 ? ldb - (kBlockedB - 1) * kBlockedB : kBlockedB;
    else
      b += ldb;
  }
  if (kFresh) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const float* start = init ? init : c + r * ldc;
      acc[r][0] += load(start);
      acc[r][1] += load(start + kLanes);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) store(c + r * ldc, acc[r][0]), store(c + r * ldc + kLanes, acc[r][1]);
}

using MicroTile = void (*)(int64_t, const float*, const float*, int64_t, const float*, float*, int64_t, float*);
template <bool kStream, bool kFresh, bool kBlocked, int... R>
constexpr std::array<MicroTile, sizeof...(R)> micro_table(std::integer_sequence<int, R...>) {
  return {&micro_tile<R + 1, kStream, kFresh, false, kBlocked>...};
}
// kMicro[stream][fresh][R - 1]: the micro-kernel for R rows (R < kMR: the last row panel of a block);
// kMicroBlocked[fresh][R - 1]: the same reading B blocked in place.
constexpr std::array<std::array<std::array<MicroTile, kMR>, 2>, 2> kMicro = {
    {{micro_table<false, false, false>(std::make_integer_sequence<int, kMR>{}),
      micro_table<false, true, false>(std::make_integer_sequence<int, kMR>{})},
     {micro_table<true, false, false>(std::make_integer_sequence<int, kMR>{}),
      micro_table<true, true, false>(std::make_integer_sequence<int, kMR>{})}}};
constexpr std::array<std::array<MicroTile, kMR>, 2> kMicroBlocked = {
    {micro_table<true, false, true>(std::make_integer_sequence<int, kMR>{}),
     micro_table<true, true, true>(std::make_integer_sequence<int, kMR>{})}};

// Blocking, chosen on the 2-core AMD EPYC (Zen 4: L1d 32 KiB, L2 1 MiB per core; FMA peak measured
// 115 GFLOP/s per core) with AVX-512, 2 threads, best of 3 runs on a quiet machine (±5% noise):
//   kKC = 256  K block. At M=1024, K=768, N=2304: KC 128 / 256 / 384 -> 139 / 174 / 155 GFLOP/s.
//              The packed B micro-panel kKC × kNR (32 KiB) is reused by every row panel from L1/L2.
//   kMC = 48   rows of a thread's tile (packed A: kMC × kKC = 48 KiB), kNCP = 16 panels of kNR
//              columns (the C tile 48 × 512 = 96 KiB stays in L2). MC 4/8/16·kMR at NCP 8: 191 /
//              174 / 180; NCP 4/8/16/32: 176 / 174 / 196 / 192 (at MC 8·kMR); MC 4·kMR, NCP 16: 198.
//   M <= kInPlaceMaxM = 256 rows: B is not packed (gemm_in_place). At N=2304, K=768, GFLOP/s
//              in place vs packed: M=48 218 vs 212, M=96 217 vs 146, M=192 212 vs 155, M=256 210
//              vs 184, M=512 185 vs 183; packing pays only where B is reused by many row blocks.
//   kInPlaceKC = 256 and a prefetch 2·kNR ahead along B's rows: decode M=1 / 8 / 32 with B
//              from memory: 24.9 / 19.5 GB/s / 188 GFLOP/s; without the prefetch 25.2 / 15.9 /
//              165; KC 64: 24.1 / 19.1 / 186; no K blocking: 26.7 / 19.6 / 166.
constexpr int64_t kKC = 256;
constexpr int64_t kMC = 4 * kMR;
constexpr int64_t kNCP = 16;
constexpr int64_t kInPlaceMaxM = 256;
constexpr int64_t kInPlaceKC = 256;
//   Up to kFreshMaxM rows, K is summed in blocks of kFreshKC, each block a fresh chain added to C
//   (kFresh micro-kernels): the rounding error of a K-term dot product then grows like
//   sqrt(K·kFreshKC) instead of K. Measured on GPT-2-like layers (C = 64..96, T = 1): relative
//   error against float64 2.5e-7 -> ~1.2e-7, level with PyTorch's fp32 (whose small-M kernels
//   sum in several chains). These shapes read B from memory, so the extra C traffic is free:
//   decode M=1 / 8: see docs/performance-history.md.
constexpr int64_t kFreshMaxM = 16;
constexpr int64_t kFreshKC = 16;
// gemm_packed keeps a thread's packed row block of A for all of K up to this many floats (4 MiB).
constexpr int64_t kKeepA = int64_t{1} << 20;

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;
Buffer aligned_floats(int64_t n) {
  const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
  return Buffer(static_cast<float*>(std::aligned_alloc(64, std::max<size_t>(bytes, 64))));
}

#if defined(__AVX2__)  // the avx2 and avx512 builds: packing by 8 × 8 transposes in 256-bit registers
// The first n (4, 6 or 8) lanes of v to p.
inline void store_lanes(float* p, __m256 v, int n) {
  if (n == 8) return _mm256_storeu_ps(p, v);
  _mm_storeu_ps(p, _mm256_castps256_ps128(v));
  if (n == 6) _mm_storel_pi(reinterpret_cast<__m64*>(p + 4), _mm256_extractf128_ps(v, 1));
}

// Eight floats of a row, widened from bfloat16 where B is 16-bit.
inline __m256 load8_wide(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8_wide(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline __m256 load8_wide(const float16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
#endif

// Packs rows [0, rows) × cols [0, kc) of A (lda) into panels of kMR rows: [rows/kMR][kc][kMR],
// the unused rows of the last panel left as they are (the micro-kernel for R rows never reads them).
// A panel's eight columns at a time as 8 × 8 transposes (kMR 6: two rows repeated and dropped;
// kMR 12: rows 0–7 and 8–11), the rest one value at a time; the same values either way.
void pack_a(int64_t rows, int64_t kc, const float* A, int64_t lda, float* packed) {
  for (int64_t i0 = 0; i0 < rows; i0 += kMR) {
    const int64_t r_end = std::min<int64_t>(kMR, rows - i0);
    float* panel = packed + i0 * kc;
    int64_t k0 = 0;
#if defined(__AVX2__)
    static_assert(kMR == 6 || kMR == 12, "pack_a's transposes: 6 or 12 rows");
    if (r_end == kMR)
      for (; k0 + 8 <= kc; k0 += 8)
        for (int g = 0; g < kMR; g += 8) {
          const int n = std::min(8, kMR - g);  // rows of this group
          __m256 v[8];
          for (int r = 0; r < 8; ++r) v[r] = _mm256_loadu_ps(A + (i0 + g + std::min(r, n - 1)) * lda + k0);
          transpose8x8(v);
          for (int k = 0; k < 8; ++k) store_lanes(panel + (k0 + k) * kMR + g, v[k], n);
        }
#endif
    for (int64_t r = 0; r < r_end; ++r) {
      const float* src = A + (i0 + r) * lda;
      for (int64_t k = k0; k < kc; ++k) panel[k * kMR + r] = src[k];
    }
  }
}

// pack_a for A stored transposed ([K, M], lda): rows [0, rows) × cols [0, kc) of op(A) = Aᵀ, from
// A's rows [0, kc) and columns [0, rows). Each k reads kMR contiguous floats.
void pack_a_transposed(int64_t rows, int64_t kc, const float* A, int64_t lda, float* packed) {
  for (int64_t i0 = 0; i0 < rows; i0 += kMR) {
    const int64_t r_end = std::min<int64_t>(kMR, rows - i0);
    float* panel = packed + i0 * kc;
    for (int64_t k = 0; k < kc; ++k) {
      const float* src = A + k * lda + i0;
      for (int64_t r = 0; r < r_end; ++r) panel[k * kMR + r] = src[r];
    }
  }
}

inline float widen(float x) { return x; }
inline float widen(uint16_t x) {
  const uint32_t w = uint32_t{x} << 16;
  float f;
  std::memcpy(&f, &w, sizeof(float));
  return f;
}
inline Vec load_wide(const float* p) { return load(p); }
inline Vec load_wide(const uint16_t* p) { return load_bf16(p); }
inline float widen(float16 x) { return f16_scalar(x.bits); }
inline Vec load_wide(const float16* p) { return load_f16(&p->bits); }

// Packs columns [j, j + n) (n <= kNR) of B's K rows into one panel [K][kNR], zero-padded (float,
// or bfloat16 widened).
template <class TB>
void pack_b_panel(int64_t K, int64_t n, const TB* B, int64_t ldb, float* panel) {
  for (int64_t k = 0; k < K; ++k) {
    const TB* src = B + k * ldb;
    float* dst = panel + k * kNR;
    if (n == kNR) {
      store(dst, load_wide(src));
      store(dst + kLanes, load_wide(src + kLanes));
    } else {
      for (int64_t j = 0; j < kNR; ++j) dst[j] = j < n ? widen(src[j]) : 0.0f;
    }
  }
}

// pack_b_panel for B blocked (gemm.h; N its width): columns [j, j + kNR), whole.
void pack_b_panel_blocked(int64_t K, int64_t N, int64_t j, const float* B, float* panel) {
  for (int64_t k = 0; k < K; ++k) {
    const float* src = B + blocked_index(k, j, N);
    store(panel + k * kNR, load(src));
    store(panel + k * kNR + kLanes, load(src + kBlockedHi));
  }
}

// pack_b_panel for B stored transposed ([N, K], ldb; B points at stored row j): op(B)[k, j + jj]
// = B[jj·ldb + k] (float, or bfloat16 widened). A kKC-long stretch of each of the n rows at a
// time, so the panel being written stays in L1; for a full panel, 8 rows × 8 columns at a time as
// a transpose in registers.
template <class TB>
void pack_b_panel_transposed(int64_t K, int64_t n, const TB* B, int64_t ldb, float* panel) {
  for (int64_t k0 = 0; k0 < K; k0 += kKC) {
    const int64_t k_end = std::min(K, k0 + kKC);
    int64_t k_vec = k0;  // columns [k0, k_vec) are packed by the transposes
#if defined(__AVX2__)
    if (n == kNR) {
      k_vec = k0 + (k_end - k0) / 8 * 8;
      for (int64_t jj = 0; jj < kNR; jj += 8)
        for (int64_t k = k0; k < k_vec; k += 8) {
          __m256 v[8];
          for (int r = 0; r < 8; ++r) v[r] = load8_wide(B + (jj + r) * ldb + k);
          transpose8x8(v);
          for (int i = 0; i < 8; ++i) _mm256_storeu_ps(panel + (k + i) * kNR + jj, v[i]);
        }
    }
#endif
    for (int64_t jj = 0; jj < kNR; ++jj) {
      if (jj >= n) {
        for (int64_t k = k_vec; k < k_end; ++k) panel[k * kNR + jj] = 0.0f;
        continue;
      }
      const TB* src = B + jj * ldb;
      for (int64_t k = k_vec; k < k_end; ++k) panel[k * kNR + jj] = widen(src[k]);
    }
  }
}

// pack_b_panel_transposed for B stored as Q8_0 blocks ([N, K/32], ldb in blocks): each weight
// dequantised as dequantize_row_q8_0 does (d·q, one rounding), a block row at a time.
void pack_b_panel_transposed(int64_t K, int64_t n, const BlockQ8_0* B, int64_t ldb, float* panel) {
  for (int64_t k0 = 0; k0 < K; k0 += kKC) {
    const int64_t k_end = std::min(K, k0 + kKC);
    for (int64_t jj = 0; jj < kNR; ++jj) {
      if (jj >= n) {
        for (int64_t k = k0; k < k_end; ++k) panel[k * kNR + jj] = 0.0f;
        continue;
      }
      for (int64_t k = k0; k < k_end; k += kQ8Block) {
        const BlockQ8_0& blk = B[jj * ldb + k / kQ8Block];
        const float d = f16_scalar(blk.d);
        for (int64_t i = 0; i < kQ8Block; ++i) panel[(k + i) * kNR + jj] = d * static_cast<float>(blk.qs[i]);
      }
    }
  }
}

// pack_b_panel_transposed for B stored as Q4_K blocks ([N, K/256], ldb in blocks; kKC is one
// block; the kernels' order of quants, kernels/q4_k.h): each block dequantised as
// dequantize_row_q4_k does (its exact values), then placed.
void pack_b_panel_transposed(int64_t K, int64_t n, const BlockQ4_K* B, int64_t ldb, float* panel) {
  static_assert(kKC % kQ4KBlock == 0, "a K block holds whole Q4_K blocks");
  float w[kQ4KBlock];
  for (int64_t k0 = 0; k0 < K; k0 += kKC) {
    const int64_t k_end = std::min(K, k0 + kKC);
    for (int64_t jj = 0; jj < kNR; ++jj) {
      if (jj >= n) {
        for (int64_t k = k0; k < k_end; ++k) panel[k * kNR + jj] = 0.0f;
        continue;
      }
      for (int64_t k = k0; k < k_end; k += kQ4KBlock) {
        dequantize_row_q4_k_interleaved(B + jj * ldb + k / kQ4KBlock, kQ4KBlock, w);
        for (int64_t i = 0; i < kQ4KBlock; ++i) panel[(k + i) * kNR + jj] = w[i];
      }
    }
  }
}

// One micro-tile of `rows` × `n` columns of C (n < kNR: through a kNR-wide scratch tile, since
// the padded B/bias columns produce values C has no room for). `first`: start from init.
void run_tile(int64_t rows, int64_t n, int64_t kc, const float* a, const float* b, int64_t ldb,
              const float* init, bool first, float* c, int64_t ldc, bool stream = false, bool fresh = false,
              bool blocked = false) {
  const MicroTile tile = blocked ? kMicroBlocked[fresh][rows - 1] : kMicro[stream][fresh][rows - 1];
  if (n == kNR) {
    tile(kc, a, b, ldb, first ? init : nullptr, c, ldc, nullptr);
    return;
  }
  alignas(64) float edge[kMR * kNR];  // [rows, kNR]
  if (!first)
    for (int64_t r = 0; r < rows; ++r) std::copy(c + r * ldc, c + r * ldc + n, edge + r * kNR);
  tile(kc, a, b, ldb, first ? init : nullptr, edge, kNR, nullptr);
  for (int64_t r = 0; r < rows; ++r) std::copy(edge + r * kNR, edge + r * kNR + n, c + r * ldc);
}

// A per-thread buffer kept between calls: the packed B, the stream path's sums (a projection
// multiplies by the same shapes every step; reallocating megabytes each call costs page faults).
struct Scratch {
  Buffer data;
  int64_t capacity = 0;
  float* reserve(int64_t n) {
    if (n > capacity) data = aligned_floats(n), capacity = n;
    return data.get();
  }
};

// Whether `rows` rows of 64 bytes, ld floats apart, stay in an L1 of 64 sets × 8 ways (32 KiB:
// AMD since Zen, Intel up to Alder Lake's E-cores) while they are read again: with ld a multiple of
// 16 floats, the rows fall in 64 / gcd(ld / 16, 64) sets only (one set when ld·4 is a multiple of
// 4 KiB). Otherwise their 64 bytes straddle lines at shifting offsets and spread over the sets.
bool fits_l1(int64_t ld, int64_t rows) {
  if (ld % 16 != 0) return true;
  const int64_t step = (ld / 16) % 64;
  return rows <= 8 * (step == 0 ? 1 : 64 / std::gcd<int64_t>(step, 64));
}

// gemm_in_place's columns [p_begin·kNR, p_end·kNR) ∩ [0, N): a_packed as gemm_in_place packs it;
// edge_b: B's last, partial panel packed ([K][kNR]) when p_end is the last panel and N % kNR ≠ 0;
// panel_copy: kInPlaceKC·kNR floats when copy_b.
// Rows [k_begin, k_end) of B only (a part of K): the chains start from init at k_begin.
// blocked: B blocked (gemm.h), each panel's rows read in place, a row block after another.
void in_place_panels(int64_t p_begin, int64_t p_end, int64_t M, int64_t N, int64_t K, const float* a_packed,
                     const float* B, int64_t ldb, const float* edge_b, const float* bias, float* C, int64_t ldc,
                     bool copy_b, float* panel_copy, int64_t k_begin, int64_t k_end, bool blocked) {
  const bool fresh = M <= kFreshMaxM;
  const int64_t block = fresh ? kFreshKC : kInPlaceKC;
  static_assert(kFreshKC == kBlockedB, "a fresh block is a row block of blocked B");
  for (int64_t pc = k_begin; pc < k_end; pc += block) {
    const int64_t kc = std::min(block, K - pc);
    for (int64_t p = p_begin; p < p_end; ++p) {
      const int64_t j = p * kNR, n = std::min<int64_t>(kNR, N - j);
      alignas(64) float init[kNR] = {};
      if (bias && pc == k_begin) std::copy(bias + j, bias + j + n, init);
      if (blocked) {  // whole panels (N a multiple of 32), 16 rows 16 floats apart
        const float* b = B + blocked_index(pc, j, N);
        if (!fresh && M > kMR) {  // a long block's rows are 16·N floats apart: the first tile copies them
          micro_tile<kMR, true, false, true, true>(kc, a_packed + pc * kMR, b, kBlockedB * N,
                                                   pc == k_begin ? init : nullptr, C + j, ldc, panel_copy);
          for (int64_t i = kMR; i < M; i += kMR)
            run_tile(std::min<int64_t>(kMR, M - i), kNR, kc, a_packed + i * K + pc * kMR, panel_copy, kNR, init,
                     pc == k_begin, C + i * ldc + j, ldc, false, false);
          continue;
        }
        for (int64_t i = 0; i < M; i += kMR)
          run_tile(std::min<int64_t>(kMR, M - i), kNR, kc, a_packed + i * K + pc * kMR, b, kBlockedB * N, init,
                   pc == k_begin, C + i * ldc + j, ldc, true, fresh, true);
        continue;
      }
      if (n < kNR) {  // the partial panel, packed
        for (int64_t i = 0; i < M; i += kMR)
          run_tile(std::min<int64_t>(kMR, M - i), n, kc, a_packed + i * K + pc * kMR, edge_b + pc * kNR, kNR, init,
                   pc == k_begin, C + i * ldc + j, ldc, false, fresh);
        continue;
      }
      const float* b = B + pc * ldb + j;
      if (copy_b) {  // the first tile copies the panel's block of B for the others
        (fresh ? micro_tile<kMR, true, true, true> : micro_tile<kMR, true, false, true>)(
            kc, a_packed + pc * kMR, b, ldb, pc == k_begin ? init : nullptr, C + j, ldc, panel_copy);
        for (int64_t i = kMR; i < M; i += kMR)
          run_tile(std::min<int64_t>(kMR, M - i), n, kc, a_packed + i * K + pc * kMR, panel_copy, kNR, init, pc == k_begin,
                   C + i * ldc + j, ldc, false, fresh);
        continue;
      }
      for (int64_t i = 0; i < M; i += kMR)
        run_tile(std::min<int64_t>(kMR, M - i), n, kc, a_packed + i * K + pc * kMR, b, ldb, init, pc == k_begin,
                 C + i * ldc + j, ldc, true, fresh);
    }
  }
}

// Small M (<= kInPlaceMaxM rows, decode): B is read in place, once. Each thread takes a
// contiguous range of column panels and walks it K block by K block, so that it reads B's rows
// in long runs; the block's strip of B stays in L2 while every row panel of A passes it. (Ranges
// claimed from a shared counter, as bt_parts.h does, were 4–25% slower at 8 rows with 2 threads:
// shorter runs of each row.)
// Up to kFreshMaxM rows K is first cut into kFreshParts fixed parts (whole fresh blocks), each
// taken by its own threads, as gemm_stream does: a thread then reads a contiguous stretch of B,
// whole rows when there are no more threads than parts. Part 0 sums into C from the bias, the
// others into buffers from 0, added to C in part order — the same bits for any thread count. On a
// 2-core Zen 3 at 8 rows, GPT-2's 48 projections (bench_step_gemm), B from memory: 1.3× the column
// split alone (docs/performance-history.md, "Where an 8-sequence GPT-2 step loses its time").
// Where a panel has more than one tile of rows and its block of B (kc rows of kNR floats, 64
// bytes each, ldb floats apart) does not stay in L1 (fits_l1: the 256 rows of a long block, or
// the 16 of a fresh block when ldb·4 is a multiple of 4 KiB, as GPT-2's c_fc at N 3072), the
// first tile also copies the block to a contiguous buffer that the other tiles read. Measured on
// one core, B from memory in 2 MiB pages (docs/performance-history.md,
// "gemm's in-place tiles read a copy of B").
constexpr int64_t kFreshParts = 2;

// C[M, N] (ldc) += sums [parts − 1][M][N], part after part: the fixed-part paths' last step. A
// worksharing loop: called inside their parallel region, by every thread.
void add_parts(int64_t M, int64_t N, int64_t parts, const float* part_sums, float* C, int64_t ldc) {
#pragma omp for schedule(static)
  for (int64_t i = 0; i < M; ++i)
    for (int64_t part = 1; part < parts; ++part) {
      const float* sum = part_sums + ((part - 1) * M + i) * N;
      float* c = C + i * ldc;
      int64_t j = 0;
      for (; j + kLanes <= N; j += kLanes) store(c + j, load(c + j) + load(sum + j));
      for (; j < N; ++j) c[j] += sum[j];
    }
}

void gemm_in_place(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                   const float* bias, float* C, int64_t ldc, bool blocked = false) {
  const int64_t panels = (N + kNR - 1) / kNR;
  thread_local Scratch a_scratch;  // kept: at K = 50257 (a GPT-2 head's backward) this is 51 MB
  float* a_packed = a_scratch.reserve((M + kMR - 1) / kMR * kMR * K);  // [M/kMR][K][kMR]
  pack_a(M, K, A, lda, a_packed);
  const bool fresh = M <= kFreshMaxM;
  const bool copy_b = !blocked && M > kMR && !fits_l1(ldb, fresh ? kFreshKC : kInPlaceKC);
  const int64_t blocks = (K + kFreshKC - 1) / kFreshKC;
  const int64_t parts = fresh ? std::min(kFreshParts, blocks) : 1;
  thread_local Scratch part_scratch;
  float* part_sums = parts > 1 ? part_scratch.reserve((parts - 1) * M * N) : nullptr;  // [part - 1][M][N]
#pragma omp parallel if (M * N * K >= (int64_t{1} << 16))
  {
    const int64_t threads = omp_get_num_threads();
    // Work items (part, column slice): slices per part so that every thread has one where it can.
    const int64_t slices = std::max<int64_t>(1, (threads + parts - 1) / parts);
    alignas(64) float panel_copy[kInPlaceKC * kNR];  // [kc][kNR]: a panel's block of B (16 / 32 KiB)
#pragma omp for schedule(static)
    for (int64_t item = 0; item < parts * slices; ++item) {
      const int64_t part = item / slices, slice = item % slices;
      const int64_t p_begin = panels * slice / slices, p_end = panels * (slice + 1) / slices;
      if (p_begin == p_end) continue;
      const int64_t k_begin = fresh ? blocks * part / parts * kFreshKC : 0;
      const int64_t k_end = fresh ? std::min(K, blocks * (part + 1) / parts * kFreshKC) : K;
      Buffer edge_b;  // [K][kNR] the last, partial panel
      if (p_end == panels && N % kNR != 0) {
        edge_b = aligned_floats(K * kNR);
        pack_b_panel(K, N % kNR, B + (panels - 1) * kNR, ldb, edge_b.get());
      }
      float* out = part == 0 ? C : part_sums + (part - 1) * M * N;
      in_place_panels(p_begin, p_end, M, N, K, a_packed, B, ldb, edge_b.get(), part == 0 ? bias : nullptr, out,
                      part == 0 ? ldc : N, copy_b, panel_copy, k_begin, k_end, blocked);
    }
    // C += part 1, part 2, ... in order (the implicit barrier above: all parts done)
    if (parts > 1) add_parts(M, N, parts, part_sums, C, ldc);
  }
}

// Up to kStreamMaxM rows (decode of one to a few sequences): B streams from memory and nothing
// else matters. Threads split K, not N, so that each reads one contiguous run of B's rows (a
// single long stream is what the hardware prefetchers keep up with; the column split above
// reads 16 short runs at once and measured ~20 GB/s against ~31 with 2 threads at N=2304).
// K is cut into kStreamParts fixed parts whatever the thread count. A part sums its rows in
// segments of kFreshKC (each a fresh fma chain, rows ascending, added to the part's running sum:
// blocked summation as in the kFresh micro-kernels), and C = bias + part0 + part1 + ... in part
// order. So results depend on the inputs only (and on this path: M <= kStreamMaxM), and the
// parts' sums are the only extra traffic: kStreamParts·M·N floats, in L2. Tried up to 8 rows (a
// server's batch): at 6 and 8 rows the in-place micro-tiles (12 FMAs per 8 loads, against this
// path's 8 per ~10) were faster on a 2-core Zen 3 (docs/performance-history.md,
// "Eight sequences in one decode step").
constexpr int64_t kStreamMaxM = 4;
constexpr int64_t kStreamParts = 8;
// Columns per pass of stream_rows with M > 1: R rows of B (8 KiB at R = 8) stay in L1 while every
// row of A passes over them, so B comes from memory once and from L1 M − 1 times, not from L2 (a
// multiple of kLanes: only the last chunk has a partial vector; the order of every sum is
// unchanged). Measured at N 2304, K 768, 2 threads: docs/performance-history.md,
// "Eight sequences in one decode step".
constexpr int64_t kStreamChunk = 256;

template <int R, bool kFirst>
void stream_rows(int64_t M, int64_t N, const float* A, int64_t lda, const float* B, int64_t ldb, int64_t k,
                 float* acc) {  // acc[m, 0:N] (+)= Σ_r A[m, k + r] · B[k + r, 0:N], r < R; kFirst: from 0
  const int64_t chunk = M == 1 ? N : kStreamChunk;  // one row of A: nothing to keep in L1
  for (int64_t j0 = 0; j0 < N; j0 += chunk) {
    const int64_t j1 = std::min(N, j0 + chunk), full = j0 + (j1 - j0) / kLanes * kLanes;
    for (int64_t m = 0; m < M; ++m) {
      Vec a[R];
      for (int r = 0; r < R; ++r) a[r] = splat(A[m * lda + k + r]);
      float* c = acc + m * N;
      int64_t n = j0;
      for (; n < full; n += kLanes) {
        Vec s = kFirst ? splat(0.0f) : load(c + n);
        for (int r = 0; r < R; ++r) s = fma(a[r], load(B + (k + r) * ldb + n), s);
        store(c + n, s);
      }
      if (n < j1) {
        const int rest = static_cast<int>(j1 - n);
        Vec s = kFirst ? splat(0.0f) : load_partial(c + n, rest, 0.0f);
        for (int r = 0; r < R; ++r) s = fma(a[r], load_partial(B + (k + r) * ldb + n, rest, 0.0f), s);
        store_partial(c + n, s, rest);
      }
    }
  }
}

// stream_chain's sums for B blocked (gemm.h), Q segments at once: segment q is rows [k0[q],
// k0[q] + 16), one row block, summed into out[q] ([M][N]) as one fresh chain per element (from 0,
// rows ascending: stream_chain's). The Q row blocks are read side by side, a panel of each in
// turn, all in address order: Q concurrent streams, where one block at a time (a single stream)
// read ~20% slower with one row of A (bench/bench_blocked_b.cpp). No software prefetch: the
// hardware's keeps up with Q ascending streams, and one 2 KiB ahead was ~5% slower.
template <int Q>
void stream_blocks(int64_t M, int64_t N, const float* A, int64_t lda, const float* B, const int64_t* k0,
                   float* const* out) {
  constexpr int kVecs = kBlockedB / kLanes;  // vectors across a panel
  constexpr int64_t kPanel = kBlockedB * kBlockedB;
  const float* block[Q];
  for (int q = 0; q < Q; ++q) block[q] = B + k0[q] * N;  // row block k0 / 16 starts at (k0 / 16)·(N / 16)·256 = k0·N
  for (int64_t p = 0; p < N / kBlockedB; ++p)
    for (int64_t m = 0; m < M; ++m) {
      Vec s[Q][kVecs];
#pragma GCC unroll 4
      for (int q = 0; q < Q; ++q)
#pragma GCC unroll 4
        for (int v = 0; v < kVecs; ++v) s[q][v] = splat(0.0f);
#pragma GCC unroll 4
      for (int64_t kk = 0; kk < kBlockedB; ++kk)
#pragma GCC unroll 4
        for (int q = 0; q < Q; ++q) {
          const float* b = block[q] + p * kPanel + kk * kBlockedB;
          const Vec ak = splat(A[m * lda + k0[q] + kk]);
#pragma GCC unroll 4
          for (int v = 0; v < kVecs; ++v) s[q][v] = fma(ak, load(b + v * kLanes), s[q][v]);
        }
#pragma GCC unroll 4
      for (int q = 0; q < Q; ++q)
#pragma GCC unroll 4
        for (int v = 0; v < kVecs; ++v) store(out[q] + m * N + p * kBlockedB + v * kLanes, s[q][v]);
    }
}

// gemm_stream's parts [p0, p1) for B blocked: up to 4 parts side by side, a segment of each in
// turn (stream_blocks), each part's first segment summed into its sums, the others into a chain
// buffer of their own and added on in order — every part's sum is gemm_stream's. Past kWideN
// columns (an LM head: GPT-2's 50257) 2 side by side: each part's sums and chain are then rows of
// hundreds of KB, and 4 parts' worth crossed L2 on every segment. One row of A through GPT-2's
// blocked head, 2 threads, its time over the B·Aᵀ stream's on [V, C] in the same process (medians
// of 6 and 9): 1.10 and 1.08 with 4 side by side, 1.03 and 1.05 with 2, 1.04 with 1
// (docs/performance-history.md, "A serving step's LM head on gemm_blocked's tiles"). The projections' widths (≤ 3072)
// keep 4: level with 2
// (bench_step_gemm 1 40 12 all 0 blk).
constexpr int64_t kWideN = 8192;

void stream_parts_blocked(int64_t M, int64_t N, const float* A, int64_t lda, const float* B, int64_t segments,
                          int64_t parts, int64_t p0, int64_t p1, float* sums, float* chains) {
  const int64_t side = N > kWideN ? 2 : 4;
  for (int64_t g = p0; g < p1; g += side) {
    const int64_t count = std::min(side, p1 - g);
    for (int64_t step = 0;; ++step) {
      int64_t k0[4];
      float* out[4];
      int64_t n = 0;
      for (int64_t p = g; p < g + count; ++p) {
        const int64_t seg = segments * p / parts + step;
        if (seg >= segments * (p + 1) / parts) continue;
        k0[n] = seg * kFreshKC;
        out[n++] = step == 0 ? sums + p * M * N : chains + (p - g) * M * N;
      }
      if (n == 0) break;
      switch (n) {
        case 4: stream_blocks<4>(M, N, A, lda, B, k0, out); break;
        case 3: stream_blocks<3>(M, N, A, lda, B, k0, out); break;
        case 2: stream_blocks<2>(M, N, A, lda, B, k0, out); break;
        default: stream_blocks<1>(M, N, A, lda, B, k0, out); break;
      }
      if (step == 0) continue;
      for (int64_t p = g; p < g + count; ++p) {
        if (segments * p / parts + step >= segments * (p + 1) / parts) continue;
        float* acc = sums + p * M * N;
        const float* chain = chains + (p - g) * M * N;
        int64_t i = 0;
        for (; i + kLanes <= M * N; i += kLanes) store(acc + i, load(acc + i) + load(chain + i));
        for (; i < M * N; ++i) acc[i] += chain[i];
      }
    }
  }
}

// rows [k0, k_end) into acc as one fresh chain: eight rows per pass over acc (1, 2, 4, 8 rows
// per pass at N=2304: 32.8, 27.7, 32.4, 33.5 GB/s; at K=3072, N=768: 32.3, 24.0, 28.3, 39.8).
void stream_chain(int64_t M, int64_t N, const float* A, int64_t lda, const float* B, int64_t ldb, int64_t k0,
                  int64_t k_end, float* acc) {
  int64_t k = k0;
  if (k + 8 <= k_end) {
    stream_rows<8, true>(M, N, A, lda, B, ldb, k, acc);
    k += 8;
  } else {
    stream_rows<1, true>(M, N, A, lda, B, ldb, k++, acc);
  }
  for (; k + 8 <= k_end; k += 8) stream_rows<8, false>(M, N, A, lda, B, ldb, k, acc);
  for (; k < k_end; ++k) stream_rows<1, false>(M, N, A, lda, B, ldb, k, acc);
}

void gemm_stream(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                 const float* bias, float* C, int64_t ldc, bool blocked = false) {
  const int64_t segments = (K + kFreshKC - 1) / kFreshKC;
  const int64_t parts = std::min(kStreamParts, segments);
  thread_local Scratch part_sums;
  float* sums = part_sums.reserve(parts * M * N);  // [part][M][N]
#pragma omp parallel if (M * N * K >= (int64_t{1} << 16))
  {
    thread_local Scratch chain_scratch;
    if (blocked) {  // the thread's parts as omp for's static schedule would give them
      const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t p0 = parts * t / threads, p1 = parts * (t + 1) / threads;
      stream_parts_blocked(M, N, A, lda, B, segments, parts, p0, p1, sums, chain_scratch.reserve(4 * M * N));
    }
    float* chain = blocked ? nullptr : chain_scratch.reserve(M * N);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < (blocked ? 0 : parts); ++p) {
      float* acc = sums + p * M * N;
      const int64_t s_begin = segments * p / parts, s_end = segments * (p + 1) / parts;
      for (int64_t seg = s_begin; seg < s_end; ++seg) {
        const int64_t k0 = seg * kFreshKC, k_end = std::min(K, k0 + kFreshKC);
        if (seg == s_begin) {
          stream_chain(M, N, A, lda, B, ldb, k0, k_end, acc);
          continue;
        }
        stream_chain(M, N, A, lda, B, ldb, k0, k_end, chain);
        int64_t i = 0;
        for (; i + kLanes <= M * N; i += kLanes) store(acc + i, load(acc + i) + load(chain + i));
        for (; i < M * N; ++i) acc[i] += chain[i];
      }
    }
    // C = bias + part0 + part1 + ..., a block of columns at a time.
    constexpr int64_t kCols = 256;
#pragma omp for collapse(2) schedule(static)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < N; j += kCols) {
        const int64_t cols = std::min(kCols, N - j);
        alignas(64) float c[kCols];
        for (int64_t jj = 0; jj < cols; ++jj) c[jj] = bias ? bias[j + jj] : 0.0f;
        for (int64_t p = 0; p < parts; ++p) {
          const float* s = sums + (p * M + m) * N + j;
          int64_t jj = 0;
          for (; jj + kLanes <= cols; jj += kLanes) store(c + jj, load(c + jj) + load(s + jj));
          for (; jj < cols; ++jj) c[jj] += s[jj];
        }
        std::copy(c, c + cols, C + m * ldc + j);
      }
  }
}

// The packed path (BLIS): B packed once into column panels, A a cache block at a time. Either
// operand may be stored transposed (only packing differs); accumulate: C's contents start the
// chains (bias unused). A Q8_0 or Q4_K B must be stored transposed.
template <class TB>
void gemm_packed(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, bool trans_a, const TB* B,
                 int64_t ldb, bool trans_b, const float* bias, float* C, int64_t ldc, bool accumulate,
                 bool blocked = false) {
  const int64_t panels = (N + kNR - 1) / kNR;
  thread_local Scratch packed_b;
  float* b_packed = packed_b.reserve(panels * (K + 1) * kNR);  // [panels][K][kNR], then bias [panels·kNR]
  float* bias_packed = b_packed + panels * K * kNR;
  // Tiles of C: row blocks × panel blocks, evened out so that no tile is a sliver.
  const int64_t m_blocks = (M + kMC - 1) / kMC, n_blocks = (panels + kNCP - 1) / kNCP;
  const int64_t mc = ((M + m_blocks - 1) / m_blocks + kMR - 1) / kMR * kMR;
  const int64_t ncp = (panels + n_blocks - 1) / n_blocks;
#pragma omp parallel if (M * N * K >= (int64_t{1} << 16))
  {
#pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t j = p * kNR, n = std::min<int64_t>(kNR, N - j);
      if constexpr (std::is_same_v<TB, float>) {
        if (blocked) pack_b_panel_blocked(K, N, j, B, b_packed + p * K * kNR);
      }
      if constexpr (std::is_same_v<TB, float> || std::is_same_v<TB, uint16_t>) {
        if (!trans_b && !blocked) pack_b_panel(K, n, B + j, ldb, b_packed + p * K * kNR);
      }
      if (trans_b) pack_b_panel_transposed(K, n, B + j * ldb, ldb, b_packed + p * K * kNR);
      for (int64_t jj = 0; jj < kNR; ++jj) bias_packed[j + jj] = bias && jj < n ? bias[j + jj] : 0.0f;
    }
    // The thread's packed row block of A, every K block of it ([K/kKC][mc/kMR][kc][kMR]), kept
    // while the thread's next tile is in the same row block (the tiles are handed out row block
    // by row block), so that A is packed about once per thread and row block, not once per tile.
    // Beyond kKeepA floats (a K of tens of thousands: a weight gradient over many tokens) one K
    // block at a time, packed for each tile, as the buffer would otherwise grow with K.
    const bool keep = mc * K <= kKeepA;
    thread_local Scratch packed_a;
    float* a_packed = packed_a.reserve(keep ? mc * K : mc * std::min(kKC, K));
    const auto pack_block = [&](int64_t i0, int64_t rows, int64_t pc, int64_t kc, float* dst) {
      if (trans_a)
        pack_a_transposed(rows, kc, A + pc * lda + i0, lda, dst);
      else
        pack_a(rows, kc, A + i0 * lda + pc, lda, dst);
    };
    int64_t packed_ib = -1;
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t ib = 0; ib < m_blocks; ++ib)
      for (int64_t jb = 0; jb < n_blocks; ++jb) {
        const int64_t i0 = ib * mc, i_end = std::min(M, i0 + mc);
        const int64_t p0 = jb * ncp, p_end = std::min(panels, p0 + ncp);
        if (i0 >= M || p0 >= panels) continue;
        if (keep && ib != packed_ib) {
          for (int64_t pc = 0; pc < K; pc += kKC) pack_block(i0, i_end - i0, pc, std::min(kKC, K - pc), a_packed + mc * pc);
          packed_ib = ib;
        }
        for (int64_t pc = 0; pc < K; pc += kKC) {
          const int64_t kc = std::min(kKC, K - pc);
          if (!keep) pack_block(i0, i_end - i0, pc, kc, a_packed);
          const float* a_block = keep ? a_packed + mc * pc : a_packed;  // [mc/kMR][kc][kMR]
          for (int64_t p = p0; p < p_end; ++p) {
            const int64_t j = p * kNR, n = std::min<int64_t>(kNR, N - j);
            const float* b = b_packed + (p * K + pc) * kNR;
            for (int64_t i = i0; i < i_end; i += kMR)
              run_tile(std::min<int64_t>(kMR, i_end - i), n, kc, a_block + (i - i0) * kc, b, kNR,
                       bias_packed + j, pc == 0 && !accumulate, C + i * ldc + j, ldc);
          }
        }
      }
  }
}

#if defined(__AVX512F__)
// 5–16 rows (a serving step) from a blocked B that streams from memory, on AVX-512 machines: tiles
// of up to 8 rows × one 16-column panel, one 512-bit accumulator a row, so that the panel's 1 KiB
// block is read from memory once, in address order, with one B load and 8 broadcasts a step for
// 8 FMAs on 8 independent chains (two FMA pipes of latency 4). The same tile in 256-bit halves
// (16 accumulators) is as fast on a 2-core Zen 4, whose AVX-512 units are 256 bits wide
// (there: 1.05× AVX2's 6 + 2 row tiles; 512-bit tiles level with AVX2's); on a Zen 5, with
// 512-bit FMA units, 256-bit FMAs capped the products at half its FMA peak: with B hot in the
// caches 240 GFLOP/s of 555, 315 with these tiles, and the 48 projections of an 8-sequence GPT-2
// step from memory 1.26× faster (docs/performance-history.md,
// "A Zen 5: the 8-row tiles in 512-bit registers"). Tiles of
// two panels (16 accumulators: 372 GFLOP/s hot) read from memory slower than one: their rows of
// two blocks 1 KiB apart interleave two streams. The chains are gemm_in_place's fresh ones (blocks
// of kFreshKC rows, kFreshParts fixed parts added in order), a lane each, so are the bits.
constexpr int kRowTile = 8;
// The first row group's tiles ask for B 16 KiB ahead into L2 (prefetcht1). On the Zen 4, 8 KiB
// ahead read the 48 projections (build/bench_step_gemm 8 20 12 all 0 blk) at 30-32 GB/s against
// 27-29 with a prefetcht0 2 KiB ahead, 16 KiB level or worse; on the Zen 5, whose tiles take half
// the time, 12-16 KiB ahead 1.04x faster than 8 (pass-by-pass alternation in one process), 4 KiB
// 1.13x slower, prefetcht0 and prefetcht2 about the same as prefetcht1.
constexpr int64_t kRowTileAhead = 4096;

// c[R, 16] (ldc) = start + a[0:16, R] · b[16 × 16 block], one fresh chain per element; start is
// init[0:16] for every row (ld 0) or c itself. a is A packed [K][kRowTile] at the block's row.
template <int R, bool kPrefetch>
void row_tile(const float* a, const float* b, const float* init, float* c, int64_t ldc) {
  static_assert(kFreshKC == kBlockedB && kBlockedB == 16, "one fresh chain per block of blocked B");
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int k = 0; k < kBlockedB; ++k) {
    const __m512 bv = _mm512_load_ps(b + k * kBlockedB);
    if constexpr (kPrefetch) _mm_prefetch(reinterpret_cast<const char*>(b + k * kBlockedB + kRowTileAhead), _MM_HINT_T1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[k * kRowTile + r]), bv, acc[r]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const float* start = init ? init : c + r * ldc;
    _mm512_storeu_ps(c + r * ldc, _mm512_add_ps(acc[r], _mm512_loadu_ps(start)));
  }
}

template <bool kPrefetch>
void run_row_tile(int rows, const float* a, const float* b, const float* init, float* c, int64_t ldc) {
  switch (rows) {
    case 8: return row_tile<8, kPrefetch>(a, b, init, c, ldc);
    case 7: return row_tile<7, kPrefetch>(a, b, init, c, ldc);
    case 6: return row_tile<6, kPrefetch>(a, b, init, c, ldc);
    case 5: return row_tile<5, kPrefetch>(a, b, init, c, ldc);
    case 4: return row_tile<4, kPrefetch>(a, b, init, c, ldc);
    case 3: return row_tile<3, kPrefetch>(a, b, init, c, ldc);
    case 2: return row_tile<2, kPrefetch>(a, b, init, c, ldc);
    default: return row_tile<1, kPrefetch>(a, b, init, c, ldc);
  }
}

// gemm_blocked for kStreamMaxM < M <= kFreshMaxM: gemm_in_place's split (K in kFreshParts parts,
// then column slices so that every thread has work) with row_tile's panels.
void gemm_blocked_rows(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                       const float* bias, float* C, int64_t ldc) {
  constexpr int64_t kGroups = kFreshMaxM / kRowTile;
  static_assert(kFreshMaxM % kRowTile == 0, "tiles of kRowTile rows cover kFreshMaxM");
  const int64_t groups = (M + kRowTile - 1) / kRowTile, panels = N / kBlockedB;
  const int64_t blocks = K / kBlockedB, parts = std::min(kFreshParts, blocks);
  thread_local Scratch part_scratch;
  float* part_sums = parts > 1 ? part_scratch.reserve((parts - 1) * M * N) : nullptr;  // [part - 1][M][N]
#pragma omp parallel if (M * N * K >= (int64_t{1} << 16))
  {
    const int64_t threads = omp_get_num_threads();
    const int64_t slices = std::max<int64_t>(1, (threads + parts - 1) / parts);
#pragma omp for schedule(static)
    for (int64_t item = 0; item < parts * slices; ++item) {
      const int64_t part = item / slices, slice = item % slices;
      const int64_t p_begin = panels * slice / slices, p_end = panels * (slice + 1) / slices;
      const int64_t k_begin = blocks * part / parts * kBlockedB, k_end = blocks * (part + 1) / parts * kBlockedB;
      float* out = part == 0 ? C : part_sums + (part - 1) * M * N;
      const int64_t ldo = part == 0 ? ldc : N;
      // A's columns [k_begin, k_end) packed by the thread that reads them (its own buffer): the
      // pack is not serial work that the other threads would wait for at the region's start.
      thread_local Scratch a_scratch;
      float* a_packed = a_scratch.reserve(kGroups * K * kRowTile);  // [group][K][kRowTile], [k_begin, k_end) set
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t r = 0; r < std::min<int64_t>(kRowTile, M - g * kRowTile); ++r) {
          const float* src = A + (g * kRowTile + r) * lda;
          for (int64_t k = k_begin; k < k_end; ++k) a_packed[(g * K + k) * kRowTile + r] = src[k];
        }
      for (int64_t k0 = k_begin; k0 < k_end; k0 += kBlockedB)
        for (int64_t p = p_begin; p < p_end; ++p) {
          const int64_t j = p * kBlockedB;
          alignas(64) float init[kBlockedB] = {};
          if (part == 0 && bias && k0 == k_begin) std::copy(bias + j, bias + j + kBlockedB, init);
          const float* start = k0 == k_begin ? init : nullptr;
          const float* b = B + blocked_index(k0, j, N);
          for (int64_t g = 0; g < groups; ++g) {
            const int rows = static_cast<int>(std::min<int64_t>(kRowTile, M - g * kRowTile));
            const float* a = a_packed + (g * K + k0) * kRowTile;
            float* c = out + g * kRowTile * ldo + j;
            if (g == 0)
              run_row_tile<true>(rows, a, b, start, c, ldo);
            else
              run_row_tile<false>(rows, a, b, start, c, ldo);
          }
        }
    }
    // C += part 1, part 2, ... in order (the implicit barrier above: all parts done)
    if (parts > 1) add_parts(M, N, parts, part_sums, C, ldc);
  }
}
#endif

}  // namespace

void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
          const float* bias, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = bias ? bias[j] : 0.0f;
    return;
  }
  if (M <= kStreamMaxM) return gemm_stream(M, N, K, A, lda, B, ldb, bias, C, ldc);
  if (M <= kInPlaceMaxM) return gemm_in_place(M, N, K, A, lda, B, ldb, bias, C, ldc);
  gemm_packed(M, N, K, A, lda, false, B, ldb, false, bias, C, ldc, false);
}

void gemm_blocked(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, const float* bias,
                  float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (M <= kStreamMaxM) return gemm_stream(M, N, K, A, lda, B, N, bias, C, ldc, true);
#if defined(__AVX512F__)
  if (M <= kFreshMaxM) return gemm_blocked_rows(M, N, K, A, lda, B, bias, C, ldc);
#endif
  if (M <= kInPlaceMaxM) return gemm_in_place(M, N, K, A, lda, B, N, bias, C, ldc, true);
  gemm_packed(M, N, K, A, lda, false, B, N, false, bias, C, ldc, false, true);
}

void gemm_ex(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, bool trans_a, const float* B, int64_t ldb,
             bool trans_b, float* C, int64_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
    return;
  }
  if (!trans_a && !trans_b && !accumulate) return gemm(M, N, K, A, lda, B, ldb, nullptr, C, ldc);
  gemm_packed(M, N, K, A, lda, trans_a, B, ldb, trans_b, nullptr, C, ldc, accumulate);
}

namespace {
// C = A·Bᵀ with B stored as T (widened or dequantised while packed).
template <class T>
void gemm_bt_stored(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const T* B, int64_t ldb, float* C,
                    int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
    return;
  }
  gemm_packed(M, N, K, A, lda, false, B, ldb, true, nullptr, C, ldc, false);
}
}  // namespace

void gemm_bt_bf16(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
                  float* C, int64_t ldc) {
  gemm_bt_stored(M, N, K, A, lda, B, ldb, C, ldc);
}

void gemm_bt_f16(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float16* B, int64_t ldb,
                 float* C, int64_t ldc) {
  gemm_bt_stored(M, N, K, A, lda, B, ldb, C, ldc);
}

void gemm_bf16(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const uint16_t* B, int64_t ldb,
               float* C, int64_t ldc, bool accumulate) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
    return;
  }
  gemm_packed(M, N, K, A, lda, false, B, ldb, false, nullptr, C, ldc, accumulate);
}

void gemm_bt_q8_0(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ8_0* B, int64_t ldb,
                  float* C, int64_t ldc) {
  gemm_bt_stored(M, N, K, A, lda, B, ldb, C, ldc);
}

void gemm_bt_q4_k(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ4_K* B, int64_t ldb,
                  float* C, int64_t ldc) {
  gemm_bt_stored(M, N, K, A, lda, B, ldb, C, ldc);
}

}  // namespace mhsa::kernels::MHSA_ISA
