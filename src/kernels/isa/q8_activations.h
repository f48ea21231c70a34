// kernels/isa/q8_activations.h — what the integer-dot decode streams (matmul_bt.cpp's Q8_0,
// matmul_q4_k.cpp's Q4_K) share: the rows of A quantised per 32-value block, bit for bit as
// kernels::quantize_activations_q8 does, into the calling thread's scratch, and the 8 float lanes
// their chains accumulate in (summed at the end by simd.h's fixed 8-lane tree). Included by
// per-ISA sources after kernels/isa/simd.h; not a kernel itself.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/q8_0.h"

namespace mhsa::kernels::MHSA_ISA {

#if defined(__AVX2__)  // the avx2 and avx512 builds: one 256-bit register
using Lanes = float __attribute__((vector_size(8 * sizeof(float))));

inline Lanes splat8(float x) { return x - Lanes{}; }
inline Lanes load8(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof(Lanes));
  return v;
}
inline Lanes mul8(Lanes a, Lanes b) { return a * b; }
inline Lanes fused8(Lanes a, Lanes b, Lanes c) { return (Lanes)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
inline float sum8(Lanes v) { return reduce(v, [](Lanes x, Lanes y) { return x + y; }); }
#else  // 4-lane vectors: the 8 lanes as two, summed by the same tree
struct Lanes {
  Vec lo, hi;  // lanes 0–3, 4–7
};

inline Lanes splat8(float x) { return {splat(x), splat(x)}; }
inline Lanes load8(const float* p) { return {load(p), load(p + 4)}; }
inline Lanes mul8(Lanes a, Lanes b) { return {a.lo * b.lo, a.hi * b.hi}; }
inline Lanes fused8(Lanes a, Lanes b, Lanes c) { return {fma(a.lo, b.lo, c.lo), fma(a.hi, b.hi, c.hi)}; }
inline float sum8(Lanes v) { return reduce_sum(v.lo + v.hi); }
#endif

// A [M, K] quantised: q [M, K] int8 (rows K apart), d [M, nb] scales (rows nb apart, nb = K / 32).
struct QuantizedA {
  const int8_t* q;
  const float* d;
  int64_t K, nb;
};

inline Vec abs(Vec v) { return (Vec)((IVec)v & 0x7fffffff); }

// quantize_activations_q8 of every row of A [M, K] (lda) into q and d, bit for bit: the block's
// maximum is exact in any order, d and 1 / d are single IEEE operations, and roundf is done
// exactly (truncate, then step away from zero when the dropped part is at least one half).
inline void quantize_rows(int64_t M, int64_t K, const float* A, int64_t lda, int8_t* q, float* d) {
  constexpr int kBlockVecs = static_cast<int>(kQ8Block) / kLanes;  // 2 (AVX-512), 4 (AVX2), 8 (portable)
  using Bytes = int8_t __attribute__((vector_size(kLanes)));
  const int64_t nb = K / kQ8Block;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t b = 0; b < nb; ++b) {
      const float* x = A + i * lda + b * kQ8Block;
      int8_t* qb = q + i * K + b * kQ8Block;
      Vec v[kBlockVecs], amax = splat(0.0f);
      IVec bad = {};
      for (int u = 0; u < kBlockVecs; ++u) {
        v[u] = load(x + u * kLanes);
        bad |= ~(abs(v[u]) <= splat(std::numeric_limits<float>::max()));  // NaN or ±inf
        amax = max(amax, abs(v[u]));
      }
      bool finite = true;
      for (int l = 0; l < kLanes; ++l) finite = finite && bad[l] == 0;
      float& db = d[i * nb + b];
      db = finite ? reduce_max(amax) / 127.0f : std::numeric_limits<float>::quiet_NaN();
      if (!(db >= std::numeric_limits<float>::min())) {  // NaN, zero or subnormal: no quants
        if (finite) db = 0.0f;
        std::memset(qb, 0, kQ8Block);
        continue;
      }
      const Vec id = splat(1.0f / db);
      for (int u = 0; u < kBlockVecs; ++u) {
        const Vec y = v[u] * id;                    // |y| ≤ 127 (and a hair)
        IVec t = __builtin_convertvector(y, IVec);  // truncated
        const Vec tf = __builtin_convertvector(t, Vec);
        t = t - (IVec)(y >= tf + 0.5f) + (IVec)(y <= tf - 0.5f);  // a true comparison is −1
        const Bytes bytes = __builtin_convertvector(t, Bytes);
        std::memcpy(qb + u * kLanes, &bytes, kLanes);
      }
    }
}

// A [M, K] (lda) quantised by quantize_rows into the calling thread's scratch, kept between
// calls; valid until the thread's next call.
inline QuantizedA quantize_a(int64_t M, int64_t K, const float* A, int64_t lda) {
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> d;
  const int64_t nb = K / kQ8Block;
  if (static_cast<int64_t>(q.size()) < M * K) q.resize(static_cast<size_t>(M * K));
  if (static_cast<int64_t>(d.size()) < M * nb) d.resize(static_cast<size_t>(M * nb));
  quantize_rows(M, K, A, lda, q.data(), d.data());
  return {q.data(), d.data(), K, nb};
}

}  // namespace mhsa::kernels::MHSA_ISA
