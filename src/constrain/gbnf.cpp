// constrain/gbnf.cpp — llama.cpp's GBNF grammar syntax parsed into rules over bytes (rules.h), and
// the checks that make matching terminate: every rule defined, none left-recursive, sizes bounded.
// Character classes are over code points and become UTF-8 byte sequences here, so the matcher
// only ever sees bytes. Not a GBNF printer.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "constrain/rules.h"
#include "core/check.h"
#include "mhsa/error.h"

namespace mhsa::detail {

namespace {

using Element = GrammarRules::Element;
using Sequence = std::vector<Element>;
using Alternatives = std::vector<Sequence>;

struct Range {
  uint32_t lo, hi;  // code points, inclusive
};

void utf8_encode(uint32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

int utf8_length(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

// [lo, hi] (one UTF-8 length, no surrogates) as sequences of byte ranges, each sequence's bytes
// spanning whole ranges of continuation bytes past its first varying one (Russ Cox's split).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  utf8_encode(lo, a);
  utf8_encode(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t k = 0; k < a.size(); ++k) seq.emplace_back(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k]));
  out.push_back(std::move(seq));
}

class Parser {
 public:
  Parser(std::string_view text, std::string_view source) : s_(text), source_(source) {}

  GrammarRules parse() {
    skip(true);
    while (i_ < s_.size()) {
      const size_t at = i_;
      const std::string name = parse_name();
      skip(false);
      if (s_.substr(i_, 3) != "::=") error(i_, "expected '::=' after rule name '" + name + "'");
      i_ += 3;
      const uint32_t r = rule_of(name, at);
      if (defined_[r]) error(at, "rule '" + name + "' is defined twice");
      defined_[r] = 1;
      rules_[r] = parse_alternatives(0);
      skip(true);
    }
    const auto root = ids_.find("root");
    if (root == ids_.end() || !defined_[root->second]) error(s_.size(), "no rule named 'root' (the start rule)");
    for (size_t r = 0; r < rules_.size(); ++r)
      if (!defined_[r]) error(first_use_[r], "rule '" + names_[r] + "' is used but not defined");
    return finish(root->second);
  }

 private:
  [[noreturn]] void error(size_t at, const std::string& what) const {
    at = std::min(at, s_.size());
    size_t line = 1, column = 1;
    for (size_t k = 0; k < at; ++k) {
      if (s_[k] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw Error(message(source_, ":", line, ":", column, ": ", what));
  }

  void count(size_t n) {
    elements_ += n;
    if (elements_ > kMaxElements) error(i_, message("the grammar is too large (over ", kMaxElements, " elements)"));
  }

  // Spaces, tabs, comments; newlines too where `newlines`.
  void skip(bool newlines) {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++i_;
      } else if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else {
        break;
      }
    }
  }

  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }

  std::string parse_name() {
    const size_t at = i_;
    while (i_ < s_.size() && name_char(s_[i_])) ++i_;
    if (i_ == at) error(at, i_ < s_.size() ? message("expected a rule name, got '", s_[i_], "'") : "expected a rule name");
    return std::string(s_.substr(at, i_ - at));
  }

  // Whether a new rule (`name ::=`) starts at i_.
  bool at_rule_start() const {
    size_t k = i_;
    while (k < s_.size() && name_char(s_[k])) ++k;
    if (k == i_) return false;
    while (k < s_.size() && (s_[k] == ' ' || s_[k] == '\t')) ++k;
    return s_.substr(k, 3) == "::=";
  }

  uint32_t rule_of(const std::string& name, size_t at) {
    const auto [it, added] = ids_.emplace(name, static_cast<uint32_t>(rules_.size()));
    if (added) {
      rules_.emplace_back();
      names_.push_back(name);
      defined_.push_back(0);
      first_use_.push_back(at);
    }
    return it->second;
  }

  uint32_t new_rule(Alternatives alts) {
    rules_.push_back(std::move(alts));
    names_.emplace_back();
    defined_.push_back(1);
    first_use_.push_back(i_);
    return static_cast<uint32_t>(rules_.size() - 1);
  }

  Element set_element(const ByteSet& set) {
    sets_.push_back(set);
    count(1);
    return {GrammarRules::bytes, static_cast<uint32_t>(sets_.size() - 1)};
  }
  Element byte_element(uint8_t b) {
    ByteSet set;
    set.add(b);
    return set_element(set);
  }

  Alternatives parse_alternatives(int depth) {
    if (depth > kMaxNesting) error(i_, message("groups nested deeper than ", kMaxNesting));
    Alternatives alts;
    alts.push_back(parse_sequence(depth));
    while (i_ < s_.size() && s_[i_] == '|') {
      ++i_;
      alts.push_back(parse_sequence(depth));
    }
    return alts;
  }

  Sequence parse_sequence(int depth) {
    Sequence seq;
    for (;;) {
      skip(true);
      if (i_ >= s_.size() || s_[i_] == '|' || s_[i_] == ')' || at_rule_start()) return seq;
      const size_t at = i_;
      Sequence item = parse_primary(depth);
      skip(false);
      while (i_ < s_.size() && (s_[i_] == '*' || s_[i_] == '+' || s_[i_] == '?' || s_[i_] == '{'))
        item = parse_repeat(std::move(item), at);
      seq.insert(seq.end(), item.begin(), item.end());
    }
  }

  Sequence parse_primary(int depth) {
    const char c = s_[i_];
    if (c == '"') return parse_literal();
    if (c == '[') return parse_class();
    if (c == '.') {
      ++i_;
      return {class_element({{0, 0x10FFFF}})};
    }
    if (c == '(') {
      ++i_;
      Alternatives alts = parse_alternatives(depth + 1);
      skip(true);
      if (i_ >= s_.size() || s_[i_] != ')') error(i_, "expected ')' to close the group");
      ++i_;
      return {Element{GrammarRules::rule, new_rule(std::move(alts))}};
    }
    if (name_char(c)) {
      const size_t at = i_;
      const std::string name = parse_name();
      return {Element{GrammarRules::rule, rule_of(name, at)}};
    }
    error(i_, message("unexpected '", c, "'"));
  }

  // One character of a literal or class (escapes decoded; raw UTF-8 decoded in classes).
  uint32_t parse_char(bool in_class, bool& raw_byte) {
    raw_byte = false;
    if (i_ >= s_.size()) error(i_, in_class ? "unterminated character class" : "unterminated literal");
    const unsigned char c = static_cast<unsigned char>(s_[i_]);
    if (c == '\\') {
      if (i_ + 1 >= s_.size()) error(i_, "unterminated escape");
      const char e = s_[i_ + 1];
      i_ += 2;
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': return static_cast<uint32_t>(e);
        case 'x': return parse_hex(2);
        case 'u': return parse_hex(4);
        case 'U': return parse_hex(8);
        default: error(i_ - 2, message("unknown escape '\\", e, "'"));
      }
    }
    if (c < 0x80 || !in_class) {  // a literal keeps its bytes as they are
      ++i_;
      raw_byte = c >= 0x80;
      return c;
    }
    // A class's UTF-8 character, decoded to its code point.
    const int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || c > 0xF4 || i_ + static_cast<size_t>(n) > s_.size()) error(i_, "invalid UTF-8 in a character class");
    uint32_t cp = c & (0x7F >> n);
    for (int k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s_[i_ + static_cast<size_t>(k)]);
      if ((d & 0xC0) != 0x80) error(i_, "invalid UTF-8 in a character class");
      cp = cp << 6 | (d & 0x3F);
    }
    if (utf8_length(cp) != n || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) error(i_, "invalid UTF-8 in a character class");
    i_ += static_cast<size_t>(n);
    return cp;
  }

  uint32_t parse_hex(int digits) {
    const size_t at = i_;
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k, ++i_) {
      if (i_ >= s_.size()) error(at, message("expected ", digits, " hex digits"));
      const char h = s_[i_];
      const int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) error(i_, message("expected ", digits, " hex digits"));
      v = v << 4 | static_cast<uint32_t>(d);
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) error(at, "escape outside Unicode's code points");
    return v;
  }

  Sequence parse_literal() {
    ++i_;
    Sequence seq;
    while (i_ < s_.size() && s_[i_] != '"') {
      bool raw = false;
      const uint32_t cp = parse_char(false, raw);
      std::string bytes;
      if (raw)
        bytes += static_cast<char>(cp);  // a byte of the text's own UTF-8
      else
        utf8_encode(cp, bytes);
      for (const char b : bytes) seq.push_back(byte_element(static_cast<uint8_t>(b)));
    }
    if (i_ >= s_.size()) error(i_, "unterminated literal (expected '\"')");
    ++i_;
    return seq;
  }

  Sequence parse_class() {
    const size_t at = i_;
    ++i_;
    bool negate = false;
    if (i_ < s_.size() && s_[i_] == '^') {
      negate = true;
      ++i_;
    }
    std::vector<Range> ranges;
    while (i_ < s_.size() && s_[i_] != ']') {
      bool raw = false;
      const uint32_t lo = parse_char(true, raw);
      uint32_t hi = lo;
      if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
        ++i_;
        hi = parse_char(true, raw);
        if (hi < lo) error(at, "character range out of order");
      }
      ranges.push_back({lo, hi});
    }
    if (i_ >= s_.size()) error(at, "unterminated character class (expected ']')");
    ++i_;
    std::sort(ranges.begin(), ranges.end(), [](Range a, Range b) { return a.lo < b.lo; });
    if (negate) {
      std::vector<Range> rest;
      uint32_t from = 0;
      for (const Range r : ranges) {
        if (r.lo > from) rest.push_back({from, r.lo - 1});
        from = std::max(from, r.hi + 1);
      }
      if (from <= 0x10FFFF) rest.push_back({from, 0x10FFFF});
      ranges = std::move(rest);
    }
    if (ranges.empty()) error(at, "character class matches nothing");
    return {class_element(ranges)};
  }

  // Code point ranges as one element: a byte set where all are ASCII, else a rule whose
  // alternatives are the UTF-8 byte sequences (surrogates left out).
  Element class_element(const std::vector<Range>& ranges) {
    ByteSet ascii;
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> multi;
    for (Range r : ranges) {
      if (r.lo < 0x80) {
        ascii.add_range(r.lo, std::min<uint32_t>(r.hi, 0x7F));
        if (r.hi < 0x80) continue;
        r.lo = 0x80;
      }
      for (const auto [a, b] : {Range{0x80, 0x7FF}, Range{0x800, 0xD7FF}, Range{0xE000, 0xFFFF}, Range{0x10000, 0x10FFFF}}) {
        const uint32_t lo = std::max(a, r.lo), hi = std::min(b, r.hi);
        if (lo <= hi) utf8_sequences(lo, hi, multi);
      }
    }
    if (multi.empty()) return set_element(ascii);
    Alternatives alts;
    if (ascii.w[0] | ascii.w[1]) alts.push_back({set_element(ascii)});
    for (const auto& seq : multi) {
      Sequence s;
      for (const auto& [lo, hi] : seq) {
        ByteSet set;
        set.add_range(lo, hi);
        s.push_back(set_element(set));
      }
      alts.push_back(std::move(s));
    }
    return {GrammarRules::rule, new_rule(std::move(alts))};
  }

  int64_t parse_count() {
    const size_t at = i_;
    int64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      v = v * 10 + (s_[i_] - '0');
      if (v > kMaxRepeat) error(at, message("repetition count over the limit of ", kMaxRepeat));
      ++i_;
    }
    if (i_ == at) error(at, "expected a repetition count");
    return v;
  }

  // item followed by * + ? {m} {m,} {m,n}: rules that repeat it by right recursion (no stack
  // growth as it repeats: see ByteMatcher), nested optionals for an upper bound.
  Sequence parse_repeat(Sequence item, size_t at) {
    const char op = s_[i_++];
    int64_t m = 0, n = -1;  // n -1: no upper bound
    if (op == '+') m = 1;
    if (op == '?') n = 1;
    if (op == '{') {
      skip(false);
      m = parse_count();
      skip(false);
      n = m;
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        skip(false);
        n = i_ < s_.size() && s_[i_] == '}' ? -1 : parse_count();
        skip(false);
      }
      if (i_ >= s_.size() || s_[i_] != '}') error(i_, "expected '}' to close the repetition");
      ++i_;
      if (n >= 0 && n < m) error(at, message("repetition {", m, ",", n, "}: the maximum is below the minimum"));
    }
    Element x = item.size() == 1 ? item[0] : Element{GrammarRules::rule, new_rule({item})};
    count(static_cast<size_t>(m + std::max<int64_t>(n - m, 1) * 3));
    Sequence out(static_cast<size_t>(m), x);
    if (n < 0) {
      // star ::= x star | ""
      const uint32_t star = new_rule({});
      rules_[star] = {{x, Element{GrammarRules::rule, star}}, {}};
      out.push_back({GrammarRules::rule, star});
    } else if (n > m) {
      // opt_1 ::= x | "";  opt_k ::= x opt_{k-1} | ""
      uint32_t opt = new_rule({{x}, {}});
      for (int64_t k = 2; k <= n - m; ++k) opt = new_rule({{x, Element{GrammarRules::rule, opt}}, {}});
      out.push_back({GrammarRules::rule, opt});
    }
    return out;
  }

  GrammarRules finish(uint32_t root) {
    GrammarRules g;
    g.root = root;
    g.sets = std::move(sets_);
    g.names = std::move(names_);
    g.alternatives.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (rules_[r].empty()) rules_[r].emplace_back();
      for (const Sequence& seq : rules_[r]) {
        g.alternatives[r].push_back(static_cast<uint32_t>(g.elements.size()));
        g.elements.insert(g.elements.end(), seq.begin(), seq.end());
        g.elements.push_back({GrammarRules::end, 0});
      }
    }
    if (g.elements.size() > kMaxElements) error(s_.size(), message("the grammar is too large (over ", kMaxElements, " elements)"));
    check_left_recursion(g);
    return g;
  }

  std::string rule_label(const GrammarRules& g, uint32_t r) const {
    return g.names[r].empty() ? message("a group in rule at offset ", first_use_[r]) : "rule '" + g.names[r] + "'";
  }

  // Left recursion (a rule that can reach itself before matching a byte) would make the matcher's
  // closure push forever: refused, naming a rule on the cycle. Linear: nullable rules by
  // counting, then the left-corner graph peeled of its sinks.
  void check_left_recursion(const GrammarRules& g) {
    const size_t R = g.alternatives.size();
    std::vector<char> nullable(R, 0);
    std::vector<uint32_t> remaining;                  // per alternative: elements not yet known nullable
    std::vector<uint32_t> alt_rule;
    std::vector<std::vector<uint32_t>> uses(R);       // rule → alternatives that reference it (per use)
    std::vector<uint32_t> queue;
    for (uint32_t r = 0; r < R; ++r) {
      for (const uint32_t start : g.alternatives[r]) {
        const uint32_t a = static_cast<uint32_t>(remaining.size());
        uint32_t left = 0;
        for (uint32_t p = start; g.elements[p].kind != GrammarRules::end; ++p) {
          ++left;
          if (g.elements[p].kind == GrammarRules::rule) uses[g.elements[p].arg].push_back(a);
        }
        remaining.push_back(left);
        alt_rule.push_back(r);
        if (left == 0 && !nullable[r]) {
          nullable[r] = 1;
          queue.push_back(r);
        }
      }
    }
    while (!queue.empty()) {
      const uint32_t r = queue.back();
      queue.pop_back();
      for (const uint32_t a : uses[r])
        if (--remaining[a] == 0 && !nullable[alt_rule[a]]) {
          nullable[alt_rule[a]] = 1;
          queue.push_back(alt_rule[a]);
        }
    }
    std::vector<std::vector<uint32_t>> corner(R);  // A → B: B can start A
    std::vector<std::vector<uint32_t>> back(R);
    std::vector<uint32_t> out_degree(R, 0);
    for (uint32_t r = 0; r < R; ++r)
      for (const uint32_t start : g.alternatives[r])
        for (uint32_t p = start; g.elements[p].kind == GrammarRules::rule; ++p) {
          const uint32_t b = g.elements[p].arg;
          corner[r].push_back(b);
          back[b].push_back(r);
          ++out_degree[r];
          if (!nullable[b]) break;
        }
    std::vector<char> removed(R, 0);
    for (uint32_t r = 0; r < R; ++r)
      if (out_degree[r] == 0) queue.push_back(r);
    while (!queue.empty()) {
      const uint32_t r = queue.back();
      queue.pop_back();
      removed[r] = 1;
      for (const uint32_t a : back[r])
        if (--out_degree[a] == 0) queue.push_back(a);
    }
    for (uint32_t r = 0; r < R; ++r) {
      if (removed[r]) continue;
      // Every rule left reaches another one left: walk until one repeats, a rule on the cycle.
      std::vector<char> seen(R, 0);
      uint32_t x = r;
      while (!seen[x]) {
        seen[x] = 1;
        for (const uint32_t b : corner[x])
          if (!removed[b]) {
            x = b;
            break;
          }
      }
      uint32_t named = x;  // prefer a rule the grammar names
      for (uint32_t y = x;;) {
        if (!g.names[y].empty()) {
          named = y;
          break;
        }
        for (const uint32_t b : corner[y])
          if (!removed[b]) {
            y = b;
            break;
          }
        if (y == x) break;
      }
      error(first_use_[named], rule_label(g, named) + " is left-recursive (it can reach itself before matching a character); "
                                                      "rewrite it with repetition, e.g. x ::= y (\"+\" y)*");
    }
  }

  std::string_view s_;
  std::string_view source_;
  size_t i_ = 0;
  size_t elements_ = 0;
  std::vector<Alternatives> rules_;
  std::vector<std::string> names_;
  std::vector<char> defined_;
  std::vector<size_t> first_use_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<ByteSet> sets_;
};

}  // namespace

GrammarRules parse_gbnf(std::string_view text, std::string_view source) { return Parser(text, source).parse(); }

}  // namespace mhsa::detail
