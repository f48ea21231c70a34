// kernels/q4_k.cpp — the Q4_K quantiser and dequantiser (kernels/q4_k.h) and the float64 twins of
// the kernels that multiply by Q4_K rows. Scalar: run once per weight at load or when writing a
// file, never on the decode path. Built with -ffp-contract=off: the dequantised values must be
// the separately rounded products and difference ggml and the gguf package compute.
#include "kernels/q4_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/half.h"
#include "kernels/q8_0.h"

namespace mhsa::kernels {
namespace {

constexpr int kSubs = static_cast<int>(kQ4KBlock / kQ4KSub);  // 8

// The value a quant q of a sub-block with coefficients scale = d·sc, offset = dmin·m stands for.
inline float value(float scale, float offset, int q) { return scale * static_cast<float>(q) - offset; }

// Squared error of one sub-block x [32] stored with these coefficients; the quants in q (each the
// nearest to x[i], 0 where the scale is 0).
float sub_error(const float* x, float scale, float offset, int* q) {
  const float inv = scale > 1e-30f ? 1.0f / scale : 0.0f;  // finite
  float e = 0.0f;
  for (int i = 0; i < kQ4KSub; ++i) {
    float v = (x[i] + offset) * inv;
    v = v > 0.0f ? v : 0.0f;
    v = v < 15.0f ? v : 15.0f;
    q[i] = static_cast<int>(v + 0.5f);
    const float r = value(scale, offset, q[i]) - x[i];
    e += r * r;
  }
  return e;
}

// Least squares x ≈ a·q − b over n values with b ≥ 0; false when q is constant (a undetermined).
bool affine_fit(const float* x, const int* q, int n, double* a, double* b) {
  double sq = 0, sqq = 0, sx = 0, sqx = 0;
  for (int i = 0; i < n; ++i) {
    sq += q[i];
    sqq += static_cast<double>(q[i]) * q[i];
    sx += x[i];
    sqx += q[i] * double{x[i]};
  }
  const double det = n * sqq - sq * sq;
  if (det <= 0) return false;
  *a = (n * sqx - sq * sx) / det;
  *b = -(sx - *a * sq) / n;
  if (*b < 0) {  // the offset may only lower the values: fit through the origin
    *b = 0;
    *a = sqx / sqq;
  }
  return *a > 0;
}

// The best (a, b) of one sub-block, before the 6-bit rounding: several starting ranges, each
// refined by alternating rounding and least squares.
void fit_sub_block(const float* x, float* a_out, float* b_out) {
  float lo = 0.0f, hi = x[0];
  for (int i = 0; i < kQ4KSub; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  *a_out = 0.0f;
  *b_out = -lo;
  if (!(hi > lo)) return;
  int q[kQ4KSub];
  float best = sub_error(x, 0.0f, -lo, q);
  for (float steps : {14.0f, 14.5f, 15.0f, 15.5f, 16.0f}) {
    float a = (hi - lo) / steps, b = -lo;
    for (int it = 0; it < 3; ++it) {
      const float e = sub_error(x, a, b, q);
      if (e < best) best = e, *a_out = a, *b_out = b;
      double fa, fb;
      if (!affine_fit(x, q, kQ4KSub, &fa, &fb)) break;
      a = static_cast<float>(fa), b = static_cast<float>(fb);
    }
  }
}

// Packs the 6-bit scales and mins as ggml does (the inverse of q4_k_scale_min).
void pack_scales(const int* sc, const int* m, uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
  }
}

// A candidate block: f16 d and dmin, 6-bit sc and m, quants; its squared error.
struct Candidate {
  uint16_t d = 0, dmin = 0;
  int sc[kSubs] = {}, m[kSubs] = {};
  int q[kQ4KBlock] = {};
  double error = 0;
};

// For f16 d, dmin: each sub-block's sc, m (the rounded a/d, b/dmin and their neighbours, the best
// kept) and quants.
void choose_codes(const float* x, const float* a, const float* b, Candidate& c) {
  const float d = f16_to_float(c.d), dmin = f16_to_float(c.dmin);
  c.error = 0;
  for (int s = 0; s < kSubs; ++s) {
    const float* xs = x + s * kQ4KSub;
    const int sc0 = d > 0 ? static_cast<int>(std::lround(std::clamp(a[s] / d, 0.0f, 63.0f))) : 0;
    const int m0 = dmin > 0 ? static_cast<int>(std::lround(std::clamp(b[s] / dmin, 0.0f, 63.0f))) : 0;
    float best = -1;
    int q[kQ4KSub];
    for (int dsc = -1; dsc <= 1; ++dsc)
      for (int dm = -1; dm <= 1; ++dm) {
        const int sc = sc0 + dsc, m = m0 + dm;
        if (sc < 0 || sc > 63 || m < 0 || m > 63) continue;
        const float e = sub_error(xs, d * static_cast<float>(sc), dmin * static_cast<float>(m), q);
        if (best < 0 || e < best) {
          best = e;
          c.sc[s] = sc, c.m[s] = m;
          std::copy(q, q + kQ4KSub, c.q + s * kQ4KSub);
        }
      }
    c.error += best;
  }
}

void quantize_block(const float* x, BlockQ4_K& out) {
  float a[kSubs], b[kSubs], amax = 0.0f, bmax = 0.0f;
  for (int s = 0; s < kSubs; ++s) {
    fit_sub_block(x + s * kQ4KSub, a + s, b + s);
    amax = std::max(amax, a[s]);
    bmax = std::max(bmax, b[s]);
  }
  Candidate best, c;
  c.d = float_to_f16(amax / 63.0f);
  c.dmin = float_to_f16(bmax / 63.0f);
  choose_codes(x, a, b, c);
  best = c;
  for (int it = 0; it < 2; ++it) {
    // Least squares for (d, dmin) over the block with the integer codes fixed: x ≈ d·u − dmin·v.
    double suu = 0, suv = 0, svv = 0, sux = 0, svx = 0;
    for (int i = 0; i < kQ4KBlock; ++i) {
      const double u = c.sc[i / kQ4KSub] * c.q[i], v = c.m[i / kQ4KSub];
      suu += u * u, suv += u * v, svv += v * v, sux += u * x[i], svx += v * x[i];
    }
    double d = 0, dmin = 0;
    const double det = suu * svv - suv * suv;
    if (det > 0) {
      d = (sux * svv - svx * suv) / det;
      dmin = -(suu * svx - suv * sux) / det;
    }
    if (det <= 0 || dmin < 0) {  // no offset: fit through the origin
      d = suu > 0 ? sux / suu : 0;
      dmin = 0;
    }
    if (!(d >= 0)) break;
    c.d = float_to_f16(static_cast<float>(d));
    c.dmin = float_to_f16(static_cast<float>(dmin));
    choose_codes(x, a, b, c);
    if (c.error < best.error) best = c;
  }
  out.d = best.d;
  out.dmin = best.dmin;
  pack_scales(best.sc, best.m, out.scales);
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l)
      out.qs[32 * p + l] = static_cast<uint8_t>(best.q[64 * p + l] | (best.q[64 * p + 32 + l] << 4));
}

}  // namespace

void quantize_row_q4_k(const float* x, int64_t n, BlockQ4_K* out) {
  for (int64_t b = 0; b < n / kQ4KBlock; ++b) quantize_block(x + b * kQ4KBlock, out[b]);
}

void dequantize_row_q4_k(const BlockQ4_K* blocks, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQ4KBlock; ++b) {
    const BlockQ4_K& blk = blocks[b];
    const float d = f16_to_float(blk.d), dmin = f16_to_float(blk.dmin);
    for (int s = 0; s < kSubs; ++s) {
      int sc, m;
      q4_k_scale_min(blk, s, &sc, &m);
      const float scale = d * static_cast<float>(sc), offset = dmin * static_cast<float>(m);
      const uint8_t* q = blk.qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      for (int l = 0; l < 32; ++l) *y++ = value(scale, offset, (q[l] >> shift) & 0x0f);
    }
  }
}

namespace {
// The block's 256 quants in weight order, from ggml's order or the kernels'.
void quants(const BlockQ4_K& b, bool interleaved, uint8_t* q) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const uint8_t byte = b.qs[32 * c + l];
      // ggml: byte 32c + l holds weights 64c + l (low) and 64c + 32 + l (high); the kernels'
      // order: byte 32c + 4s + u holds weights 32s + 8c + u (low) and 32s + 8c + 4 + u (high).
      const int lo = interleaved ? 32 * (l / 4) + 8 * c + l % 4 : 64 * c + l;
      const int hi = interleaved ? lo + 4 : lo + 32;
      q[lo] = byte & 0x0f;
      q[hi] = byte >> 4;
    }
}

void set_quants(BlockQ4_K& b, bool interleaved, const uint8_t* q) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const int lo = interleaved ? 32 * (l / 4) + 8 * c + l % 4 : 64 * c + l;
      const int hi = interleaved ? lo + 4 : lo + 32;
      b.qs[32 * c + l] = static_cast<uint8_t>(q[lo] | (q[hi] << 4));
    }
}

// One block in ggml's order, from the kernels' order.
BlockQ4_K ggml_order(const BlockQ4_K& b) {
  BlockQ4_K out = b;
  deinterleave_q4_k(&out, 1);
  return out;
}
}  // namespace

void interleave_q4_k(BlockQ4_K* blocks, int64_t count) {
  uint8_t q[kQ4KBlock];
  for (int64_t i = 0; i < count; ++i) {
    quants(blocks[i], false, q);
    set_quants(blocks[i], true, q);
  }
}

void deinterleave_q4_k(BlockQ4_K* blocks, int64_t count) {
  uint8_t q[kQ4KBlock];
  for (int64_t i = 0; i < count; ++i) {
    quants(blocks[i], true, q);
    set_quants(blocks[i], false, q);
  }
}

// dequantize_row_q4_k's arithmetic on blocks in the kernels' order: the quants unpacked to one
// byte each in weight order (a 32-bit word of 4 bytes at a time: weights 32s + 8c + u and
// 32s + 8c + 4 + u are the low and high nibbles of bytes 32c + 4s + u), then each sub-block's
// 32 values from contiguous bytes, as dequantize_row_q4_k computes them.
void dequantize_row_q4_k_interleaved(const BlockQ4_K* blocks, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQ4KBlock; ++b) {
    const BlockQ4_K& blk = blocks[b];
    uint8_t q[kQ4KBlock];
    for (int c = 0; c < 4; ++c)
      for (int s = 0; s < kSubs; ++s) {
        uint32_t w, lo, hi;
        std::memcpy(&w, blk.qs + 32 * c + 4 * s, sizeof(w));
        lo = w & 0x0f0f0f0fu;
        hi = (w >> 4) & 0x0f0f0f0fu;
        std::memcpy(q + 32 * s + 8 * c, &lo, sizeof(lo));
        std::memcpy(q + 32 * s + 8 * c + 4, &hi, sizeof(hi));
      }
    const float d = f16_to_float(blk.d), dmin = f16_to_float(blk.dmin);
    for (int s = 0; s < kSubs; ++s) {
      int sc, m;
      q4_k_scale_min(blk, s, &sc, &m);
      const float scale = d * static_cast<float>(sc), offset = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = value(scale, offset, q[32 * s + l]);
    }
  }
}

void matmul_bt_q4_k_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ4_K* B,
                        int64_t ldb, float* C, int64_t ldc) {
  const int64_t nb = K / kQ8Block;
  std::vector<int8_t> qa(static_cast<size_t>(M * K));
  std::vector<float> da(static_cast<size_t>(M * nb));
  for (int64_t i = 0; i < M; ++i) quantize_activations_q8(A + i * lda, K, qa.data() + i * K, da.data() + i * nb);
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < N; ++j)
    for (int64_t i = 0; i < M; ++i) {
      double acc = 0;
      for (int64_t b = 0; b < K / kQ4KBlock; ++b) {
        const BlockQ4_K blk = ggml_order(B[j * ldb + b]);
        const float d = f16_to_float(blk.d), dmin = f16_to_float(blk.dmin);
        for (int s = 0; s < kSubs; ++s) {
          int sc, m;
          q4_k_scale_min(blk, s, &sc, &m);
          const float scale = d * static_cast<float>(sc), offset = dmin * static_cast<float>(m);
          const int8_t* x = qa.data() + i * K + b * kQ4KBlock + s * kQ4KSub;
          const uint8_t* q = blk.qs + 32 * (s / 2);
          int64_t dot = 0, sum = 0;
          for (int l = 0; l < kQ4KSub; ++l) {
            dot += int64_t{x[l]} * ((q[l] >> (4 * (s % 2))) & 0x0f);
            sum += x[l];
          }
          acc += double{da[static_cast<size_t>(i * nb + b * kSubs + s)]} *
                 (double{scale} * static_cast<double>(dot) - double{offset} * static_cast<double>(sum));
        }
      }
      C[i * ldc + j] = static_cast<float>(acc);
    }
}

void gemm_bt_q4_k_ref(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const BlockQ4_K* B, int64_t ldb,
                      float* C, int64_t ldc) {
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < N; ++j) {
    std::vector<float> b(static_cast<size_t>(K));
    dequantize_row_q4_k_interleaved(B + j * ldb, K, b.data());
    for (int64_t i = 0; i < M; ++i) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += double{A[i * lda + k]} * b[static_cast<size_t>(k)];
      C[i * ldc + j] = static_cast<float>(acc);
    }
  }
}

}  // namespace mhsa::kernels
