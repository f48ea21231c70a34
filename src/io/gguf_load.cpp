// io/gguf_load.cpp — a GGUF tensor as float32 (see io/gguf.h): F32 copied, F16 and BF16 widened
// exactly, and the block formats dequantised as ggml defines them (plain reference code, one
// block at a time; the bytes are read with memcpy, so any alignment is safe). Not a kernel: the
// model keeps what this returns.
#include <cstring>

#include "core/check.h"
#include "io/gguf.h"
#include "io/json.h"
#include "kernels/half.h"

namespace mhsa::detail {
namespace {

uint16_t u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
float half(const uint8_t* p) { return kernels::f16_to_float(u16(p)); }

// Q8_0: 32 values per 34-byte block: f16 scale d, int8 q[32]; x = d · q.
void dequantize_q8_0(const uint8_t* b, int64_t blocks, float* y) {
  for (int64_t i = 0; i < blocks; ++i, b += 34, y += 32) {
    const float d = half(b);
    for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(static_cast<int8_t>(b[2 + j]));
  }
}

// Q4_0: 32 values per 18-byte block: f16 scale d, 16 bytes of 4-bit quants; value j < 16 is the
// low nibble of byte j, value j + 16 its high nibble; x = d · (q − 8).
void dequantize_q4_0(const uint8_t* b, int64_t blocks, float* y) {
  for (int64_t i = 0; i < blocks; ++i, b += 18, y += 32) {
    const float d = half(b);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>((b[2 + j] & 0x0f) - 8);
      y[j + 16] = d * static_cast<float>((b[2 + j] >> 4) - 8);
    }
  }
}

// Q4_K: 256 values per 144-byte super-block: f16 d, f16 dmin, 12 bytes holding eight 6-bit
// scales and eight 6-bit mins, 128 bytes of 4-bit quants. Sub-block s (32 values) has scale
// d · sc[s] and offset dmin · m[s]; x = d·sc·q − dmin·m. Each 32 bytes of quants hold two
// sub-blocks: the low nibbles the first, the high nibbles the second.
void scale_min_k4(int s, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (s < 4) {
    *sc = q[s] & 63;
    *m = q[s + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[s + 4] & 0x0f) | ((q[s - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[s + 4] >> 4) | ((q[s] >> 6) << 4));
  }
}

void dequantize_q4_k(const uint8_t* b, int64_t blocks, float* y) {
  for (int64_t i = 0; i < blocks; ++i, b += 144) {
    const float d = half(b), dmin = half(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* q = b + 16;
    for (int s = 0; s < 8; s += 2, q += 32) {
      uint8_t sc0, m0, sc1, m1;
      scale_min_k4(s, scales, &sc0, &m0);
      scale_min_k4(s + 1, scales, &sc1, &m1);
      const float d0 = d * sc0, o0 = dmin * m0, d1 = d * sc1, o1 = dmin * m1;
      for (int l = 0; l < 32; ++l) *y++ = d0 * static_cast<float>(q[l] & 0x0f) - o0;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] >> 4) - o1;
    }
  }
}

// Q4_1: 32 values per 20-byte block: f16 scale d, f16 minimum m, 16 bytes of nibbles (as Q4_0);
// x = d · q + m.
void dequantize_q4_1(const uint8_t* b, int64_t blocks, float* y) {
  for (int64_t i = 0; i < blocks; ++i, b += 20, y += 32) {
    const float d = half(b), m = half(b + 2);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(b[4 + j] & 0x0f) + m;
      y[j + 16] = d * static_cast<float>(b[4 + j] >> 4) + m;
    }
  }
}

// Q5_0 / Q5_1: Q4_0 / Q4_1 with a fifth bit per value: 32 bits qh (little-endian) after the
// scale(s), bit j the high bit of value j. Q5_0: 22 bytes, x = d · (q − 16); Q5_1: 24 bytes,
// x = d · q + m.
void dequantize_q5(const uint8_t* b, int64_t blocks, float* y, bool with_min) {
  const int head = with_min ? 4 : 2, size = head + 20;
  for (int64_t i = 0; i < blocks; ++i, b += size, y += 32) {
    const float d = half(b), m = with_min ? half(b + 2) : 0.0f;
    uint32_t qh;
    std::memcpy(&qh, b + head, 4);
    const uint8_t* qs = b + head + 4;
    const int offset = with_min ? 0 : 16;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      y[j] = d * static_cast<float>(lo - offset) + m;
      y[j + 16] = d * static_cast<float>(hi - offset) + m;
    }
  }
}

// Q5_K: Q4_K with a fifth bit per value: f16 d, f16 dmin, the same 12 bytes of 6-bit scales and
// mins, 32 bytes qh, 128 bytes of nibbles (176 bytes per 256 values). Sub-blocks 2p and 2p + 1
// take the low and high nibbles of quant bytes 32p … 32p + 31 and bits 2p and 2p + 1 of qh[l].
void dequantize_q5_k(const uint8_t* b, int64_t blocks, float* y) {
  for (int64_t i = 0; i < blocks; ++i, b += 176) {
    const float d = half(b), dmin = half(b + 2);
    const uint8_t* scales = b + 4;
    const uint8_t* qh = b + 16;
    const uint8_t* q = b + 48;
    for (int s = 0; s < 8; s += 2, q += 32) {
      uint8_t sc0, m0, sc1, m1;
      scale_min_k4(s, scales, &sc0, &m0);
      scale_min_k4(s + 1, scales, &sc1, &m1);
      const float d0 = d * sc0, o0 = dmin * m0, d1 = d * sc1, o1 = dmin * m1;
      for (int l = 0; l < 32; ++l) *y++ = d0 * static_cast<float>((q[l] & 0x0f) | (((qh[l] >> s) & 1) << 4)) - o0;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((q[l] >> 4) | (((qh[l] >> (s + 1)) & 1) << 4)) - o1;
    }
  }
}

// Q6_K: 256 values per 210-byte super-block: 128 bytes of low nibbles ql, 64 bytes of 2-bit
// high parts qh, sixteen int8 scales (one per 16 values), f16 d; x = d · scale · (q − 32). Each
// half of 128 values takes 64 bytes of ql and 32 of qh: value l + 32k (l < 32, k < 4) has the
// low nibble (k ≥ 2: high nibble) of ql[l + 32·(k & 1)] and bits 2k, 2k + 1 of qh[l].
void dequantize_q6_k(const uint8_t* b, int64_t blocks, float* y) {
  for (int64_t i = 0; i < blocks; ++i, b += 210) {
    const float d = half(b + 208);
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, y += 128)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 32; ++l) {
          const int low = (k & 2) ? ql[l + 32 * (k & 1)] >> 4 : ql[l + 32 * (k & 1)] & 0x0f;
          const int q = (low | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
          y[32 * k + l] = d * static_cast<float>(sc[l / 16 + 2 * k]) * static_cast<float>(q);
        }
  }
}

}  // namespace

Tensor GgufFile::load(const GgufTensorInfo& t) const {
  const std::string fn = "gguf " + source_;
  Tensor out(t.shape(), fn + ": tensor " + quote(t.name));
  const uint8_t* b = data(t).data();
  float* y = out.data();
  const int64_t n = out.numel();
  switch (static_cast<GgufType>(t.type)) {
    case GgufType::f32:
      if (n) std::memcpy(y, b, static_cast<size_t>(n) * 4);
      break;
    case GgufType::f16:
      for (int64_t i = 0; i < n; ++i) y[i] = half(b + 2 * i);
      break;
    case GgufType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = uint32_t{u16(b + 2 * i)} << 16;
        std::memcpy(y + i, &bits, 4);
      }
      break;
    case GgufType::q8_0: dequantize_q8_0(b, n / 32, y); break;
    case GgufType::q4_0: dequantize_q4_0(b, n / 32, y); break;
    case GgufType::q4_1: dequantize_q4_1(b, n / 32, y); break;
    case GgufType::q5_0: dequantize_q5(b, n / 32, y, false); break;
    case GgufType::q5_1: dequantize_q5(b, n / 32, y, true); break;
    case GgufType::q4_k: dequantize_q4_k(b, n / 256, y); break;
    case GgufType::q5_k: dequantize_q5_k(b, n / 256, y); break;
    case GgufType::q6_k: dequantize_q6_k(b, n / 256, y); break;
    default:
      fail(fn, "tensor " + quote(t.name) + " type",
           "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K (the types mhsa loads)",
           gguf_type_name(t.type));
  }
  return out;
}

}  // namespace mhsa::detail
