// text/bpe.cpp — byte-pair merging of one pre-token (see bpe.h). Symbols form a linked list over
// the positions of the initial symbols (a merge keeps the left one's position) and candidate
// pairs sit in a heap; a candidate whose pair has changed since it was pushed is skipped when it
// surfaces. O(n log n), so a megabyte with no spaces is one pre-token and still quick.
#include "text/bpe.h"

#include <functional>
#include <optional>
#include <queue>

namespace mhsa::text {

void bpe_merge(std::span<const int32_t> symbols, const BpeMerges& merges, std::vector<int32_t>& out) {
  const auto n = static_cast<int32_t>(symbols.size());
  if (n == 0) return;
  struct Symbol {
    int32_t id, prev, next;  // id -1: merged into its left neighbour; prev/next -1: none
  };
  std::vector<Symbol> sym(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) sym[static_cast<size_t>(i)] = {symbols[static_cast<size_t>(i)], i - 1, i + 1 < n ? i + 1 : -1};
  // A candidate is rank << 32 | left position, so the smallest is the lowest rank, leftmost.
  // Ranks name pairs uniquely: a candidate is current iff its position still starts a pair
  // with that rank.
  const auto candidate = [&](int32_t pos) -> std::optional<uint64_t> {
    const int32_t next = sym[static_cast<size_t>(pos)].next;
    if (next < 0) return std::nullopt;
    const BpeMerges::Merge* m = merges.find(sym[static_cast<size_t>(pos)].id, sym[static_cast<size_t>(next)].id);
    if (!m) return std::nullopt;
    return static_cast<uint64_t>(m->rank) << 32 | static_cast<uint32_t>(pos);
  };
  std::vector<uint64_t> initial;
  for (int32_t i = 0; i + 1 < n; ++i)
    if (const auto c = candidate(i)) initial.push_back(*c);
  std::priority_queue heap(std::greater<>{}, std::move(initial));  // heapified in O(n)
  while (!heap.empty()) {
    const uint64_t c = heap.top();
    heap.pop();
    const auto pos = static_cast<int32_t>(c & 0xFFFFFFFFu), rank = static_cast<int32_t>(c >> 32);
    Symbol& s = sym[static_cast<size_t>(pos)];
    if (s.id < 0 || s.next < 0) continue;  // stale
    const BpeMerges::Merge* m = merges.find(s.id, sym[static_cast<size_t>(s.next)].id);
    if (!m || m->rank != rank) continue;   // stale
    Symbol& gone = sym[static_cast<size_t>(s.next)];
    s.id = m->id;
    s.next = gone.next;
    if (s.next >= 0) sym[static_cast<size_t>(s.next)].prev = pos;
    gone.id = -1;
    if (s.prev >= 0)
      if (const auto left = candidate(s.prev)) heap.push(*left);
    if (const auto right = candidate(pos)) heap.push(*right);
  }
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) out.push_back(sym[static_cast<size_t>(i)].id);
}

}  // namespace mhsa::text
