// text/bpe.h — the byte-pair merge loop shared by GPT-2's tokenizer (tokenizer.cpp) and
// tokenizer.json's BPE model (hf_tokenizer.cpp): a table of merges by the ids of their two parts,
// and the merging of one pre-token's symbols, lowest rank first, the leftmost of equals. Not a
// tokenizer: what the initial symbols are is the caller's business.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mhsa::text {

// Open addressing over one array (linear probing, at most half full): a lookup is a multiply
// and, nearly always, one cache line.
class BpeMerges {
 public:
  struct Merge {
    int32_t rank, id;  // rank: the merge's place in the file (lower merges first); id: the result
  };
  // False when the pair already has a merge. Ids are >= 0.
  bool add(int32_t left, int32_t right, Merge m);
  const Merge* find(int32_t left, int32_t right) const {
    const uint64_t k = key(left, right);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.key == k) return &e.merge;
      if (e.key == kEmpty) return nullptr;
    }
  }
  void reserve(size_t n);

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // no pair of ids >= 0 has this key
  struct Entry {
    uint64_t key = kEmpty;
    Merge merge{};
  };
  static uint64_t key(int32_t left, int32_t right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }
  size_t slot(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_) & mask_; }
  std::vector<Entry> entries_ = std::vector<Entry>(16);
  size_t mask_ = 15, count_ = 0;
  int shift_ = 60;  // 64 - log2(entries_.size())
};

// Appends to `out` the ids `symbols` merge into. O(n log n) in the number of symbols.
void bpe_merge(std::span<const int32_t> symbols, const BpeMerges& merges, std::vector<int32_t>& out);

}  // namespace mhsa::text
