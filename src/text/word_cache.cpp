// text/word_cache.cpp — see word_cache.h. Linear probing; the hash reads eight bytes at a time.
#include "text/word_cache.h"

#include <algorithm>
#include <cstring>

namespace mhsa::text {

WordCache::WordCache(size_t max_words) : max_words_(max_words) {
  size_t n = 16;
  while (n < 2 * max_words) n *= 2;
  slots_.assign(n, Slot{});
}

uint64_t WordCache::hash(std::string_view word) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h = word.size() * kMul;
  size_t i = 0;
  for (; i + 8 <= word.size(); i += 8) {
    uint64_t chunk;
    std::memcpy(&chunk, word.data() + i, 8);
    h = (h ^ chunk) * kMul;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, word.data() + i, word.size() - i);
  h = (h ^ tail) * kMul;
  h ^= h >> 32;
  return h | 1;  // never 0, the empty slot's mark
}

bool WordCache::find(std::string_view word, uint64_t h, std::vector<int32_t>& out) const {
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return false;
    if (s.hash == h && s.word_len == word.size() && std::memcmp(pool_.data() + s.offset, word.data(), word.size()) == 0) {
      const size_t at = out.size();
      out.resize(at + s.ids_len);
      std::memcpy(out.data() + at, pool_.data() + s.offset + s.word_len, s.ids_len * sizeof(int32_t));
      return true;
    }
  }
}

void WordCache::insert(std::string_view word, uint64_t h, std::span<const int32_t> ids) {
  if (word.size() > kMaxWordBytes || ids.size() > kMaxWordBytes) return;
  if (count_ >= max_words_) {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    pool_.clear();
    count_ = 0;
  }
  const size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  while (slots_[i].hash != 0) i = (i + 1) & mask;
  slots_[i] = {h, static_cast<uint32_t>(pool_.size()), static_cast<uint16_t>(word.size()), static_cast<uint16_t>(ids.size())};
  pool_.append(word);
  pool_.append(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t));
  ++count_;
}

}  // namespace mhsa::text
