// text/bpe.h — the byte-pair merge loop shared by GPT-2's tokenizer (tokenizer.cpp) and
// tokenizer.json's BPE model (hf_tokenizer.cpp): a table of merges by the ids of their two parts,
// and the merging of one pre-token's symbols, lowest rank first, the leftmost of equals. Not a
// tokenizer: what the initial symbols are is the caller's business.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace mhsa::text {

class BpeMerges {
 public:
  struct Merge {
    int32_t rank, id;  // rank: the merge's place in the file (lower merges first); id: the result
  };
  // False when the pair already has a merge.
  bool add(int32_t left, int32_t right, Merge m) { return map_.emplace(key(left, right), m).second; }
  const Merge* find(int32_t left, int32_t right) const {
    const auto it = map_.find(key(left, right));
    return it == map_.end() ? nullptr : &it->second;
  }
  void reserve(size_t n) { map_.reserve(n); }

 private:
  static uint64_t key(int32_t left, int32_t right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }
  std::unordered_map<uint64_t, Merge> map_;
};

// Appends to `out` the ids `symbols` merge into. O(n log n) in the number of symbols.
void bpe_merge(std::span<const int32_t> symbols, const BpeMerges& merges, std::vector<int32_t>& out);

}  // namespace mhsa::text
