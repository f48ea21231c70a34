// mhsa/kv_pool.h — a paged KV cache: one pool of fixed-size blocks of keys and values (every
// layer's, block_tokens tokens each) shared by many sequences, each with a block table (the ids of
// its blocks in order), as the server uses it. Full blocks are indexed by their tokens (the whole
// prefix up to them), so a sequence whose prompt starts with the same tokens as another's takes
// those blocks by reference instead of computing them again (prefix sharing). A full block is
// never written again (a sequence only writes at its own length, past its shared blocks), so
// sharing needs no copy-on-write. Blocks whose last user left stay indexed ("cached") until their
// memory is needed, least recently released first.
//
// Admission by memory: reserve(n) promises n future allocations (false when the pool cannot keep
// the promise), so a sequence that reserved its prompt + max_tokens never runs out half-way.
// Memory: blocks are allocated in slabs of consecutive ids (2 MiB and up: huge pages where the
// system has them) when the first block of a slab is handed out, or all at once by allocate_all,
// and kept until the pool goes.
// Elements are float32, 16-bit or q8_0 (KVTypes, kv_cache.h; keys and values each their own): a
// 16-bit block holds the same tokens in half the bytes (block_bytes), a q8_0 one in 17/64 of
// them, so the same memory holds more blocks; admission counts blocks.
// Not thread-safe: one owner (the server's scheduler thread). Attention gathers a sequence's
// blocks into one contiguous [Hkv, length, D] view per layer (nn/block.cpp); mhsa generate, chat
// and Python keep the contiguous ModelCache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "mhsa/kv_cache.h"
#include "mhsa/tensor.h"

namespace mhsa {

class KVBlockPool;

// One sequence's place in a pool: its block table and the tokens it holds. Model::step appends a
// step's tokens at `length` (the blocks must already cover them: see KVBlockPool::grow).
struct PagedSequence {
  KVBlockPool* pool = nullptr;
  std::vector<int32_t> blocks;  // block table: tokens [i·block_tokens, (i+1)·block_tokens) in blocks[i]
  std::vector<uint64_t> keys;   // the prefix index's key of each full block (0: not yet indexed)
  int64_t length = 0;           // tokens held
  int64_t reserved = 0;         // allocations still promised to it (see reserve)
};

struct KVPoolStats {
  int64_t blocks = 0;         // in the pool
  int64_t used = 0;           // held by at least one sequence
  int64_t cached = 0;         // held by none, still indexed: reusable by a prefix or evictable
  int64_t reserved = 0;       // promised to sequences, not yet allocated
  int64_t allocated_bytes = 0;  // memory of the slabs allocated so far (all of them: memory_bytes())
};

class KVBlockPool {
 public:
  // Throws mhsa::Error for a count ≤ 0 (blocks, block_tokens, layers, heads, head sizes), for
  // block_tokens not a power of two and for a q8_0 head size not a multiple of 32.
  KVBlockPool(int64_t layers, int64_t kv_heads, int64_t head_dim, int64_t v_head_dim, int64_t block_tokens,
              int64_t blocks, KVTypes type = {});
  KVBlockPool(const KVBlockPool&) = delete;
  KVBlockPool& operator=(const KVBlockPool&) = delete;

  int64_t layers() const { return layers_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t v_head_dim() const { return v_head_dim_; }
  int64_t block_tokens() const { return block_tokens_; }
  KVTypes type() const { return type_; }
  int64_t blocks() const { return static_cast<int64_t>(refs_.size()); }
  // Keys and values of every layer: per layer [Hkv, block_tokens] rows of kv_row_bytes(type().key,
  // D) then of kv_row_bytes(type().value, Dv), each part rounded up to the alignment of the
  // elements that follow it (4 bytes for float32, else 2).
  int64_t block_bytes() const;
  // Memory of the whole pool once every slab is allocated (blocks, each block_bytes() rounded up
  // to 64 bytes), and of the slabs allocated so far.
  int64_t memory_bytes() const;
  int64_t allocated_bytes() const { return allocated_bytes_; }
  // Allocates (and so touches: the kernel clears each page now) every slab not yet allocated, so
  // that no step later pays for fresh pages: a fresh 2 MiB page cleared in a step stalls both
  // threads of its parallel regions (4–6% of a server's 8-sequence GPT-2 steps until the pool was
  // touched: docs/performance-history.md, "The server's KV pool allocated at startup"). Throws mhsa::Error naming
  // the bytes when memory
  // runs out; the slabs allocated before that are kept.
  void allocate_all();
  // Blocks not held by a sequence nor promised (never used, free, or cached), counted for reserve.
  int64_t available() const;
  KVPoolStats stats() const;
  // Blocks needed for `tokens` tokens.
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_tokens_ - 1) / block_tokens_; }

  // Promises `n` more allocations to s; false (nothing promised) when fewer are available.
  bool reserve(PagedSequence& s, int64_t n);
  // Takes the longest run of indexed full blocks that begins `tokens` (at most max_blocks; a
  // cached one only while available() allows) into s's empty table; returns how many.
  int64_t share_prefix(PagedSequence& s, std::span<const int32_t> tokens, int64_t max_blocks);
  // Appends blocks to s's table, from its promise, until it covers `tokens` tokens. Throws
  // mhsa::Error when the promise runs out.
  void grow(PagedSequence& s, int64_t tokens);
  // Indexes s's full blocks not yet indexed; tokens: s's first s.length tokens (or more).
  void index_full_blocks(PagedSequence& s, std::span<const int32_t> tokens);
  // Keeps s's first `tokens` tokens (speculative decoding's roll-back past a rejected guess): the
  // blocks past them go back to s's promise, so that it can grow again. Throws mhsa::Error for a
  // length outside [0, s.length] or one that cuts into an indexed block (a full block may be
  // shared and is never written again: index only what is final).
  void truncate(PagedSequence& s, int64_t tokens);
  // Gives back s's blocks and what is left of its promise; s is empty afterwards.
  void release(PagedSequence& s);

  // Block b of layer l: keys [Hkv, block_tokens, D], values [Hkv, block_tokens, Dv], elements of
  // type().key and type().value (float, bfloat16, float16 or BlockQ8_0: [Hkv, block_tokens, D/32]).
  void* keys(int64_t layer, int32_t b);
  void* values(int64_t layer, int32_t b);
  // Block b's bytes, block_bytes() of them: every layer's keys and values (and whatever else the
  // block holds), so that a block can be copied out and back whole (the server's prompt cache)
  // without knowing its layout. b: a block whose slab is allocated (one taken by grow).
  std::span<std::byte> block_data(int32_t b);
  // Throws unless b is a block held by a sequence.
  void check_held(int32_t b, const char* what) const;
  int32_t holders(int32_t b) const { return refs_[static_cast<size_t>(b)]; }  // b: a valid block

 private:
  struct Entry {
    int32_t block;
    uint64_t key;  // this content's key: the parent of the next block's entry
  };
  Tensor new_slab(size_t i) const;  // the memory of slabs_[i]'s blocks (cleared)
  void allocate_slab(size_t i);     // slabs_[i], unless it is allocated
  int32_t take_block();      // a free block, or the least recently released cached one (unindexed)
  void drop_ref(int32_t b);

  int64_t layers_, kv_heads_, head_dim_, v_head_dim_, block_tokens_;
  KVTypes type_;
  int64_t key_bytes_ = 0, layer_bytes_ = 0;  // a layer's keys, and its keys and values, in a block
  static int64_t slab_blocks(int64_t block_stride);
  // Blocks [i·slab_blocks_, (i+1)·slab_blocks_) lie in slabs_[i], allocated when the first of them
  // is handed out: each [layers, Hkv, bs, D + Dv] elements of type_ (two 16-bit ones per float).
  int64_t block_stride_ = 0;  // block_bytes() rounded up to 64
  int64_t slab_blocks_ = 1;
  std::vector<Tensor> slabs_;
  std::vector<int32_t> refs_;         // sequences holding each block
  std::vector<int32_t> free_;         // never used or unindexed blocks with no holder
  std::map<uint64_t, int32_t> lru_;   // cached blocks by release order (tick → block)
  std::vector<uint64_t> lru_tick_;    // each cached block's tick (0: not cached)
  uint64_t tick_ = 0;
  // The prefix index: (parent key, the block's tokens) → the block holding them. Keys are never
  // reused, so an entry whose parent was evicted can no longer be reached, only evicted.
  std::map<std::pair<uint64_t, std::vector<int32_t>>, Entry> index_;
  std::vector<std::pair<uint64_t, std::vector<int32_t>>> indexed_as_;  // per block (empty: not indexed)
  uint64_t next_key_ = 1;
  int64_t reserved_ = 0, used_ = 0;
  int64_t allocated_bytes_ = 0;  // the slabs allocated so far
};

}  // namespace mhsa
