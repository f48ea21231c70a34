// text/word_cache.h — the bounded word → token ids cache of both tokenizers (tokenizer.cpp,
// hf_tokenizer.cpp): open addressing over one array of 16-byte slots. A word of up to 8 bytes is
// kept in its slot, and so is its id when it has one, so the common lookup (a short word that is
// one token) reads one slot and nothing else; longer words and longer id lists live in one pool,
// found by the slot. No allocation on a lookup. Words of up to kMaxWordBytes bytes; when it holds
// max_words words it starts afresh. Not thread-safe: callers lock. Not a general hash map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mhsa::text {

class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 64;
  explicit WordCache(size_t max_words = size_t{1} << 16);

  static uint64_t hash(std::string_view word);
  // Appends the ids cached for `word` (whose hash() is `h`) to `out`; false when there are none.
  bool find(std::string_view word, uint64_t h, std::vector<int32_t>& out) const;
  // Caches ids for a word of 1 to kMaxWordBytes bytes that find() does not have.
  void insert(std::string_view word, uint64_t h, std::span<const int32_t> ids);
  // Asks the processor to bring in the slot where a lookup of hash `h` starts (so that the
  // lookups of a batch of words wait for memory together). Reads no memory: callers need no lock.
  void prefetch(uint64_t h) const { __builtin_prefetch(&slots_[h & (slots_.size() - 1)]); }

 private:
  static constexpr size_t kInline = 8;  // words this long or shorter are kept in their slot
  struct Slot {
    uint64_t key;     // a short word's bytes (zero-padded), else its hash
    uint32_t offset;  // the id of a short word with one id; else into pool_: the word's bytes
                      // (long words only), then its ids
    uint16_t word_len, ids_len;  // word_len 0: an empty slot
  };
  static uint64_t short_key(std::string_view word);
  size_t max_words_, count_ = 0;
  std::vector<Slot> slots_;  // a power of two, at least twice max_words_
  std::string pool_;
};

}  // namespace mhsa::text
