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
    case GgufType::q4_k: dequantize_q4_k(b, n / 256, y); break;
    default:
      fail(fn, "tensor " + quote(t.name) + " type", "F32, F16, BF16, Q8_0, Q4_0 or Q4_K (the types mhsa loads)",
           gguf_type_name(t.type));
  }
  return out;
}

}  // namespace mhsa::detail
