// text/regex.h — the regular expressions of tokenizer.json (the `Split` pre-tokenizer, `Replace`
// normalizers), matched as Hugging Face tokenizers' Oniguruma matches them: leftmost-first
// backtracking over Unicode code points. The subset is what GPT-2's, Llama 3's, Qwen2's and
// their relatives' patterns use: literals, `.`, classes `[...]`/`[^...]` with ranges, `\s \S \d
// \D`, `\p{..}`/`\P{..}` of general categories (L, Lu, ..., N, P, S, M, Z, C and their long
// names), groups `(...)` `(?:...)` `(?i:...)` `(?i)`, lookahead `(?=...)` `(?!...)`, the anchor
// `$` (Oniguruma's: the end of the text or before a "\n"; DeepSeek LLM's `\s+$`), the quantifiers
// `? * + {n} {n,} {n,m}` greedy or lazy, and alternation. Anything else (`^` and the other anchors,
// lookbehind, backreferences, `\w`, scripts, possessive quantifiers, other flags) is refused at
// compile time with an mhsa::Error naming the construct. Matching is bounded: a pattern that
// backtracks past a step budget is an error, never a hang. Not a general regex library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/unicode_data.h"

namespace mhsa::text {

// One character of the text: a code point with its properties, or a byte that is not valid
// UTF-8 (cp = 0x110000 + the byte, category Cn, not white space).
struct Unit {
  char32_t cp;
  uint32_t offset;  // of its first byte in the text
  Category cat;
  bool space;
};
// The characters of `text` into `out` (replacing its contents); text.size() < 2^32.
void decode_units(std::string_view text, std::vector<Unit>& out);

class Regex {
 public:
  // Throws mhsa::Error "<fn>: <arg>: expected a regex of the supported subset, got ..." naming
  // the construct and its place.
  Regex(std::string_view pattern, std::string_view fn, std::string_view arg);

  // Appends every match in `units` to `out`, in order, as [begin, end) indices (empty ones
  // included, as cut points; none right after the previous match). Throws mhsa::Error when the
  // backtracking exceeds its budget.
  void find_all(std::span<const Unit> units, std::vector<std::pair<size_t, size_t>>& out) const;
  // The same through the general matcher only (for tests: find_all takes a direct path, with no
  // continuations, when every node is of the shapes it knows; both must agree exactly).
  void find_all_ref(std::span<const Unit> units, std::vector<std::pair<size_t, size_t>>& out) const;
  // Every match in `text` as byte ranges, appended to `out`: through a hand-written scanner of
  // the bytes (unicode_data.h's pretoken_end, split_pretoken_end) when the pattern is GPT-2's,
  // Llama 3's or Qwen2's, recognised by its exact text, else through find_all on the text's
  // characters (decoded into `units`, scratch).
  void find_all(std::string_view text, std::vector<Unit>& units, std::vector<std::pair<size_t, size_t>>& out) const;
  // That scanner, or null: the end of the match at a byte position (every position starts one).
  using Scanner = size_t (*)(std::string_view text, size_t begin);
  Scanner scanner() const { return scanner_; }

  struct Item {
    enum class Kind : uint8_t { categories, space, range } kind;
    bool negated;
    uint32_t categories;  // a bit per Category
    char32_t first, last;
  };
  struct Set {
    std::vector<Item> items;
    bool negated = false;
    uint64_t ascii[2] = {0, 0};  // the answer for code points below 128
  };
  enum class Op : uint8_t { set, seq, alt, repeat, look_ahead, negative_look_ahead, end_of_line };
  struct Node {
    Op op;
    int set = -1;           // Op::set
    std::vector<int> kids{};  // seq, alt: the parts; repeat, look-aheads: one
    int min = 1, max = 1;   // repeat; max -1: unbounded
    bool greedy = true;
    // What can start a match of the node (set after parsing, for skipping alternatives): when
    // not nullable (it cannot match empty), a code point below 128 must be in first_ascii and any
    // other character must match one of first_sets (anything may, with first_any).
    bool nullable = false, first_any = false;
    uint64_t first_ascii[2] = {0, 0};
    std::vector<int> first_sets{};
    // An alternation of at most 64 parts: for each code point below 128, a bit per part that
    // can_start() there (so the direct path tests one word instead of each part); else empty.
    std::vector<uint64_t> ascii_kids{};
  };

 private:
  friend class Matcher;
  void compute_first_sets();
  bool direct_tail(int id) const;
  bool direct_step(int id) const;
  void find_all(std::span<const Unit> units, std::vector<std::pair<size_t, size_t>>& out, bool direct) const;
  bool can_start(const Node& n, std::span<const Unit> units, size_t pos) const;
  std::vector<Node> nodes_;
  std::vector<Set> sets_;
  int root_ = -1;
  bool direct_ = false;  // the root is direct_tail(): matched without continuations
  Scanner scanner_ = nullptr;
  friend class RegexParser;
};

}  // namespace mhsa::text
