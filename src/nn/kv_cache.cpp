// nn/kv_cache.cpp — KVCache (see kv_cache.h) and the KVType names.
#include "mhsa/kv_cache.h"

#include "core/check.h"
#include "io/json.h"
#include "nn/kv_store.h"

namespace mhsa {
namespace {

// dst[b, h, offset + t, d] = src[b, h, t, d] rounded to T; dst: [B, H, cap, D] elements T.
template <class T>
void copy_tokens(const ConstTensorView& src, void* dst_data, int64_t H, int64_t cap, int64_t D, int64_t offset) {
  T* dst = static_cast<T*>(dst_data);
  for (int64_t b = 0; b < src.shape[0]; ++b)
    for (int64_t h = 0; h < src.shape[1]; ++h)
      for (int64_t t = 0; t < src.shape[2]; ++t) {
        T* row = dst + ((b * H + h) * cap + offset + t) * D;
        for (int64_t d = 0; d < D; ++d) nn::narrow_kv(src.at(b, h, t, d), row[d]);
      }
}

// Storage for n elements of `type` (two 16-bit ones per float).
Tensor storage(KVType type, int64_t n, std::string_view what) {
  return Tensor({type == KVType::f32 ? n : n / 2 + n % 2}, what);
}

}  // namespace

KVType parse_kv_type(std::string_view name, std::string_view what) {
  if (name == "f32") return KVType::f32;
  if (name == "bf16") return KVType::bf16;
  if (name == "f16") return KVType::f16;
  throw Error(detail::message(what, ": expected \"f32\", \"bf16\" or \"f16\", got ", detail::quote(name)));
}

std::string_view kv_type_name(KVType type) {
  switch (type) {
    case KVType::bf16: return "bf16";
    case KVType::f16: return "f16";
    case KVType::f32: break;
  }
  return "f32";
}

KVCache::KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim, int64_t v_head_dim, KVType type)
    : batch_(batch), kv_heads_(kv_heads), capacity_(capacity), head_dim_(head_dim), v_head_dim_(v_head_dim),
      type_(type) {
  constexpr std::string_view fn = "KVCache";
  if (batch < 0) detail::fail(fn, "batch", "a count >= 0", std::to_string(batch));
  if (kv_heads <= 0) detail::fail(fn, "kv_heads", "a count > 0", std::to_string(kv_heads));
  if (capacity < 0) detail::fail(fn, "capacity", "a count >= 0", std::to_string(capacity));
  if (head_dim <= 0) detail::fail(fn, "head_dim", "a count > 0", std::to_string(head_dim));
  if (v_head_dim <= 0) detail::fail(fn, "v_head_dim", "a count > 0", std::to_string(v_head_dim));
  if (type != KVType::f32 && type != KVType::bf16 && type != KVType::f16)
    detail::fail(fn, "type", "KVType f32, bf16 or f16", std::to_string(static_cast<int>(type)));
  const int64_t nk = detail::checked_count("KVCache: keys [B, Hkv, capacity, D]", {batch, kv_heads, capacity, head_dim},
                                           sizeof(float));
  const int64_t nv = detail::checked_count("KVCache: values [B, Hkv, capacity, Dv]",
                                           {batch, kv_heads, capacity, v_head_dim}, sizeof(float));
  k_ = storage(type, nk, "KVCache: keys [B, Hkv, capacity, D]");
  v_ = storage(type, nv, "KVCache: values [B, Hkv, capacity, Dv]");
}

void KVCache::check_room(int64_t tokens, const char* what) const {
  if (tokens > capacity_ - length_)  // not length_ + tokens: that could overflow
    detail::fail("KVCache", what,
                 detail::message("at most ", capacity_ - length_, " new tokens (capacity ", capacity_,
                                 ", holding ", length_, ")"),
                 detail::message(tokens, " new tokens"));
}

void KVCache::check_type(KVType want, std::string_view fn) const {
  if (type_ != want)
    detail::fail(fn, "T", detail::message("the cache's element type (", kv_type_name(type_), ")"),
                 std::string(kv_type_name(want)));
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
  nn::with_kv_type(type_, [&](auto element) {
    using T = decltype(element);
    copy_tokens<T>(k, k_.data(), kv_heads_, capacity_, head_dim_, length_);
    copy_tokens<T>(v, v_.data(), kv_heads_, capacity_, v_head_dim_, length_);
  });
  length_ += k.shape[2];
}

void KVCache::append(const KVCache& from) {
  constexpr std::string_view fn = "KVCache::append";
  if (from.batch_ != batch_ || from.kv_heads_ != kv_heads_ || from.head_dim_ != head_dim_ ||
      from.v_head_dim_ != v_head_dim_)
    detail::fail(fn, "from",
                 detail::message("a cache of batch ", batch_, ", ", kv_heads_, " kv heads, head sizes ", head_dim_,
                                 " and ", v_head_dim_),
                 detail::message("batch ", from.batch_, ", ", from.kv_heads_, " kv heads, head sizes ",
                                 from.head_dim_, " and ", from.v_head_dim_));
  check_room(from.length_, "from.length()");
  // Each element widened exactly and rounded back: unchanged when the types agree.
  const auto copy = [&](const void* src_data, void* dst_data, int64_t D) {
    nn::with_kv_type(from.type_, [&](auto src_element) {
      nn::with_kv_type(type_, [&](auto dst_element) {
        const auto* src = static_cast<const decltype(src_element)*>(src_data);
        auto* dst = static_cast<decltype(dst_element)*>(dst_data);
        for (int64_t bh = 0; bh < batch_ * kv_heads_; ++bh)
          for (int64_t t = 0; t < from.length_; ++t)
            for (int64_t d = 0; d < D; ++d)
              nn::narrow_kv(nn::widen_kv(src[(bh * from.capacity_ + t) * D + d]),
                            dst[(bh * capacity_ + length_ + t) * D + d]);
      });
    });
  };
  copy(from.k_data(), k_.data(), head_dim_);
  copy(from.v_data(), v_.data(), v_head_dim_);
  length_ += from.length_;
}

void KVCache::truncate(int64_t length) {
  if (length < 0 || length > length_)
    detail::fail("KVCache::truncate", "length", detail::message("a length in [0, ", length_, "] (the tokens held)"),
                 std::to_string(length));
  length_ = length;
}

ConstTensorView KVCache::keys() const { return keys_as<float>(); }
ConstTensorView KVCache::values() const { return values_as<float>(); }

}  // namespace mhsa
