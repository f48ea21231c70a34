// text/bpe.cpp — byte-pair merging of one pre-token (see bpe.h). Symbols form a linked list over
// the positions of the initial symbols (a merge keeps the left one's position) and candidate
// pairs sit in a heap; a candidate whose pair has changed since it was pushed is skipped when it
// surfaces. O(n log n), so a megabyte with no spaces is one pre-token and still quick. The list
// and the heap live in buffers of the calling thread, reused (unless a huge piece grew them): no
// allocation per word.
#include "text/bpe.h"

#include <algorithm>
#include <bit>
#include <functional>

namespace mhsa::text {

void BpeMerges::reserve(size_t n) {
  size_t size = entries_.size();
  while (size < 2 * n) size *= 2;
  if (size == entries_.size()) return;
  std::vector<Entry> old(size);
  old.swap(entries_);
  mask_ = size - 1;
  shift_ = 64 - std::countr_zero(size);
  for (const Entry& e : old)
    if (e.key != kEmpty) {
      size_t i = slot(e.key);
      while (entries_[i].key != kEmpty) i = (i + 1) & mask_;
      entries_[i] = e;
    }
}

bool BpeMerges::add(int32_t left, int32_t right, Merge m) {
  if (find(left, right)) return false;
  reserve(count_ + 1);
  const uint64_t k = key(left, right);
  size_t i = slot(k);
  while (entries_[i].key != kEmpty) i = (i + 1) & mask_;
  entries_[i] = {k, m};
  ++count_;
  return true;
}

// The longest pieces whose buffers a thread keeps for the next.
constexpr size_t kKeptSymbols = size_t{1} << 16;

void bpe_merge(std::span<const int32_t> symbols, const BpeMerges& merges, std::vector<int32_t>& out) {
  const auto n = static_cast<int32_t>(symbols.size());
  if (n == 0) return;
  struct Symbol {
    int32_t id, prev, next;  // id -1: merged into its left neighbour; prev/next -1: none
  };
  thread_local std::vector<Symbol> sym;
  thread_local std::vector<uint64_t> heap;  // a min-heap (std::greater)
  sym.resize(static_cast<size_t>(n));
  heap.clear();
  for (int32_t i = 0; i < n; ++i) sym[static_cast<size_t>(i)] = {symbols[static_cast<size_t>(i)], i - 1, i + 1 < n ? i + 1 : -1};
  // A candidate is rank << 32 | left position, so the smallest is the lowest rank, leftmost.
  // Ranks name pairs uniquely: a candidate is current iff its position still starts a pair
  // with that rank.
  const auto push = [&](int32_t pos) {
    const int32_t next = sym[static_cast<size_t>(pos)].next;
    if (next < 0) return false;
    const BpeMerges::Merge* m = merges.find(sym[static_cast<size_t>(pos)].id, sym[static_cast<size_t>(next)].id);
    if (m) heap.push_back(static_cast<uint64_t>(m->rank) << 32 | static_cast<uint32_t>(pos));
    return m != nullptr;
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  std::make_heap(heap.begin(), heap.end(), std::greater<>{});  // O(n)
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
    const uint64_t c = heap.back();
    heap.pop_back();
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
    if (s.prev >= 0 && push(s.prev)) std::push_heap(heap.begin(), heap.end(), std::greater<>{});
    if (push(pos)) std::push_heap(heap.begin(), heap.end(), std::greater<>{});
  }
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) out.push_back(sym[static_cast<size_t>(i)].id);
  if (sym.capacity() > kKeptSymbols) sym = {}, heap = {};  // a huge piece's buffers are not kept
}

}  // namespace mhsa::text
