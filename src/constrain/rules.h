// constrain/rules.h — a grammar as rules over bytes (what the GBNF parser makes and the matcher
// walks), and the pushdown matcher with its lazily built transition table. Not public: see
// mhsa/grammar.h.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace mhsa::detail {

// Limits that keep hostile grammars bounded in time and memory.
constexpr int64_t kMaxRepeat = 10000;        // m and n of x{m,n}
constexpr size_t kMaxElements = 1u << 20;    // elements of all rules together
constexpr int kMaxNesting = 100;             // nested groups in GBNF text

struct ByteSet {
  uint64_t w[4] = {};
  bool has(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1; }
  void add(uint8_t b) { w[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(unsigned lo, unsigned hi) {
    for (unsigned b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
  }
};

struct GrammarRules {
  enum Kind : uint8_t { bytes, rule, end };
  struct Element {
    Kind kind;
    uint32_t arg;  // bytes: index into sets; rule: the rule's index
  };
  std::vector<Element> elements;                    // each alternative's elements, then an `end`
  std::vector<ByteSet> sets;
  std::vector<std::vector<uint32_t>> alternatives;  // per rule: where each alternative starts
  std::vector<std::string> names;                   // per rule ("" for groups the parser made)
  uint32_t root = 0;
};

GrammarRules parse_gbnf(std::string_view text, std::string_view source);
std::string schema_to_gbnf(std::string_view schema_json, std::string_view source);

// The vocabulary's byte strings as a trie, laid out flat: node n's children are edges
// [first_edge[n], first_edge[n + 1]) (byte, child), its tokens [first_token[n], first_token[n + 1]).
struct VocabularyTrie {
  std::vector<uint32_t> first_edge, first_token;
  std::vector<uint8_t> edge_byte;
  std::vector<uint32_t> edge_node;
  std::vector<int32_t> tokens;
};

// The pushdown automaton of a grammar over bytes. A stack is a chain of interned nodes (the
// position of the element to match next, and the node to return to), so equal stacks are one
// id; a state is a set of stacks (the alternatives still alive) plus whether the bytes so far
// are a sentence, interned too, so the transition on a byte is a table entry computed once.
// Positions after a rule reference that ends its alternative are not pushed (a tail call), so
// `x*`'s right recursion keeps the stack flat.
class ByteMatcher {
 public:
  static constexpr int32_t kDead = -1;
  explicit ByteMatcher(const GrammarRules& g);
  int32_t start() const { return 0; }
  int32_t step(int32_t state, uint8_t byte) {
    const int32_t t = next_[static_cast<size_t>(state)][byte];
    if (t != kUnknown) return t;
    const int32_t computed = compute(state, byte);  // (may grow next_)
    next_[static_cast<size_t>(state)][byte] = computed;
    return computed;
  }
  bool accepting(int32_t state) const { return states_[static_cast<size_t>(state)].accept; }
  bool live(int32_t state) const { return !states_[static_cast<size_t>(state)].stacks.empty(); }
  size_t state_count() const { return states_.size(); }
  // When the tables pass their bound: forgets every state but `keep` (which becomes state 1,
  // state 0 staying the start), returns keep's new id.
  int32_t compact(int32_t keep);
  bool needs_compaction() const { return nodes_.size() > kMaxNodes || states_.size() > kMaxStates; }

 private:
  static constexpr int32_t kUnknown = -2;
  static constexpr size_t kMaxNodes = 1u << 20, kMaxStates = 1u << 15;
  struct Node {
    uint32_t pos;
    int32_t parent;  // -1: the bottom of the stack
  };
  struct State {
    std::vector<int32_t> stacks;  // node ids, ascending
    bool accept = false;
  };
  int32_t node(uint32_t pos, int32_t parent);
  void closure(uint32_t pos, int32_t parent, std::vector<int32_t>& stacks, bool& accept);
  int32_t intern(State s);
  int32_t compute(int32_t state, uint8_t byte);
  std::vector<std::vector<uint32_t>> stack_positions(int32_t state) const;

  const GrammarRules* g_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<State> states_;
  std::unordered_map<std::string, int32_t> state_ids_;
  std::vector<std::array<int32_t, 256>> next_;
  std::vector<std::pair<uint32_t, int32_t>> work_;  // closure's worklist
  size_t visited_ = 0;                               // closures' steps in this transition
  static constexpr size_t kLinearSeen = 32;
  std::vector<uint64_t> seen_;                       // closure's visited (pos, parent) pairs,
  std::unordered_set<uint64_t> seen_set_;            // and in a set past kLinearSeen of them
};

}  // namespace mhsa::detail
