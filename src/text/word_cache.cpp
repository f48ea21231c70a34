// text/word_cache.cpp — see word_cache.h. Linear probing; the hash reads eight bytes at a time,
// and a short word's key is read in at most three loads without a library call.
#include "text/word_cache.h"

#include <algorithm>
#include <cstring>

namespace mhsa::text {

namespace {
constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
uint64_t mix(uint64_t h) {
  h *= kMul;
  return h ^ (h >> 32);
}
uint32_t load32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
}  // namespace

WordCache::WordCache(size_t max_words) : max_words_(max_words) {
  size_t n = 16;
  while (n < 2 * max_words) n *= 2;
  slots_.assign(n, Slot{});
}

// The bytes of a word of 1 to 8 bytes, little-endian, zero above: two overlapping 4-byte loads,
// or the first, middle and last bytes (which overlap in the same way) for 1 to 3 bytes.
uint64_t WordCache::short_key(std::string_view word) {
  const char* p = word.data();
  const size_t n = word.size();
  if (n >= 4) return load32(p) | uint64_t{load32(p + n - 4)} << (8 * (n - 4));
  const auto byte = [&](size_t i) { return uint64_t{static_cast<unsigned char>(p[i])} << (8 * i); };
  return byte(0) | byte(n / 2) | byte(n - 1);
}

uint64_t WordCache::hash(std::string_view word) {
  if (word.size() <= kInline) return mix(short_key(word) ^ word.size());
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
  return mix(h ^ tail);
}

bool WordCache::find(std::string_view word, uint64_t h, std::vector<int32_t>& out) const {
  const size_t mask = slots_.size() - 1;
  const bool inline_word = word.size() <= kInline;
  const uint64_t key = inline_word ? short_key(word) : h;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.word_len == 0) return false;
    if (s.key != key || s.word_len != word.size()) continue;
    if (inline_word) {
      if (s.ids_len == 1) {
        out.push_back(static_cast<int32_t>(s.offset));
        return true;
      }
    } else if (std::memcmp(pool_.data() + s.offset, word.data(), word.size()) != 0) {
      continue;
    }
    const char* ids = pool_.data() + s.offset + (inline_word ? 0 : s.word_len);
    for (size_t k = 0; k < s.ids_len; ++k) {  // a few ids: no library call
      int32_t id;
      std::memcpy(&id, ids + k * sizeof(int32_t), sizeof(int32_t));
      out.push_back(id);
    }
    return true;
  }
}

void WordCache::insert(std::string_view word, uint64_t h, std::span<const int32_t> ids) {
  if (word.empty() || word.size() > kMaxWordBytes || ids.size() > kMaxWordBytes) return;
  if (count_ >= max_words_) {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    pool_.clear();
    count_ = 0;
  }
  const size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  while (slots_[i].word_len != 0) i = (i + 1) & mask;
  const bool inline_word = word.size() <= kInline;
  Slot& s = slots_[i];
  s = {inline_word ? short_key(word) : h, static_cast<uint32_t>(pool_.size()), static_cast<uint16_t>(word.size()),
       static_cast<uint16_t>(ids.size())};
  if (inline_word && ids.size() == 1) s.offset = static_cast<uint32_t>(ids[0]);
  else {
    if (!inline_word) pool_.append(word);
    pool_.append(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t));
  }
  ++count_;
}

}  // namespace mhsa::text
