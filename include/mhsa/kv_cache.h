// mhsa/kv_cache.h — keys and values of past tokens, for incremental decoding and for an encoder
// memory projected once.
//
// Storage is [B, Hkv, capacity, D]: keys() and values() are strided views of the first length()
// tokens, handed to attention without a copy. The elements are float32, 16-bit or 8-bit (KVType,
// keys and values each their own): each key and value rounded once as it is appended, and read
// back exactly (widened, or dequantised) by the attention kernels as they read it. Not a paged or
// shared cache: one per sequence batch.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "mhsa/tensor.h"

namespace mhsa {

// The element type of a KV cache's keys or values (KVCache, KVBlockPool): float32, bfloat16,
// float16, or q8_0 — GGUF's Q8_0 blocks along the head dimension (32 int8 and one float16 scale,
// 34 bytes per 32 values, as llama.cpp's `-ctk q8_0`; the head size must be a multiple of 32).
// The 16-bit types take half the memory and half the bytes a decode step reads from the cache,
// q8_0 about 27%; attention computes in float32 on the exactly widened (dequantised) elements.
enum class KVType { f32, bf16, f16, q8_0 };
// "f32", "bf16", "f16" or "q8_0"; anything else throws mhsa::Error "<what>: expected "f32",
// "bf16", "f16" or "q8_0", got '…'" (what: the option, "--kv-dtype").
KVType parse_kv_type(std::string_view name, std::string_view what);
std::string_view kv_type_name(KVType type);
// Bytes of one row of `dim` elements: 4·dim, 2·dim, or 34·dim/32 for q8_0 (dim a multiple of 32:
// see check_kv_dim).
inline int64_t kv_row_bytes(KVType type, int64_t dim) {
  switch (type) {
    case KVType::f32: return 4 * dim;
    case KVType::q8_0: return dim / 32 * 34;
    case KVType::bf16:
    case KVType::f16: break;
  }
  return 2 * dim;
}
// Throws mhsa::Error "<fn>: <arg>: expected a multiple of 32 (q8_0 blocks of 32 values), got …"
// when `type` is q8_0 and dim (a head size) is not a multiple of 32.
void check_kv_dim(KVType type, int64_t dim, std::string_view fn, std::string_view arg);

// The element types of a cache's keys and of its values (llama.cpp's -ctk / -ctv): one type for
// both converts implicitly, so `KVType::f16` is {f16, f16}.
struct KVTypes {
  KVType key = KVType::f32, value = KVType::f32;
  constexpr KVTypes() = default;
  constexpr KVTypes(KVType both) : key(both), value(both) {}  // NOLINT: one type for both, implicitly
  constexpr KVTypes(KVType key_type, KVType value_type) : key(key_type), value(value_type) {}
  constexpr bool operator==(const KVTypes&) const = default;
};
// "q8_0" when the types agree, else "<key>/<value>" ("q8_0/f16"): the form parse_kv_types reads.
std::string kv_type_name(KVTypes types);
// A type for both ("q8_0") or "<key>/<value>" ("q8_0/f16"); throws as parse_kv_type does.
KVTypes parse_kv_types(std::string_view name, std::string_view what);

// The KVType of element type T (float, bfloat16, float16 or BlockQ8_0).
template <class T>
constexpr KVType kv_type_of() {
  if constexpr (std::is_same_v<T, bfloat16>) return KVType::bf16;
  if constexpr (std::is_same_v<T, float16>) return KVType::f16;
  if constexpr (std::is_same_v<T, BlockQ8_0>) return KVType::q8_0;
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float16> ||
                std::is_same_v<T, BlockQ8_0>);
  return KVType::f32;
}

class KVCache {
 public:
  // types: the keys' and the values' element types (one KVType for both); a q8_0 head size not
  // a multiple of 32 throws mhsa::Error naming head_dim or v_head_dim.
  KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim, int64_t v_head_dim,
          KVTypes types = {});

  int64_t batch() const { return batch_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t capacity() const { return capacity_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t v_head_dim() const { return v_head_dim_; }
  int64_t length() const { return length_; }
  KVTypes type() const { return type_; }

  // Appends T tokens: k [B, Hkv, T, D], v [B, Hkv, T, Dv], any strides (rounded to the cache's
  // type). Throws mhsa::Error, and changes nothing, if the shapes disagree with the cache or
  // length() + T > capacity().
  void append(ConstTensorView k, ConstTensorView v);
  // Appends every token `from` holds (same batch, heads and head sizes; any type, converted as
  // append converts: a copy when the types agree). Throws as append does.
  void append(const KVCache& from);
  // Throws, naming `what`, unless T more tokens fit.
  void check_room(int64_t tokens, const char* what) const;
  void reset() { length_ = 0; }
  // Forgets every token after the first `length` (0 ≤ length ≤ length()): the cache then holds
  // what it held when it was that long, and the next append() writes at position `length`.
  // Throws mhsa::Error, and changes nothing, for a length outside that range.
  void truncate(int64_t length);

  // A float32 cache's keys [B, Hkv, length, D] and values [B, Hkv, length, Dv]; throw mhsa::Error
  // for another type (see keys_as).
  ConstTensorView keys() const;
  ConstTensorView values() const;
  // The same views of elements T (float, bfloat16, float16 or BlockQ8_0), which must be the
  // keys' (values') type (else mhsa::Error). A q8_0 view counts blocks: [B, Hkv, length, D / 32].
  template <class T>
  View<const T> keys_as() const {
    check_type(type_.key, kv_type_of<T>(), "KVCache::keys_as");
    const int64_t n = elements_of<T>(head_dim_);
    return {static_cast<const T*>(k_data()), {batch_, kv_heads_, length_, n},
            {kv_heads_ * capacity_ * n, capacity_ * n, n, 1}};
  }
  template <class T>
  View<const T> values_as() const {
    check_type(type_.value, kv_type_of<T>(), "KVCache::values_as");
    const int64_t n = elements_of<T>(v_head_dim_);
    return {static_cast<const T*>(v_data()), {batch_, kv_heads_, length_, n},
            {kv_heads_ * capacity_ * n, capacity_ * n, n, 1}};
  }

 private:
  template <class T>
  static int64_t elements_of(int64_t dim) {
    return std::is_same_v<T, BlockQ8_0> ? dim / 32 : dim;
  }
  static void check_type(KVType have, KVType want, std::string_view fn);
  const void* k_data() const { return k_.data(); }
  const void* v_data() const { return v_.data(); }

  int64_t batch_, kv_heads_, capacity_, head_dim_, v_head_dim_;
  int64_t length_ = 0;
  KVTypes type_;
  // [B, Hkv, capacity, D] and [B, Hkv, capacity, Dv] elements of type_.key and type_.value, in
  // float32 tensors' memory (rows of kv_row_bytes each, back to back).
  Tensor k_;
  Tensor v_;
};

}  // namespace mhsa
