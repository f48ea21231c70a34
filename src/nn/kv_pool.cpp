// nn/kv_pool.cpp — KVBlockPool (see kv_pool.h): the free list, the cached blocks in release order,
// the prefix index, promises.
#include "mhsa/kv_pool.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <exception>
#include <limits>
#include <mutex>
#include <new>
#include <string>

#include "core/check.h"

namespace mhsa {
namespace {

void check_count(const char* what, int64_t n) {
  if (n <= 0) detail::fail("KVBlockPool", what, "a count > 0", std::to_string(n));
}

}  // namespace

KVBlockPool::KVBlockPool(int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t v_head_dim, int64_t block_tokens,
                         int64_t blocks, KVTypes type)
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
  for (const KVType t : {type.key, type.value})
    if (t != KVType::f32 && t != KVType::bf16 && t != KVType::f16 && t != KVType::q8_0)
      detail::fail("KVBlockPool", "type", "KVType f32, bf16, f16 or q8_0", std::to_string(static_cast<int>(t)));
  check_kv_dim(type.key, head_dim, "KVBlockPool", "head_dim");
  check_kv_dim(type.value, v_head_dim, "KVBlockPool", "v_head_dim");
  (void)detail::checked_count("KVBlockPool: a block [layers, Hkv, block_tokens, D + Dv]",
                              {layers, kv_heads, block_tokens, head_dim + v_head_dim}, sizeof(float));
  // A layer's values start aligned for their elements, and the next layer's keys for theirs.
  const auto align = [](int64_t bytes, KVType next) {
    const int64_t a = next == KVType::f32 ? 4 : 2;
    return (bytes + a - 1) / a * a;
  };
  key_bytes_ = align(kv_heads * block_tokens * kv_row_bytes(type.key, head_dim), type.value);
  layer_bytes_ = align(key_bytes_ + kv_heads * block_tokens * kv_row_bytes(type.value, v_head_dim), type.key);
  const auto n = static_cast<size_t>(blocks);
  block_stride_ = (block_bytes() + 63) / 64 * 64;  // every block 64-byte aligned, as a Tensor of its own was
  if (block_stride_ > std::numeric_limits<int64_t>::max() / blocks)
    detail::fail("KVBlockPool", "blocks", "a pool whose bytes fit in 64 bits",
                 detail::message(blocks, " blocks of ", block_stride_, " bytes"));
  slab_blocks_ = slab_blocks(block_stride_);
  try {  // the bookkeeping: ~48 bytes a block, allocated now (the blocks' memory later, or by allocate_all)
    slabs_.resize((n + static_cast<size_t>(slab_blocks_) - 1) / static_cast<size_t>(slab_blocks_));
    refs_.assign(n, 0);
    lru_tick_.assign(n, 0);
    indexed_as_.resize(n);
    free_.reserve(n);
  } catch (const std::bad_alloc&) {
    detail::fail("KVBlockPool", "blocks", "memory for the bookkeeping of each block (~48 bytes)",
                 detail::message("out of memory for ", blocks, " blocks"));
  }
  for (size_t b = n; b-- > 0;) free_.push_back(static_cast<int32_t>(b));  // block 0 first
}

// Blocks per slab: the fewest whose bytes reach 2 MiB (tensor memory from 2 MiB on is asked for
// in transparent huge pages) within 3% of whole 2 MiB pages, else the count of at most 64 that
// wastes the least. One huge page maps what 512 small ones would: a decode step reads every
// block of every sequence, a few KiB at a time, and with a block per allocation a 16-token GPT-2
// block (1.2 MB) was 4 KiB pages, each a TLB miss.
int64_t KVBlockPool::slab_blocks(int64_t block_stride) {
  constexpr int64_t kPage = int64_t{2} << 20;
  if (block_stride >= kPage) return 1;
  int64_t best = 0;
  double best_waste = 2.0;
  for (int64_t g = (kPage + block_stride - 1) / block_stride; g <= 64; ++g) {
    const int64_t bytes = g * block_stride;
    const double waste = double((bytes + kPage - 1) / kPage * kPage - bytes) / double(bytes);
    if (waste <= 0.03) return g;
    if (waste < best_waste) best = g, best_waste = waste;
  }
  return best > 0 ? best : 1;
}

int64_t KVBlockPool::block_bytes() const {
  return layers_ * layer_bytes_;
}

int64_t KVBlockPool::available() const { return blocks() - used_ - reserved_; }

KVPoolStats KVBlockPool::stats() const {
  return {blocks(), used_, static_cast<int64_t>(lru_.size()), reserved_, allocated_bytes()};
}

int64_t KVBlockPool::memory_bytes() const { return blocks() * block_stride_; }

Tensor KVBlockPool::new_slab(size_t i) const {
  const int64_t first = static_cast<int64_t>(i) * slab_blocks_, count = std::min(slab_blocks_, blocks() - first);
  return Tensor({count * block_stride_ / 4}, "KVBlockPool: blocks [layers, Hkv, block_tokens, D + Dv]");
}

void KVBlockPool::allocate_slab(size_t i) {
  if (slabs_[i].defined()) return;
  slabs_[i] = new_slab(i);
  allocated_bytes_ += slabs_[i].numel() * static_cast<int64_t>(sizeof(float));
}

void KVBlockPool::allocate_all() {
  // The slabs in parallel: clearing fresh pages is the kernel's work on the faulting thread, and
  // in a virtual machine the host backs each page on its first touch (~4 ms per 2 MiB page measured
  // on the development VM).
  std::exception_ptr failed;
  std::mutex mutex;
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < slabs_.size(); ++i) {
    if (slabs_[i].defined()) continue;
    try {
      Tensor t = new_slab(i);
      const std::lock_guard lock(mutex);
      allocated_bytes_ += t.numel() * static_cast<int64_t>(sizeof(float));
      slabs_[i] = std::move(t);
    } catch (...) {
      const std::lock_guard lock(mutex);
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
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
  allocate_slab(static_cast<size_t>(b / slab_blocks_));  // may throw (out of memory): nothing has changed yet
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

void KVBlockPool::truncate(PagedSequence& s, int64_t tokens) {
  if (tokens < 0 || tokens > s.length)
    detail::fail("KVBlockPool::truncate", "tokens", detail::message("a length in [0, ", s.length, "] (the tokens held)"),
                 std::to_string(tokens));
  for (size_t i = static_cast<size_t>(tokens / block_tokens_); i < s.keys.size(); ++i)
    if (s.keys[i] != 0)
      detail::fail("KVBlockPool::truncate", "tokens",
                   detail::message("at least ", (static_cast<int64_t>(i) + 1) * block_tokens_,
                                   " (block ", i, " is indexed: its tokens are final)"),
                   std::to_string(tokens));
  for (auto keep = static_cast<size_t>(blocks_for(tokens)); s.blocks.size() > keep;) {
    drop_ref(s.blocks.back());
    s.blocks.pop_back();
    s.keys.pop_back();
    ++s.reserved;
    ++reserved_;
  }
  s.length = tokens;
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
  auto* base = reinterpret_cast<std::byte*>(slabs_[static_cast<size_t>(b / slab_blocks_)].data()) +
               (b % slab_blocks_) * block_stride_;
  return base + layer * layer_bytes_;
}

std::span<std::byte> KVBlockPool::block_data(int32_t b) {
  return {static_cast<std::byte*>(keys(0, b)), static_cast<size_t>(block_bytes())};
}

void* KVBlockPool::values(int64_t layer, int32_t b) {
  return static_cast<std::byte*>(keys(layer, b)) + key_bytes_;
}

void KVBlockPool::check_held(int32_t b, const char* what) const {
  if (b < 0 || b >= blocks() || refs_[static_cast<size_t>(b)] == 0)
    detail::fail("KVBlockPool", what, "a block held by the sequence", std::to_string(b));
}

}  // namespace mhsa
