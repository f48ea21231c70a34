// mhsa/kv_cache.h — keys and values of past tokens, for incremental decoding and for an encoder
// memory projected once.
//
// Storage is [B, Hkv, capacity, D]: keys() and values() are strided views of the first length()
// tokens, handed to attention without a copy. Not a paged or shared cache: one per sequence batch.
#pragma once

#include <cstdint>

#include "mhsa/tensor.h"

namespace mhsa {

class KVCache {
 public:
  KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim, int64_t v_head_dim);

  int64_t batch() const { return batch_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t capacity() const { return capacity_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t v_head_dim() const { return v_head_dim_; }
  int64_t length() const { return length_; }

  // Appends T tokens: k [B, Hkv, T, D], v [B, Hkv, T, Dv], any strides. Throws mhsa::Error, and
  // changes nothing, if the shapes disagree with the cache or length() + T > capacity().
  void append(ConstTensorView k, ConstTensorView v);
  // Throws, naming `what`, unless T more tokens fit.
  void check_room(int64_t tokens, const char* what) const;
  void reset() { length_ = 0; }
  // Forgets every token after the first `length` (0 ≤ length ≤ length()): the cache then holds
  // what it held when it was that long, and the next append() writes at position `length`.
  // Throws mhsa::Error, and changes nothing, for a length outside that range.
  void truncate(int64_t length);

  ConstTensorView keys() const;    // [B, Hkv, length, D]
  ConstTensorView values() const;  // [B, Hkv, length, Dv]

 private:
  int64_t batch_, kv_heads_, capacity_, head_dim_, v_head_dim_;
  int64_t length_ = 0;
  Tensor k_;  // [B, Hkv, capacity, D]
  Tensor v_;  // [B, Hkv, capacity, Dv]
};

}  // namespace mhsa
