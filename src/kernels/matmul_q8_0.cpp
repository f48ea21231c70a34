// kernels/matmul_q8_0.cpp — C[M, N] = A[M, K] · B[N, K]ᵀ for a few rows M with B stored as Q8_0
// blocks (kernels/q8_0.h: 34 bytes per 32 weights instead of 128), compiled once per ISA, and once
// more for each x86 ISA with its VNNI extension's vpdpbusd (avx512vnni: AVX512_VNNI; avx2vnni:
// AVX-VNNI, as Alder Lake and Zen 5 have it; run where cpu::vnni(isa)): the weight streams of
// decoding an 8-bit model. The same plan as matmul_bt.cpp's streams: several
// matrices that multiply one A are one call, their rows one row space that the threads share in
// groups of kGroup rows (isa/bt_parts.h: one even range a thread for one row of A, claimed ones
// for more); with one row of A, row i of each quarter of a range side by side, each row its own
// ascending stream.
//
// A is quantised per block too, for integer dot products (llama.cpp's way): each row of A once
// per call to int8 blocks with float scales (quantize_activations_q8, bit for bit:
// isa/q8_activations.h), and an element of C is, on every ISA:
//
//   for each block b in order, for each lane l < 8:
//     acc[l] = fma(dB_b · dA_b, Σ_{i<4} qa[32b + 4l + i] · qb[32b + 4l + i], acc[l])
//   C = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))
//
// dB_b · dA_b is one float product (dB_b the block's f16 scale, widened), each lane's integer sum
// is exact (and exact as a float: |sum| ≤ 4·127·128), fma is fused where the ISA has FMA (AVX2,
// AVX-512, NEON; the portable build on x86 multiplies and adds), and the last line is simd.h's
// 8-lane horizontal sum. So the chain depends on nothing but the inputs: not the grouping, the
// thread count, the number of rows, nor (given FMA) the ISA or whether it has VNNI. Its float64
// twin is matmul_bt_q8_0_ref. The results are the dequantised A times the dequantised B to float
// rounding, not the float kernels on the dequantised B. The AVX-512 builds run 256-bit code as
// AVX2 does: 512-bit registers would put two blocks with two scales in one register, a different
// chain.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/isa/simd.h"
#include "kernels/isa/bt_parts.h"
#include "kernels/isa/q8_activations.h"

namespace mhsa::kernels::MHSA_ISA {
namespace {

// A quantised, and where the lanes come from vpdpbusd, each lane's correction (below): corr
// [M, nb, 8] int32, or null.
struct Activations {
  QuantizedA a;
  const int32_t* corr;
};

#if defined(__AVX2__)  // the avx2 and avx512 builds: 256-bit integer dot products
using Quants = __m256i;  // one block's 32 quants

inline Quants load_quants(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// dB · dA in all 8 lanes: dB (the block's f16 scale) widened in a vector, one product.
inline Lanes block_scale(uint16_t d, float da) {
  return (Lanes)_mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(d))), _mm256_set1_ps(da));
}
#else
struct Quants {
  const int8_t* p;
};

inline Quants load_quants(const int8_t* p) { return {p}; }
inline Lanes block_scale(uint16_t d, float da) { return splat8(f16_scalar(d) * da); }
#endif

#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
// The lane sums by vpdpbusd, which multiplies unsigned by signed bytes and adds four products
// into int32: B's quants as qb + 128 (qb ^ 0x80, unsigned: 0..255, so a −128 a foreign file
// may hold is fine) against A's, the accumulator starting at the lane's −128 · Σ qa (`corr`,
// per call), which leaves Σ qa·qb exactly (|Σ (qb + 128)·qa| ≤ 4·255·127: no overflow). Two
// instructions a block where the sign trick below takes four. SmolLM2's 576-wide Q8_0 rows on
// one Zen 5 core from L2: 0.83 -> 0.66 ns a block (docs/performance-history.md,
// "Decode streams split evenly; Q8_0 on VNNI").
constexpr bool kCorrections = true;

inline Quants weight_quants(const int8_t* p) { return _mm256_xor_si256(load_quants(p), _mm256_set1_epi8(-128)); }

inline Lanes block_lanes(Quants qa, Quants qb_biased, const int32_t* corr) {
  const __m256i start = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(corr));
#if defined(__AVX512VNNI__)
  return (Lanes)_mm256_cvtepi32_ps(_mm256_dpbusd_epi32(start, qb_biased, qa));
#else
  return (Lanes)_mm256_cvtepi32_ps(_mm256_dpbusd_avx_epi32(start, qb_biased, qa));
#endif
}
#elif defined(__AVX2__)
constexpr bool kCorrections = false;

inline Quants weight_quants(const int8_t* p) { return load_quants(p); }

// The 8 exact lane sums of one block, as floats. vpmaddubsw multiplies unsigned by signed bytes:
// |qb| (128 for the −128 a foreign file may hold) by qa carrying qb's sign (qa, an activation
// quant, is never −128), adding pairs into int16 (|pair| ≤ 2·128·127: no saturation); vpmaddwd
// adds the pairs of pairs into int32.
inline Lanes block_lanes(Quants qa, Quants qb, const int32_t*) {
  const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(qb), _mm256_sign_epi8(qa, qb));
  return (Lanes)_mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
#else  // 4-lane vectors: scalar integer sums
constexpr bool kCorrections = false;

inline Quants weight_quants(const int8_t* p) { return {p}; }

inline Lanes block_lanes(Quants qa, Quants qb, const int32_t*) {
  float sums[8];
  for (int l = 0; l < 8; ++l) {
    int32_t sum = 0;
    for (int i = 4 * l; i < 4 * l + 4; ++i) sum += int32_t{qa.p[i]} * qb.p[i];
    sums[l] = static_cast<float>(sum);
  }
  return load8(sums);
}
#endif

// A quantised once per call, into the calling thread's scratch, with the lanes' corrections
// where the build takes them.
Activations quantize(int64_t M, int64_t K, const float* A, int64_t lda) {
  const QuantizedA a = quantize_a(M, K, A, lda);
  if constexpr (!kCorrections) {
    return {a, nullptr};
  } else {
    thread_local std::vector<int32_t> corr;
    const int64_t lanes = M * a.nb * 8;
    if (static_cast<int64_t>(corr.size()) < lanes) corr.resize(static_cast<size_t>(lanes));
    for (int64_t i = 0; i < lanes; ++i)
      corr[static_cast<size_t>(i)] = -128 * (int32_t{a.q[4 * i]} + a.q[4 * i + 1] + a.q[4 * i + 2] + a.q[4 * i + 3]);
    return {a, corr.data()};
  }
}

// A software prefetch this many bytes ahead in a Q8_0 row's stream (past the row's end it is
// the next row's start when rows are contiguous, as a weight's are), once per two blocks. One row
// of B in a single stream prefetched 2 KiB ahead was read ~1.4× as fast as kGroup adjacent rows
// interleaved (GPT-2's c_fc shape, 2 threads, bench_q8_0: 31–33 against 22–23 GB/s;
// docs/performance-history.md, "Decode streams read as one ascending stream"; 512 ahead gained less,
// 1024–4096 about the same). Two rows half a range apart, each such a stream with its own chain
// (dot_q8<1, 2>), beat one: SmolLM2's shape at Q8_0, tg128 1.18× (1.06–1.25; docs/performance-history.md,
// "Decode streams as separate ascending streams").
constexpr int64_t kQ8Prefetch = 2048;

// out[r·ldc + j·apart] = row m + r of A · B row j·apart for R rows of A and J rows of B, `apart`
// rows of ldb blocks from each other: the chain above for each (r, j), the same whatever R, J and
// apart. Each row of B is its own stream, prefetched kQ8Prefetch ahead.
template <int R, int J>
void dot_q8(const Activations& x, int64_t m, const BlockQ8_0* B, int64_t ldb, int64_t apart, float* out,
            int64_t ldc) {
  const QuantizedA& a = x.a;
  Lanes acc[R][J] = {};
  for (int64_t b = 0; b < a.nb; ++b)
    for (int j = 0; j < J; ++j) {
      const BlockQ8_0& blk = B[j * apart * ldb + b];
      if (b % 2 == 0) __builtin_prefetch(reinterpret_cast<const char*>(&blk) + kQ8Prefetch);
      const Quants qb = weight_quants(blk.qs);
      for (int r = 0; r < R; ++r) {
        const int64_t ab = (m + r) * a.nb + b;  // A's block
        const Quants qa = load_quants(a.q + (m + r) * a.K + b * kQ8Block);
        acc[r][j] = fused8(block_scale(blk.d, a.d[ab]), block_lanes(qa, qb, kCorrections ? x.corr + ab * 8 : nullptr),
                           acc[r][j]);
      }
    }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) out[r * ldc + j * apart] = sum8(acc[r][j]);
}

// Rows of B a part of the range apart that one row of A reads side by side: four (GPT-2 124M's
// Q8_0 weights, 132 MB from memory, 2 threads, pass-by-pass alternation on a Zen 5: 1.05-1.06x
// two, three 1.02-1.03x; docs/performance-history.md, "A Zen 5: the 8-row tiles in 512-bit registers").
constexpr int kQ8ColStreams = 4;

// C[M, rows] = A · B[rows, K/32 blocks]ᵀ (ldb in blocks) with A quantised, in stream_rows' order
// (isa/bt_parts.h): one row of A against kQ8ColStreams rows of B at a time, a part of the range
// apart, or each group of kGroup rows in turn against kRows rows of A at a time.
void range_product(const Activations& x, int64_t M, const BlockQ8_0* B, int64_t ldb, int64_t rows, float* C,
                   int64_t ldc) {
  stream_rows<kQ8ColStreams>(M, rows, [&](auto R, auto J, int64_t m, int64_t n, int64_t apart) {
    dot_q8<decltype(R)::value, decltype(J)::value>(x, m, B + n * ldb, ldb, apart, C + m * ldc + n, ldc);
  });
}

}  // namespace

void matmul_bt_parts_q8_0(int64_t M, int64_t K, const float* A, int64_t lda, const BtPartQ8* parts, int count) {
  const Activations x = quantize(M, K, A, lda);
  parts_product(K, parts, count, /*even=*/M == 1, [&](const BtPartQ8& part, int64_t n0, int64_t n) {
    range_product(x, M, part.B + n0 * part.ldb, part.ldb, n, part.C + n0, part.ldc);
  });
}

void matmul_bt_q8_0(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ8_0* B, int64_t ldb,
                    float* C, int64_t ldc) {
  const BtPartQ8 part{B, ldb, N, C, ldc};
  matmul_bt_parts_q8_0(M, K, A, lda, &part, 1);
}

}  // namespace mhsa::kernels::MHSA_ISA
