// nn/kv_cache.cpp — KVCache (see kv_cache.h) and the KVType names.
#include "mhsa/kv_cache.h"

#include <cstddef>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "io/json.h"
#include "nn/kv_store.h"

namespace mhsa {
namespace {

// dst[b, h, offset + t] = src[b, h, t] in `type`; dst: [B, H, cap] rows of kv_row_bytes(type, D).
void copy_tokens(const ConstTensorView& src, KVType type, void* dst_data, int64_t H, int64_t cap, int64_t D,
                 int64_t offset) {
  const int64_t row_bytes = kv_row_bytes(type, D);
  std::vector<float> row(static_cast<size_t>(D));  // one token's [D], gathered from any strides
  for (int64_t b = 0; b < src.shape[0]; ++b)
    for (int64_t h = 0; h < src.shape[1]; ++h)
      for (int64_t t = 0; t < src.shape[2]; ++t) {
        for (int64_t d = 0; d < D; ++d) row[static_cast<size_t>(d)] = src.at(b, h, t, d);
        nn::store_kv(type, row.data(), D, static_cast<std::byte*>(dst_data) + ((b * H + h) * cap + offset + t) * row_bytes);
      }
}

// Storage for [B, H, cap] rows of `dim` elements of `type`, in whole floats (q8_0: dim / 32
// blocks of 34 bytes).
Tensor storage(KVType type, int64_t B, int64_t H, int64_t cap, int64_t dim, std::string_view what) {
  const int64_t bytes = type == KVType::q8_0 ? 34 * detail::checked_count(what, {B, H, cap, dim / 32}, 34)
                                             : kv_row_bytes(type, detail::checked_count(what, {B, H, cap, dim}, 4));
  return Tensor({(bytes + 3) / 4}, what);
}

}  // namespace

KVType parse_kv_type(std::string_view name, std::string_view what) {
  if (name == "f32") return KVType::f32;
  if (name == "bf16") return KVType::bf16;
  if (name == "f16") return KVType::f16;
  if (name == "q8_0") return KVType::q8_0;
  throw Error(detail::message(what, ": expected \"f32\", \"bf16\", \"f16\" or \"q8_0\", got ", detail::quote(name)));
}

std::string_view kv_type_name(KVType type) {
  switch (type) {
    case KVType::bf16: return "bf16";
    case KVType::f16: return "f16";
    case KVType::q8_0: return "q8_0";
    case KVType::f32: break;
  }
  return "f32";
}

std::string kv_type_name(KVTypes types) {
  if (types.key == types.value) return std::string(kv_type_name(types.key));
  return detail::message(kv_type_name(types.key), "/", kv_type_name(types.value));
}

KVTypes parse_kv_types(std::string_view name, std::string_view what) {
  const size_t slash = name.find('/');
  if (slash == std::string_view::npos) return parse_kv_type(name, what);
  const std::string key_what = detail::message(what, " (keys)"), value_what = detail::message(what, " (values)");
  return {parse_kv_type(name.substr(0, slash), key_what), parse_kv_type(name.substr(slash + 1), value_what)};
}

void check_kv_dim(KVType type, int64_t dim, std::string_view fn, std::string_view arg) {
  if (type == KVType::q8_0 && dim % 32 != 0)
    detail::fail(fn, arg, "a multiple of 32 (q8_0 keys and values are blocks of 32 values)", std::to_string(dim));
}

KVCache::KVCache(int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim, int64_t v_head_dim, KVTypes type)
    : batch_(batch), kv_heads_(kv_heads), capacity_(capacity), head_dim_(head_dim), v_head_dim_(v_head_dim),
      type_(type) {
  constexpr std::string_view fn = "KVCache";
  if (batch < 0) detail::fail(fn, "batch", "a count >= 0", std::to_string(batch));
  if (kv_heads <= 0) detail::fail(fn, "kv_heads", "a count > 0", std::to_string(kv_heads));
  if (capacity < 0) detail::fail(fn, "capacity", "a count >= 0", std::to_string(capacity));
  if (head_dim <= 0) detail::fail(fn, "head_dim", "a count > 0", std::to_string(head_dim));
  if (v_head_dim <= 0) detail::fail(fn, "v_head_dim", "a count > 0", std::to_string(v_head_dim));
  for (const KVType t : {type.key, type.value})
    if (t != KVType::f32 && t != KVType::bf16 && t != KVType::f16 && t != KVType::q8_0)
      detail::fail(fn, "type", "KVType f32, bf16, f16 or q8_0", std::to_string(static_cast<int>(t)));
  check_kv_dim(type.key, head_dim, fn, "head_dim");
  check_kv_dim(type.value, v_head_dim, fn, "v_head_dim");
  k_ = storage(type.key, batch, kv_heads, capacity, head_dim, "KVCache: keys [B, Hkv, capacity, D]");
  v_ = storage(type.value, batch, kv_heads, capacity, v_head_dim, "KVCache: values [B, Hkv, capacity, Dv]");
}

void KVCache::check_room(int64_t tokens, const char* what) const {
  if (tokens > capacity_ - length_)  // not length_ + tokens: that could overflow
    detail::fail("KVCache", what,
                 detail::message("at most ", capacity_ - length_, " new tokens (capacity ", capacity_,
                                 ", holding ", length_, ")"),
                 detail::message(tokens, " new tokens"));
}

void KVCache::check_type(KVType have, KVType want, std::string_view fn) {
  if (have != want)
    detail::fail(fn, "T", detail::message("the cache's element type (", kv_type_name(have), ")"),
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
  copy_tokens(k, type_.key, k_.data(), kv_heads_, capacity_, head_dim_, length_);
  copy_tokens(v, type_.value, v_.data(), kv_heads_, capacity_, v_head_dim_, length_);
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
  // Each row copied when the types agree, else read back exactly and stored in this cache's type.
  const auto copy = [&](const void* src_data, KVType src_type, void* dst_data, KVType dst_type, int64_t D) {
    const int64_t src_bytes = kv_row_bytes(src_type, D), dst_bytes = kv_row_bytes(dst_type, D);
    std::vector<float> row(static_cast<size_t>(D));
    for (int64_t bh = 0; bh < batch_ * kv_heads_; ++bh)
      for (int64_t t = 0; t < from.length_; ++t) {
        const auto* src = static_cast<const std::byte*>(src_data) + (bh * from.capacity_ + t) * src_bytes;
        auto* dst = static_cast<std::byte*>(dst_data) + (bh * capacity_ + length_ + t) * dst_bytes;
        if (src_type == dst_type) {
          std::memcpy(dst, src, static_cast<size_t>(src_bytes));
        } else {
          nn::load_kv(src_type, src, D, row.data());
          nn::store_kv(dst_type, row.data(), D, dst);
        }
      }
  };
  copy(from.k_data(), from.type_.key, k_.data(), type_.key, head_dim_);
  copy(from.v_data(), from.type_.value, v_.data(), type_.value, v_head_dim_);
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
