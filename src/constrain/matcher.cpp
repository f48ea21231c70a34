// constrain/matcher.cpp — the pushdown matcher over bytes (rules.h), the vocabulary's trie, and
// the token masks made by walking the trie against the matcher (mhsa/grammar.h).
//
// Why it is fast: a state's transition on a byte is computed once and kept (a lazily built DFA
// over sets of stacks), so walking the trie costs one table read per trie edge visited, and a
// subtree is left the moment its prefix is dead; a state's mask is kept too, so the states a
// JSON text keeps returning to (inside a string, between values) cost a copy. Measured in
// docs/performance.md (bench/grammar.py).
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "constrain/rules.h"
#include "core/check.h"
#include "mhsa/error.h"
#include "mhsa/grammar.h"
#include "mhsa/tokenizer.h"

namespace mhsa {
namespace detail {

namespace {
constexpr size_t kMaxClosure = 1u << 16;  // closure steps one transition may take: an ambiguity bound
constexpr size_t kMaxCachedMasks = 512;
}  // namespace

ByteMatcher::ByteMatcher(const GrammarRules& g) : g_(&g) {
  visited_ = 0;
  State s;
  for (const uint32_t a : g.alternatives[g.root]) closure(a, -1, s.stacks, s.accept);
  intern(std::move(s));
}

int32_t ByteMatcher::node(uint32_t pos, int32_t parent) {
  const uint64_t key = uint64_t{pos} << 32 | static_cast<uint32_t>(parent);
  const auto [it, added] = node_ids_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (added) nodes_.push_back({pos, parent});
  return it->second;
}

// Every stack reachable from (pos, parent) without matching a byte: rule references expanded into
// their alternatives, finished alternatives popped; the stacks whose top is a byte set are kept,
// and an empty stack means the bytes so far are a sentence.
void ByteMatcher::closure(uint32_t pos, int32_t parent, std::vector<int32_t>& stacks, bool& accept) {
  work_.clear();
  if (seen_.size() >= kLinearSeen) seen_set_.clear();
  seen_.clear();
  work_.emplace_back(pos, parent);
  while (!work_.empty()) {
    auto [p, par] = work_.back();
    work_.pop_back();
    const uint64_t key = uint64_t{p} << 32 | static_cast<uint32_t>(par);
    if (seen_.size() < kLinearSeen) {  // most closures are a handful of stacks: a scan
      if (std::find(seen_.begin(), seen_.end(), key) != seen_.end()) continue;
      seen_.push_back(key);
      if (seen_.size() == kLinearSeen) seen_set_.insert(seen_.begin(), seen_.end());
    } else if (!seen_set_.insert(key).second) {
      continue;
    }
    if (++visited_ > kMaxClosure)  // counted over a whole transition (all its stacks' closures)
      throw Error(message("grammar: too ambiguous (over ", kMaxClosure, " alternatives alive at once)"));
    const GrammarRules::Element e = g_->elements[p];
    if (e.kind == GrammarRules::bytes) {
      stacks.push_back(node(p, par));
    } else if (e.kind == GrammarRules::end) {
      if (par < 0) {
        accept = true;
      } else {
        const Node n = nodes_[static_cast<size_t>(par)];
        work_.emplace_back(n.pos, n.parent);
      }
    } else {
      // A tail call (the reference ends its alternative) returns straight to the caller's parent.
      const int32_t ret = g_->elements[p + 1].kind == GrammarRules::end ? par : node(p + 1, par);
      for (const uint32_t a : g_->alternatives[e.arg]) work_.emplace_back(a, ret);
    }
  }
}

int32_t ByteMatcher::intern(State s) {
  std::sort(s.stacks.begin(), s.stacks.end());
  s.stacks.erase(std::unique(s.stacks.begin(), s.stacks.end()), s.stacks.end());
  std::string key(s.stacks.size() * sizeof(int32_t) + 1, '\0');
  key[0] = s.accept ? 1 : 0;
  if (!s.stacks.empty()) std::memcpy(key.data() + 1, s.stacks.data(), s.stacks.size() * sizeof(int32_t));
  const auto [it, added] = state_ids_.emplace(std::move(key), static_cast<int32_t>(states_.size()));
  if (added) {
    states_.push_back(std::move(s));
    next_.emplace_back();
    next_.back().fill(kUnknown);
  }
  return it->second;
}

int32_t ByteMatcher::compute(int32_t state, uint8_t byte) {
  visited_ = 0;
  State out;
  const std::vector<int32_t> stacks = states_[static_cast<size_t>(state)].stacks;  // (states_ may grow)
  for (const int32_t id : stacks) {
    const Node n = nodes_[static_cast<size_t>(id)];
    if (g_->sets[g_->elements[n.pos].arg].has(byte)) closure(n.pos + 1, n.parent, out.stacks, out.accept);
  }
  if (out.stacks.empty() && !out.accept) return kDead;
  return intern(std::move(out));
}

std::vector<std::vector<uint32_t>> ByteMatcher::stack_positions(int32_t state) const {
  std::vector<std::vector<uint32_t>> out;
  for (int32_t id : states_[static_cast<size_t>(state)].stacks) {
    std::vector<uint32_t> stack;
    for (; id >= 0; id = nodes_[static_cast<size_t>(id)].parent) stack.push_back(nodes_[static_cast<size_t>(id)].pos);
    out.push_back(std::move(stack));
  }
  return out;
}

int32_t ByteMatcher::compact(int32_t keep) {
  const std::vector<std::vector<uint32_t>> stacks = stack_positions(keep);
  const bool accept = states_[static_cast<size_t>(keep)].accept;
  nodes_.clear();
  node_ids_.clear();
  states_.clear();
  state_ids_.clear();
  next_.clear();
  State start;
  visited_ = 0;
  for (const uint32_t a : g_->alternatives[g_->root]) closure(a, -1, start.stacks, start.accept);
  intern(std::move(start));
  State s;
  s.accept = accept;
  for (const std::vector<uint32_t>& stack : stacks) {
    int32_t parent = -1;
    for (size_t k = stack.size(); k-- > 0;) parent = node(stack[k], parent);
    s.stacks.push_back(parent);
  }
  return intern(std::move(s));
}

}  // namespace detail

using detail::ByteMatcher;
using detail::fail;
using detail::GrammarRules;
using detail::message;

// ---- Grammar -------------------------------------------------------------------------------------

Grammar Grammar::from_gbnf(std::string_view text, std::string_view source) {
  return Grammar(std::make_shared<const GrammarRules>(detail::parse_gbnf(text, source)));
}

Grammar Grammar::from_json_schema(std::string_view schema_json, std::string_view source) {
  const std::string gbnf = detail::schema_to_gbnf(schema_json, source);
  return from_gbnf(gbnf, message(source, " (as GBNF)"));
}

std::string Grammar::json_schema_to_gbnf(std::string_view schema_json, std::string_view source) {
  return detail::schema_to_gbnf(schema_json, source);
}

Grammar Grammar::json_object() {
  static const Grammar g = from_json_schema(R"({"type": "object"})", "json_object");
  return g;
}

bool Grammar::accepts(std::string_view bytes) const {
  ByteMatcher m(*rules_);
  int32_t s = m.start();
  for (const char c : bytes)
    if ((s = m.step(s, static_cast<uint8_t>(c))) < 0) return false;
  return m.accepting(s);
}

bool Grammar::accepts_prefix(std::string_view bytes) const {
  ByteMatcher m(*rules_);
  int32_t s = m.start();
  for (const char c : bytes)
    if ((s = m.step(s, static_cast<uint8_t>(c))) < 0) return false;
  return true;
}

// ---- TokenVocabulary -----------------------------------------------------------------------------

TokenVocabulary::TokenVocabulary(const std::vector<std::string>& bytes, std::span<const int32_t> end_ids)
    : size_(static_cast<int64_t>(bytes.size())), bytes_(bytes) {
  for (const int32_t id : end_ids) {
    if (id < 0 || id >= size_)
      fail("TokenVocabulary", "end_ids", message("token ids in [0, ", size_, ")"), std::to_string(id));
    if (std::find(end_ids_.begin(), end_ids_.end(), id) == end_ids_.end()) end_ids_.push_back(id);
  }
  // The trie: token ids sorted by their bytes, so each node's children come in byte order and
  // a node's subtree is contiguous; nodes numbered depth-first.
  std::vector<int32_t> order;
  for (int32_t id = 0; id < static_cast<int32_t>(size_); ++id)
    if (!bytes_[static_cast<size_t>(id)].empty() && std::find(end_ids_.begin(), end_ids_.end(), id) == end_ids_.end())
      order.push_back(id);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return bytes_[static_cast<size_t>(a)] < bytes_[static_cast<size_t>(b)]; });
  struct Building {
    std::vector<std::pair<uint8_t, uint32_t>> children;
    std::vector<int32_t> tokens;
  };
  std::vector<Building> nodes(1);
  for (const int32_t id : order) {
    uint32_t n = 0;
    for (const char c : bytes_[static_cast<size_t>(id)]) {
      const uint8_t b = static_cast<uint8_t>(c);
      auto& ch = nodes[n].children;
      if (!ch.empty() && ch.back().first == b) {  // sorted input: a shared prefix is the last child
        n = ch.back().second;
      } else {
        ch.emplace_back(b, static_cast<uint32_t>(nodes.size()));
        n = static_cast<uint32_t>(nodes.size());
        nodes.emplace_back();
      }
    }
    nodes[n].tokens.push_back(id);
  }
  auto trie = std::make_unique<detail::VocabularyTrie>();
  trie->first_edge.reserve(nodes.size() + 1);
  trie->first_token.reserve(nodes.size() + 1);
  for (const Building& n : nodes) {
    trie->first_edge.push_back(static_cast<uint32_t>(trie->edge_byte.size()));
    trie->first_token.push_back(static_cast<uint32_t>(trie->tokens.size()));
    for (const auto& [b, child] : n.children) {
      trie->edge_byte.push_back(b);
      trie->edge_node.push_back(child);
    }
    trie->tokens.insert(trie->tokens.end(), n.tokens.begin(), n.tokens.end());
  }
  trie->first_edge.push_back(static_cast<uint32_t>(trie->edge_byte.size()));
  trie->first_token.push_back(static_cast<uint32_t>(trie->tokens.size()));
  trie_ = std::move(trie);
}

TokenVocabulary::~TokenVocabulary() = default;

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const Tokenizer& tokenizer, int64_t vocab_size,
                                                                      std::span<const int32_t> end_ids) {
  if (vocab_size <= 0) fail("TokenVocabulary::from_tokenizer", "vocab_size", "a count > 0", std::to_string(vocab_size));
  std::vector<std::string> bytes(static_cast<size_t>(vocab_size));
  const int32_t known = std::min<int64_t>(tokenizer.vocab_size(), vocab_size);
  for (int32_t id = 0; id < known; ++id)
    if (!tokenizer.is_special(id)) bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(id);
  std::vector<int32_t> ends;
  for (const int32_t id : tokenizer.eos_ids())
    if (id >= 0 && id < vocab_size) ends.push_back(id);
  for (const int32_t id : end_ids)
    if (id >= 0 && id < vocab_size) ends.push_back(id);
  return std::make_shared<const TokenVocabulary>(bytes, ends);
}

// ---- Constraint and its states -------------------------------------------------------------------

Constraint::Constraint(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocabulary)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {
  if (!vocabulary_) fail("Constraint", "vocabulary", "a vocabulary", "null");
}

ConstraintState Constraint::start() const { return ConstraintState(*this); }

namespace detail {
// The matcher with the masks of states already seen (its own: a state id means nothing to another).
struct MaskCache {
  std::unordered_map<int32_t, std::vector<uint64_t>> masks;
  std::vector<uint64_t> current;
  int32_t current_state = -1;
};
}  // namespace detail

ConstraintState::ConstraintState(const Constraint& c)
    : constraint_(&c), matcher_(std::make_unique<ByteMatcher>(c.grammar().rules())), cache_(std::make_unique<detail::MaskCache>()) {}
ConstraintState::ConstraintState(ConstraintState&&) noexcept = default;
ConstraintState& ConstraintState::operator=(ConstraintState&&) noexcept = default;
ConstraintState::ConstraintState(const ConstraintState& o)
    : constraint_(o.constraint_),
      matcher_(std::make_unique<ByteMatcher>(*o.matcher_)),
      cache_(std::make_unique<detail::MaskCache>(*o.cache_)),
      state_(o.state_),
      ended_(o.ended_) {}
ConstraintState::~ConstraintState() = default;

int64_t ConstraintState::size() const { return constraint_->vocabulary().size(); }
bool ConstraintState::complete() const { return ended_ || matcher_->accepting(state_); }

const std::vector<uint64_t>& ConstraintState::allowed() {
  detail::MaskCache& c = *cache_;
  if (c.current_state == state_ && !c.current.empty()) return c.current;
  if (matcher_->needs_compaction()) {
    state_ = matcher_->compact(state_);
    c.masks.clear();
  }
  const TokenVocabulary& v = constraint_->vocabulary();
  const size_t words = static_cast<size_t>((v.size() + 63) / 64);
  c.current_state = state_;
  if (const auto hit = c.masks.find(state_); hit != c.masks.end()) {
    c.current = hit->second;
    return c.current;
  }
  std::vector<uint64_t>& mask = c.current;
  mask.assign(words, 0);
  bool any = false;
  if (!ended_ && matcher_->live(state_)) {
    // Depth-first over the trie, each node with the matcher's state after its bytes.
    const detail::VocabularyTrie& t = v.trie();
    std::vector<std::pair<uint32_t, int32_t>> todo{{0u, state_}};
    while (!todo.empty()) {
      const auto [n, s] = todo.back();
      todo.pop_back();
      for (uint32_t e = t.first_edge[n]; e < t.first_edge[n + 1]; ++e) {
        const int32_t next = matcher_->step(s, t.edge_byte[e]);
        if (next < 0) continue;
        const uint32_t child = t.edge_node[e];
        for (uint32_t k = t.first_token[child]; k < t.first_token[child + 1]; ++k) {
          const int32_t id = t.tokens[k];
          mask[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
          any = true;
        }
        if (t.first_edge[child] < t.first_edge[child + 1] && matcher_->live(next)) todo.emplace_back(child, next);
      }
    }
  }
  // The end tokens where the text is complete, or where nothing else fits (so generation stops).
  if (ended_ || matcher_->accepting(state_) || !any)
    for (const int32_t id : v.end_ids()) mask[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
  if (c.masks.size() >= detail::kMaxCachedMasks) c.masks.clear();
  c.masks.emplace(state_, mask);
  return mask;
}

void ConstraintState::mask(std::span<float> logits) {
  const std::vector<uint64_t>& bits = allowed();
  const size_t V = std::min(logits.size(), static_cast<size_t>(size()));
  constexpr float kOff = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w * 64 < V; ++w) {
    const uint64_t word = bits[w];
    if (word == ~uint64_t{0}) continue;
    const size_t end = std::min(V, w * 64 + 64);
    for (size_t i = w * 64; i < end; ++i)
      if (!((word >> (i - w * 64)) & 1)) logits[i] = kOff;
  }
  for (size_t i = V; i < logits.size(); ++i) logits[i] = kOff;
}

void ConstraintState::advance(int32_t token) {
  if (!allows(token))
    fail("ConstraintState::advance", "token", "a token the grammar allows here", std::to_string(token));
  const TokenVocabulary& v = constraint_->vocabulary();
  if (std::find(v.end_ids().begin(), v.end_ids().end(), token) != v.end_ids().end()) {
    ended_ = true;
    cache_->current_state = -1;
    return;
  }
  for (const char b : v.bytes(token)) state_ = matcher_->step(state_, static_cast<uint8_t>(b));
}

}  // namespace mhsa
