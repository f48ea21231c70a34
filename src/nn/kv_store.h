// nn/kv_store.h — keys and values in a KV cache's element type (KVType: float32, bfloat16,
// float16, Q8_0 blocks): the one place where a cache rounds a float32 key or value row (to nearest
// even, NaN kept; or quantised per 32-value block) and reads one back (exactly), and the dispatch
// from a KVType to its element type. Used by KVCache and the paged pool's writes (nn/block.cpp).
// Not public.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/bf16.h"
#include "kernels/half.h"
#include "kernels/q8_0.h"
#include "mhsa/kv_cache.h"

namespace mhsa::nn {

inline void narrow_kv(float x, float& y) { y = x; }
inline void narrow_kv(float x, bfloat16& y) { y.bits = kernels::float_to_bf16(x); }
inline void narrow_kv(float x, float16& y) { y.bits = kernels::float_to_f16(x); }
inline float widen_kv(float x) { return x; }
inline float widen_kv(bfloat16 x) { return kernels::bf16_to_float(x.bits); }
inline float widen_kv(float16 x) { return kernels::f16_to_float(x.bits); }

// x [n] (n a multiple of 32) → blocks [n / 32] by ggml's reference rule (kernels/q8_0.h), with
// what ggml leaves undefined fixed as a cache needs it: a block holding a NaN or ±inf gets scale
// NaN and quants 0 (it reads back as NaN, so a non-finite key or value propagates to every score
// or output it enters, as in a float cache); a block whose scale rounds to float16 zero (|x| below
// ~4e-6) reads back as zeros (scale 0, quants 0). A block whose scale overflows float16 (|x| above
// ~8.3e6) reads back as ±inf or NaN, as an f16 cache's element past 65504 does.
inline void quantize_kv_q8_0(const float* x, int64_t n, BlockQ8_0* out) {
  for (int64_t b = 0; b < n / kernels::kQ8Block; ++b) {
    const float* xb = x + b * kernels::kQ8Block;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < kernels::kQ8Block; ++i) {
      finite = finite && std::isfinite(xb[i]);
      amax = std::fmax(amax, std::fabs(xb[i]));
    }
    const uint16_t d = kernels::float_to_f16(amax / 127.0f);
    if (!finite || d == 0) {
      out[b].d = finite ? 0 : uint16_t{0x7E00};  // (f16 quiet NaN)
      std::memset(out[b].qs, 0, sizeof(out[b].qs));
    } else {
      kernels::quantize_row_q8_0(xb, kernels::kQ8Block, out + b);
    }
  }
}
// blocks [n / 32] → y [n]: f16_to_float(d) · q, exact in float32 (an 11-bit scale times an 8-bit
// integer), as the attention kernels compute it.
inline void dequantize_kv_q8_0(const BlockQ8_0* blocks, int64_t n, float* y) {
  kernels::dequantize_row_q8_0(blocks, n, y);
}

// f(T{}) with T the element type of `type`.
template <class F>
decltype(auto) with_kv_type(KVType type, F&& f) {
  switch (type) {
    case KVType::bf16: return f(bfloat16{});
    case KVType::f16: return f(float16{});
    case KVType::q8_0: return f(BlockQ8_0{});
    case KVType::f32: break;
  }
  return f(0.0f);
}

// A row of n values src [n] stored in `type`: dst holds kv_row_bytes(type, n) bytes (q8_0: n a
// multiple of 32).
inline void store_kv(KVType type, const float* src, int64_t n, void* dst) {
  with_kv_type(type, [&](auto element) {
    using T = decltype(element);
    if constexpr (std::is_same_v<T, BlockQ8_0>) {
      quantize_kv_q8_0(src, n, static_cast<BlockQ8_0*>(dst));
    } else {
      auto* out = static_cast<T*>(dst);
      for (int64_t i = 0; i < n; ++i) narrow_kv(src[i], out[i]);
    }
  });
}
// The row back: y [n] = the stored values, exactly (widened or dequantised).
inline void load_kv(KVType type, const void* src, int64_t n, float* y) {
  with_kv_type(type, [&](auto element) {
    using T = decltype(element);
    if constexpr (std::is_same_v<T, BlockQ8_0>) {
      dequantize_kv_q8_0(static_cast<const BlockQ8_0*>(src), n, y);
    } else {
      const auto* in = static_cast<const T*>(src);
      for (int64_t i = 0; i < n; ++i) y[i] = widen_kv(in[i]);
    }
  });
}

}  // namespace mhsa::nn
