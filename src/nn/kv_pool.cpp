// nn/kv_pool.cpp — KVBlockPool (see kv_pool.h): the free list, the cached blocks in release order,
// the prefix index, promises.
#include "mhsa/kv_pool.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <string>

#include "core/check.h"

namespace mhsa {
namespace {

void check_count(const char* what, int64_t n) {
  if (n <= 0) detail::fail("KVBlockPool", what, "a count > 0", std::to_string(n));
}

}  // namespace

KVBlockPool::KVBlockPool(int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t v_head_dim, int64_t block_tokens,
                         int64_t blocks, KVType type)
    : layers_(layers), kv_heads_(kv_heads), head_dim_(head_dim), v_head_dim_(v_head_dim), block_tokens_(block_tokens),
      type_(type) {
  check_count("layers", layers);
  check_count("kv_heads", kv_heads);
  check_count("head_dim", head_dim);
  check_count("v_head_dim", v_head_dim);
  check_count("block_tokens", block_tokens);
  if (!std::has_single_bit(static_cast<uint64_t>(block_tokens)))  // the attention kernels' page shift
    detail::fail("KVBlockPool", "block_tokens", "a power of two (1, 2, 4, ..., 16, ...)", std::to_string(block_tokens));
  check_count("blocks", blocks);
  if (blocks > (int64_t{1} << 30)) detail::fail("KVBlockPool", "blocks", "at most 2^30", std::to_string(blocks));
  if (type != KVType::f32 && type != KVType::bf16 && type != KVType::f16)
    detail::fail("KVBlockPool", "type", "KVType f32, bf16 or f16", std::to_string(static_cast<int>(type)));
  (void)detail::checked_count("KVBlockPool: a block [layers, Hkv, block_tokens, D + Dv]",
                              {layers, kv_heads, block_tokens, head_dim + v_head_dim}, kv_type_bytes(type));
  const auto n = static_cast<size_t>(blocks);
  storage_.resize(n);
  refs_.assign(n, 0);
  lru_tick_.assign(n, 0);
  indexed_as_.resize(n);
  free_.reserve(n);
  for (size_t b = n; b-- > 0;) free_.push_back(static_cast<int32_t>(b));  // block 0 first
}

int64_t KVBlockPool::block_bytes() const {
  return layers_ * kv_heads_ * block_tokens_ * (head_dim_ + v_head_dim_) * kv_type_bytes(type_);
}

int64_t KVBlockPool::available() const { return blocks() - used_ - reserved_; }

KVPoolStats KVBlockPool::stats() const {
  return {blocks(), used_, static_cast<int64_t>(lru_.size()), reserved_};
}

bool KVBlockPool::reserve(PagedSequence& s, int64_t n) {
  if (n < 0 || n > available()) return false;
  s.pool = this;
  s.reserved += n;
  reserved_ += n;
  return true;
}

int32_t KVBlockPool::take_block() {
  // A free block, else the least recently released cached one (promises guarantee there is one).
  const int32_t b = !free_.empty() ? free_.back() : lru_.begin()->second;
  Tensor& t = storage_[static_cast<size_t>(b)];
  if (!t.defined())  // may throw (out of memory): nothing has changed yet
    t = Tensor({(block_bytes() + 3) / 4}, "KVBlockPool: a block [layers, Hkv, block_tokens, D + Dv]");
  if (!free_.empty()) {
    free_.pop_back();
  } else {  // evicted: its index entry goes (entries chained to it become unreachable)
    lru_.erase(lru_.begin());
    lru_tick_[static_cast<size_t>(b)] = 0;
    index_.erase(indexed_as_[static_cast<size_t>(b)]);
    indexed_as_[static_cast<size_t>(b)] = {};
  }
  return b;
}

int64_t KVBlockPool::share_prefix(PagedSequence& s, std::span<const int32_t> tokens, int64_t max_blocks) {
  if (!s.blocks.empty()) detail::fail("KVBlockPool::share_prefix", "s", "an empty block table", "a table in use");
  s.pool = this;
  uint64_t parent = 0;
  const auto bs = static_cast<size_t>(block_tokens_);
  for (int64_t i = 0; i < max_blocks && (static_cast<size_t>(i) + 1) * bs <= tokens.size(); ++i) {
    const auto it = index_.find({parent, std::vector<int32_t>(tokens.begin() + i * block_tokens_,
                                                              tokens.begin() + (i + 1) * block_tokens_)});
    if (it == index_.end()) break;
    const int32_t b = it->second.block;
    const auto ub = static_cast<size_t>(b);
    if (refs_[ub] == 0) {  // cached: it leaves the evictable blocks, so it must be available
      if (available() < 1) break;
      lru_.erase(lru_tick_[ub]);
      lru_tick_[ub] = 0;
      ++used_;
    }
    ++refs_[ub];
    s.blocks.push_back(b);
    s.keys.push_back(it->second.key);
    parent = it->second.key;
  }
  s.length = static_cast<int64_t>(s.blocks.size()) * block_tokens_;
  return static_cast<int64_t>(s.blocks.size());
}

void KVBlockPool::grow(PagedSequence& s, int64_t tokens) {
  const int64_t need = blocks_for(tokens) - static_cast<int64_t>(s.blocks.size());
  if (need > s.reserved)
    detail::fail("KVBlockPool::grow", "tokens",
                 detail::message("at most ", (static_cast<int64_t>(s.blocks.size()) + s.reserved) * block_tokens_,
                                 " (the blocks held and promised)"),
                 std::to_string(tokens));
  for (int64_t i = 0; i < need; ++i) {
    const int32_t b = take_block();
    --s.reserved;
    --reserved_;
    refs_[static_cast<size_t>(b)] = 1;
    ++used_;
    s.blocks.push_back(b);
    s.keys.push_back(0);
  }
}

void KVBlockPool::index_full_blocks(PagedSequence& s, std::span<const int32_t> tokens) {
  const int64_t full = std::min<int64_t>(s.length, static_cast<int64_t>(tokens.size())) / block_tokens_;
  for (int64_t i = 0; i < full; ++i) {
    const auto ui = static_cast<size_t>(i);
    if (s.keys[ui] != 0) continue;
    const uint64_t parent = i == 0 ? 0 : s.keys[ui - 1];
    std::pair<uint64_t, std::vector<int32_t>> id{
        parent, std::vector<int32_t>(tokens.begin() + i * block_tokens_, tokens.begin() + (i + 1) * block_tokens_)};
    const auto [it, added] = index_.try_emplace(id, Entry{s.blocks[ui], next_key_});
    if (added) {  // else an equal block is indexed already: this one stays private
      ++next_key_;
      indexed_as_[static_cast<size_t>(s.blocks[ui])] = std::move(id);
    }
    s.keys[ui] = it->second.key;
  }
}

void KVBlockPool::drop_ref(int32_t b) {
  const auto ub = static_cast<size_t>(b);
  if (--refs_[ub] > 0) return;
  --used_;
  if (indexed_as_[ub].second.empty()) {
    free_.push_back(b);
  } else {
    lru_tick_[ub] = ++tick_;
    lru_.emplace(tick_, b);
  }
}

void KVBlockPool::release(PagedSequence& s) {
  if (s.pool != this) return;
  for (int32_t b : s.blocks) drop_ref(b);
  reserved_ -= s.reserved;
  s = PagedSequence{};
}

void* KVBlockPool::keys(int64_t layer, int32_t b) {
  auto* base = reinterpret_cast<std::byte*>(storage_[static_cast<size_t>(b)].data());
  return base + layer * kv_heads_ * block_tokens_ * (head_dim_ + v_head_dim_) * kv_type_bytes(type_);
}

void* KVBlockPool::values(int64_t layer, int32_t b) {
  return static_cast<std::byte*>(keys(layer, b)) + kv_heads_ * block_tokens_ * head_dim_ * kv_type_bytes(type_);
}

void KVBlockPool::check_held(int32_t b, const char* what) const {
  if (b < 0 || b >= blocks() || refs_[static_cast<size_t>(b)] == 0)
    detail::fail("KVBlockPool", what, "a block held by the sequence", std::to_string(b));
}

}  // namespace mhsa
