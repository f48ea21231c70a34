// mhsa/kv_cache.h — keys and values of past tokens, for incremental decoding and for an encoder
// memory projected once.
//
// Storage is [B, Hkv, capacity, D]: keys() and values() are strided views of the first length()
// tokens, handed to attention without a copy. The elements are float32, or 16-bit (KVType): half
// the memory, each key and value rounded once (to nearest even) as it is appended, and widened
// exactly by the attention kernels as they read it. Not a paged or shared cache: one per sequence
// batch.
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "mhsa/tensor.h"

namespace mhsa {

// The element type of a KV cache's keys and values (KVCache, KVBlockPool): float32, bfloat16 or
// float16. The 16-bit ones take half the memory and half the bytes a decode step reads from the
// cache; attention computes in float32 on the exactly widened keys and values.
enum class KVType { f32, bf16, f16 };
// "f32", "bf16" or "f16"; anything else throws mhsa::Error "<what>: expected "f32", "bf16" or
// "f16", got '…'" (what: the option, "--kv-dtype").
KVType parse_kv_type(std::string_view name, std::string_view what);
std::string_view kv_type_name(KVType type);
// Bytes per element: 4 or 2.
inline int64_t kv_type_bytes(KVType type) { return type == KVType::f32 ? 4 : 2; }
// The KVType of element type T (float, bfloat16 or float16).
template <class T>
constexpr KVType kv_type_of() {
  if constexpr (std::is_same_v<T, bfloat16>) return KVType::bf16;
  if constexpr (std::is_same_v<T, float16>) return KVType::f16;
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>);
  return KVType::f32;
}

class KVCache {
 public:
  KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim, int64_t v_head_dim,
          KVType type = KVType::f32);

  int64_t batch() const { return batch_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t capacity() const { return capacity_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t v_head_dim() const { return v_head_dim_; }
  int64_t length() const { return length_; }
  KVType type() const { return type_; }

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
  // for a 16-bit cache (see keys_as).
  ConstTensorView keys() const;
  ConstTensorView values() const;
  // The same views of elements T (float, bfloat16 or float16), which must be the cache's type
  // (else mhsa::Error).
  template <class T>
  View<const T> keys_as() const {
    check_type(kv_type_of<T>(), "KVCache::keys_as");
    return {static_cast<const T*>(k_data()), {batch_, kv_heads_, length_, head_dim_},
            {kv_heads_ * capacity_ * head_dim_, capacity_ * head_dim_, head_dim_, 1}};
  }
  template <class T>
  View<const T> values_as() const {
    check_type(kv_type_of<T>(), "KVCache::values_as");
    return {static_cast<const T*>(v_data()), {batch_, kv_heads_, length_, v_head_dim_},
            {kv_heads_ * capacity_ * v_head_dim_, capacity_ * v_head_dim_, v_head_dim_, 1}};
  }

 private:
  void check_type(KVType want, std::string_view fn) const;
  const void* k_data() const { return k_.data(); }
  const void* v_data() const { return v_.data(); }

  int64_t batch_, kv_heads_, capacity_, head_dim_, v_head_dim_;
  int64_t length_ = 0;
  KVType type_ = KVType::f32;
  // [B, Hkv, capacity, D] and [B, Hkv, capacity, Dv] elements of type_, in float32 tensors' memory
  // (a 16-bit cache's tensors hold two elements per float).
  Tensor k_;
  Tensor v_;
};

}  // namespace mhsa
