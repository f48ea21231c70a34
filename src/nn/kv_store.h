// nn/kv_store.h — keys and values in a KV cache's element type (KVType: float32, bfloat16,
// float16): the one place where a cache rounds a float32 key or value (to nearest even, NaN kept)
// and widens one back (exactly), and the dispatch from a KVType to its element type. Used by
// KVCache and the paged pool's writes (nn/block.cpp). Not public.
#pragma once

#include <cstdint>

#include "kernels/bf16.h"
#include "kernels/half.h"
#include "mhsa/kv_cache.h"

namespace mhsa::nn {

inline void narrow_kv(float x, float& y) { y = x; }
inline void narrow_kv(float x, bfloat16& y) { y.bits = kernels::float_to_bf16(x); }
inline void narrow_kv(float x, float16& y) { y.bits = kernels::float_to_f16(x); }
inline float widen_kv(float x) { return x; }
inline float widen_kv(bfloat16 x) { return kernels::bf16_to_float(x.bits); }
inline float widen_kv(float16 x) { return kernels::f16_to_float(x.bits); }

// f(T{}) with T the element type of `type`.
template <class F>
decltype(auto) with_kv_type(KVType type, F&& f) {
  switch (type) {
    case KVType::bf16: return f(bfloat16{});
    case KVType::f16: return f(float16{});
    case KVType::f32: break;
  }
  return f(0.0f);
}

// dst[i] = src[i] rounded, i < n; dst: elements of `type`.
inline void store_kv(KVType type, const float* src, int64_t n, void* dst) {
  with_kv_type(type, [&](auto element) {
    auto* out = static_cast<decltype(element)*>(dst);
    for (int64_t i = 0; i < n; ++i) narrow_kv(src[i], out[i]);
  });
}

}  // namespace mhsa::nn
