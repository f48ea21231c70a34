// nn/kv_cache.cpp — KVCache (see kv_cache.h).
#include "mhsa/kv_cache.h"

#include "core/check.h"

namespace mhsa {
namespace {

// dst[b, h, offset + t, d] = src[b, h, t, d]
void copy_tokens(const ConstTensorView& src, Tensor& dst, int64_t offset) {
  const int64_t H = dst.dim(1), cap = dst.dim(2), D = dst.dim(3);
  for (int64_t b = 0; b < src.shape[0]; ++b)
    for (int64_t h = 0; h < src.shape[1]; ++h)
      for (int64_t t = 0; t < src.shape[2]; ++t) {
        float* row = dst.data() + ((b * H + h) * cap + offset + t) * D;
        for (int64_t d = 0; d < D; ++d) row[d] = src.at(b, h, t, d);
      }
}

}  // namespace

KVCache::KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim, int64_t v_head_dim)
    : batch_(batch), kv_heads_(kv_heads), capacity_(capacity), head_dim_(head_dim), v_head_dim_(v_head_dim) {
  constexpr std::string_view fn = "KVCache";
  if (batch < 0) detail::fail(fn, "batch", "a count >= 0", std::to_string(batch));
  if (kv_heads <= 0) detail::fail(fn, "kv_heads", "a count > 0", std::to_string(kv_heads));
  if (capacity < 0) detail::fail(fn, "capacity", "a count >= 0", std::to_string(capacity));
  if (head_dim <= 0) detail::fail(fn, "head_dim", "a count > 0", std::to_string(head_dim));
  if (v_head_dim <= 0) detail::fail(fn, "v_head_dim", "a count > 0", std::to_string(v_head_dim));
  k_ = Tensor({batch, kv_heads, capacity, head_dim}, "KVCache: keys [B, Hkv, capacity, D]");
  v_ = Tensor({batch, kv_heads, capacity, v_head_dim}, "KVCache: values [B, Hkv, capacity, Dv]");
}

void KVCache::check_room(int64_t tokens, const char* what) const {
  if (tokens > capacity_ - length_)  // not length_ + tokens: that could overflow
    detail::fail("KVCache", what,
                 detail::message("at most ", capacity_ - length_, " new tokens (capacity ", capacity_,
                                 ", holding ", length_, ")"),
                 detail::message(tokens, " new tokens"));
}

void KVCache::append(ConstTensorView k, ConstTensorView v) {
  constexpr std::string_view fn = "KVCache::append";
  detail::check_tensor(fn, "k", k, 4, "[B, Hkv, T, D]");
  detail::check_tensor(fn, "v", v, 4, "[B, Hkv, T, Dv]");
  detail::check_dim(fn, "k", k, 0, batch_, "the cache's batch");
  detail::check_dim(fn, "k", k, 1, kv_heads_, "the cache's kv heads");
  detail::check_dim(fn, "k", k, 3, head_dim_, "the cache's head size");
  detail::check_dim(fn, "v", v, 0, batch_, "the cache's batch");
  detail::check_dim(fn, "v", v, 1, kv_heads_, "the cache's kv heads");
  detail::check_dim(fn, "v", v, 2, k.shape[2], "T, as k.shape[2]");
  detail::check_dim(fn, "v", v, 3, v_head_dim_, "the cache's value head size");
  check_room(k.shape[2], "k.shape[2]");
  copy_tokens(k, k_, length_);
  copy_tokens(v, v_, length_);
  length_ += k.shape[2];
}

void KVCache::truncate(int64_t length) {
  if (length < 0 || length > length_)
    detail::fail("KVCache::truncate", "length", detail::message("a length in [0, ", length_, "] (the tokens held)"),
                 std::to_string(length));
  length_ = length;
}

ConstTensorView KVCache::keys() const {
  return {k_.data(), {batch_, kv_heads_, length_, head_dim_},
          {kv_heads_ * capacity_ * head_dim_, capacity_ * head_dim_, head_dim_, 1}};
}

ConstTensorView KVCache::values() const {
  return {v_.data(), {batch_, kv_heads_, length_, v_head_dim_},
          {kv_heads_ * capacity_ * v_head_dim_, capacity_ * v_head_dim_, v_head_dim_, 1}};
}

}  // namespace mhsa
