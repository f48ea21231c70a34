// text/word_cache.h — the bounded word → token ids cache of both tokenizers (tokenizer.cpp,
// hf_tokenizer.cpp): open addressing over one array of 16-byte slots, each word's bytes with its
// ids after them in one pool, so a lookup is a hash, a probe and one comparison (two places in
// memory), with no allocation. Words of up to
// kMaxWordBytes bytes; when it holds max_words words it starts afresh. Not thread-safe: callers
// lock. Not a general hash map.
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
  // Caches ids for a word of at most kMaxWordBytes bytes that find() does not have.
  void insert(std::string_view word, uint64_t h, std::span<const int32_t> ids);

 private:
  struct Slot {
    uint64_t hash;    // 0: empty
    uint32_t offset;  // into pool_: the word's bytes, then its ids
    uint16_t word_len, ids_len;
  };
  size_t max_words_, count_ = 0;
  std::vector<Slot> slots_;  // a power of two, at least twice max_words_
  std::string pool_;
};

}  // namespace mhsa::text
