// kernels/isa/simd.h — the one small set of vector primitives under every fast kernel.
//
// Included by kernel sources that are compiled once per ISA (see cmake/isa.cmake): the including
// file defines MHSA_ISA (portable, avx2 or avx512), which names the namespace, and the compiler
// flags of that translation unit decide the vector width through GCC/Clang vector extensions:
// 16 lanes with AVX-512, 8 with AVX2, 4 otherwise (SSE2 on x86, NEON on ARM, or scalar code).
// Kernels are written once against these primitives. Not a general SIMD library.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/bf16.h"
#include "kernels/half.h"
#include "mhsa/tensor.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#ifndef MHSA_ISA
#error "define MHSA_ISA (the ISA namespace) before including kernels/isa/simd.h"
#endif

namespace mhsa::kernels::MHSA_ISA {

#if defined(__AVX512F__)
inline constexpr int kLanes = 16;
#elif defined(__AVX2__)
inline constexpr int kLanes = 8;
#else
inline constexpr int kLanes = 4;
#endif

using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));
using IVec = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));

// x - (+0) is x for every x (−0 included), so this compiles to one broadcast; x + 0 would not.
inline Vec splat(float x) { return x - Vec{}; }
inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof(Vec));
  return v;
}
inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof(Vec)); }
// First n < kLanes lanes from p, the rest `fill`.
inline Vec load_partial(const float* p, int n, float fill) {
  Vec v = splat(fill);
  for (int i = 0; i < n; ++i) v[i] = p[i];
  return v;
}
inline void store_partial(float* p, Vec v, int n) {
  for (int i = 0; i < n; ++i) p[i] = v[i];
}
// kLanes bfloat16 values (the upper halves of float32s) from p, widened exactly: zero-extend each
// to 32 bits and shift it into the high half (one vpmovzxwd + vpslld on x86).
inline Vec load_bf16(const uint16_t* p) {
#if defined(__AVX512F__)
  // The zero-masked forms: GCC 12's plain ones start from _mm512_undefined and warn when inlined.
  const __m512i w = _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return (Vec)_mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, w, 16));
#elif defined(__AVX2__)
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return (Vec)_mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
#else
  using Half = uint16_t __attribute__((vector_size(kLanes * sizeof(uint16_t))));
  using Word = uint32_t __attribute__((vector_size(kLanes * sizeof(uint32_t))));
  Half h;
  std::memcpy(&h, p, sizeof(Half));
  const Word w = __builtin_convertvector(h, Word) << 16;
  Vec v;
  std::memcpy(&v, &w, sizeof(Vec));
  return v;
#endif
}
// First n < kLanes bfloat16 values from p widened, the rest 0.
inline Vec load_partial_bf16(const uint16_t* p, int n) {
  Vec v = splat(0.0f);
  for (int i = 0; i < n; ++i) {
    const uint32_t w = uint32_t{p[i]} << 16;
    float f;
    std::memcpy(&f, &w, sizeof(float));
    v[i] = f;
  }
  return v;
}
// An IEEE f16 value (a Q8_0 block's scale) as float, exactly: F16C's vcvtph2ps where the ISA
// has it, kernels/half.h's portable conversion otherwise.
inline float f16_scalar(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return f16_to_float(h);
#endif
}
// kLanes IEEE f16 values from p, widened exactly: F16C's vcvtph2ps where the ISA has it.
inline Vec load_f16(const uint16_t* p) {
#if defined(__AVX512F__)
  // (the zero-masked form with every lane selected: the same instruction's result, without GCC 12's
  // false -Wmaybe-uninitialized on the plain intrinsic's undefined source)
  return (Vec)_mm512_maskz_cvtph_ps(__mmask16{0xFFFF}, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__F16C__) && defined(__AVX2__)
  return (Vec)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  Vec v;
  for (int i = 0; i < kLanes; ++i) v[i] = f16_scalar(p[i]);
  return v;
#endif
}

// Keys and values of a KV cache (float, bfloat16 or float16 elements) as float32 vectors, exactly:
// kLanes from p, or the first n < kLanes and zeros; one element.
inline Vec load_kv(const float* p) { return load(p); }
inline Vec load_kv(const bfloat16* p) { return load_bf16(&p->bits); }
inline Vec load_kv(const float16* p) { return load_f16(&p->bits); }
inline Vec load_partial_kv(const float* p, int n) { return load_partial(p, n, 0.0f); }
inline Vec load_partial_kv(const bfloat16* p, int n) { return load_partial_bf16(&p->bits, n); }
inline Vec load_partial_kv(const float16* p, int n) {
  Vec v = splat(0.0f);
  for (int i = 0; i < n; ++i) v[i] = f16_scalar(p[i].bits);
  return v;
}
inline float widen_kv(float x) { return x; }
inline float widen_kv(bfloat16 x) { return bf16_to_float(x.bits); }
inline float widen_kv(float16 x) { return f16_scalar(x.bits); }
// kLanes int8 values from p as float32 vectors (exact).
inline Vec load_i8(const int8_t* p) {
#if defined(__AVX512F__)
  return (Vec)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX2__)
  return (Vec)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  Vec v;
  for (int i = 0; i < kLanes; ++i) v[i] = static_cast<float>(p[i]);
  return v;
#endif
}
// Elements [d, d + kLanes) of a key or value row as float32, exactly: load_kv(row + d), or for a
// Q8_0 row (d a multiple of kLanes, so within one 32-value block) the block's f16 scale times its
// int8 quants — a product exact in float32, so the dequantised value. The first n < kLanes and
// zeros (load_partial_kv_at): only rows whose length is not a multiple of kLanes, never Q8_0's.
template <class T>
inline Vec load_kv_at(const T* row, int64_t d) {
  return load_kv(row + d);
}
template <>
inline Vec load_kv_at(const BlockQ8_0* row, int64_t d) {
  const BlockQ8_0& block = row[d >> 5];
  return splat(f16_scalar(block.d)) * load_i8(block.qs + (d & 31));
}
template <class T>
inline Vec load_partial_kv_at(const T* row, int64_t d, int n) {
  return load_partial_kv(row + d, n);
}
template <>
inline Vec load_partial_kv_at(const BlockQ8_0* row, int64_t d, int n) {
  Vec v = splat(0.0f);
  for (int i = 0; i < n; ++i) {
    const BlockQ8_0& block = row[(d + i) >> 5];
    v[i] = f16_scalar(block.d) * static_cast<float>(block.qs[(d + i) & 31]);
  }
  return v;
}
// Element d of a key or value row as float32, exactly (see load_kv_at).
template <class T>
inline float kv_scalar_at(const T* row, int64_t d) {
  return widen_kv(row[d]);
}
template <>
inline float kv_scalar_at(const BlockQ8_0* row, int64_t d) {
  const BlockQ8_0& block = row[d >> 5];
  return f16_scalar(block.d) * static_cast<float>(block.qs[d & 31]);
}
inline Vec max(Vec a, Vec b) { return a > b ? a : b; }
// Square root of every lane (the hardware instruction; the vector extensions have none).
inline Vec sqrt(Vec x) {
#if defined(__AVX512F__)
  // _mm512_sqrt_ps passes _mm512_undefined_ps() as the merge source, which GCC 12 reports as
  // -Wmaybe-uninitialized; merging into x itself under an all-ones mask is the same vsqrtps.
  return (Vec)_mm512_mask_sqrt_ps((__m512)x, static_cast<__mmask16>(-1), (__m512)x);
#elif defined(__AVX2__)
  return (Vec)_mm256_sqrt_ps((__m256)x);
#elif defined(__SSE2__)
  return (Vec)_mm_sqrt_ps((__m128)x);
#elif defined(__aarch64__)
  return (Vec)vsqrtq_f32((float32x4_t)x);
#else
  for (int i = 0; i < kLanes; ++i) x[i] = __builtin_sqrtf(x[i]);
  return x;
#endif
}
inline Vec min(Vec a, Vec b) { return a < b ? a : b; }
// a·b + c in one rounding where the ISA has an FMA, said explicitly: GCC contracts a * b + c only
// when optimising at -O2 and above, and the kernels' bits (a row with one visible key has dS = 0
// exactly, say) must not depend on the optimisation level (an -O1 sanitizer build found this).
inline Vec fma(Vec a, Vec b, Vec c) {
#if defined(__AVX512F__)
  return (Vec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__AVX2__) && defined(__FMA__)
  return (Vec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#elif defined(__aarch64__)
  return (Vec)vfmaq_f32((float32x4_t)c, (float32x4_t)a, (float32x4_t)b);
#else
  return a * b + c;  // no FMA instruction
#endif
}

// Horizontal reductions in a fixed lane order (a binary tree of halvings), so results never
// depend on anything but the inputs. Each halving is one shuffle and one add (or max).
template <class V, class Op>  // V is a template parameter so that other widths' shuffles are discarded
inline float reduce(V v, Op op) {
  constexpr int L = sizeof(V) / sizeof(float);
  if constexpr (L == 16)
    v = op(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  if constexpr (L == 16)
    v = op(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  else if constexpr (L == 8)
    v = op(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3));
  if constexpr (L == 16)
    v = op(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  else if constexpr (L == 8)
    v = op(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5));
  else
    v = op(v, __builtin_shufflevector(v, v, 2, 3, 0, 1));
  if constexpr (L == 16)
    v = op(v, __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
  else if constexpr (L == 8)
    v = op(v, __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6));
  else
    v = op(v, __builtin_shufflevector(v, v, 1, 0, 3, 2));
  return v[0];
}
inline float reduce_sum(Vec v) {
  return reduce(v, [](Vec a, Vec b) { return a + b; });
}
inline float reduce_max(Vec v) {
  return reduce(v, [](Vec a, Vec b) { return a > b ? a : b; });
}

// e^r by its Taylor series to r^7 (truncation error < |r|^8/8! < 5e-9 for |r| <= ln2/2): the
// polynomial of exp below (and of the bfloat16 attention's exp, flash_attention_bf16.cpp).
inline Vec exp_taylor7(Vec r) {
  Vec p = splat(1.0f / 5040.0f);
  p = fma(p, r, splat(1.0f / 720.0f));
  p = fma(p, r, splat(1.0f / 120.0f));
  p = fma(p, r, splat(1.0f / 24.0f));
  p = fma(p, r, splat(1.0f / 6.0f));
  p = fma(p, r, splat(0.5f));
  p = fma(p, r, splat(1.0f));
  return fma(p, r, splat(1.0f));
}

// e^x for every lane: range reduction x = n·ln2 + r with |r| <= ln2/2, a degree-7 polynomial for
// e^r, and 2^n built in the exponent bits. A few ulp on [-87.3, 88]; inputs below -87.3
// (including -inf) give exactly 0, the value a masked score must contribute; inputs above 88
// saturate at e^88 (softmax only ever asks for x <= 0); NaN gives NaN (IEEE: a NaN score must
// reach the output, not be clamped into a weight of ~0).
inline Vec exp(Vec x) {
  const Vec hi = splat(88.0f);
  const Vec lo = splat(-87.33f);
  const IVec underflow = x < lo;
  x = min(hi, max(lo, x));  // max(a, b) and min(a, b) return b when a lane compares unordered
  // Round to nearest: floor(x·log2e + 0.5).
  Vec t = x * 1.44269504088896341f + 0.5f;
  IVec ti = __builtin_convertvector(t, IVec);  // truncates toward zero
  Vec tf = __builtin_convertvector(ti, Vec);
  ti -= (IVec)(tf > t) & 1;                     // -> floor
  tf = __builtin_convertvector(ti, Vec);
  Vec r = x - tf * 0.693359375f;                // ln2 split in two for an exact product
  r = r - tf * -2.12194440e-4f;
  const Vec p = exp_taylor7(r);
  const IVec bits = (ti + 127) << 23;
  Vec scale;
  std::memcpy(&scale, &bits, sizeof(Vec));
  const Vec result = p * scale;
  return underflow ? splat(0.0f) : result;
}

// tanh of every lane, to a few ulp: for |x| < 0.625 the odd polynomial x + x³·P(x²) (P fitted
// for the least relative error on that interval, 1.3 ulp), beyond it 1 − 2/(e^2x + 1), which
// loses nothing to cancellation there and saturates to ±1 (e^2x is 0 or e^88 at the ends);
// NaN gives NaN (it fails the |x| test and exp keeps it).
inline Vec tanh(Vec x) {
  const Vec u = x * x;
  Vec p = splat(-8.135546231642365e-4f);
  p = fma(p, u, splat(3.242715261876583e-3f));
  p = fma(p, u, splat(-8.75887181609869e-3f));
  p = fma(p, u, splat(2.1852007135748863e-2f));
  p = fma(p, u, splat(-5.396667867898941e-2f));
  p = fma(p, u, splat(1.333332657814026e-1f));
  p = fma(p, u, splat(-3.333333432674408e-1f));
  const Vec small = fma(x * u, p, x);
  const Vec large = 1.0f - 2.0f / (exp(x + x) + 1.0f);
  return u < 0.390625f ? small : large;
}

}  // namespace mhsa::kernels::MHSA_ISA
