// text/regex.cpp — the regex subset of tokenizer.json patterns (see regex.h): a recursive-descent
// parser into a small node graph, and a backtracking matcher in continuation-passing style, so
// alternatives and quantifiers are tried in Oniguruma's (Perl's) order and the first match found
// is the leftmost-first one. A repeat of a single-character set, every repeat in these patterns,
// runs as a loop without recursion. Patterns made only of sets, repeats of sets, look-aheads,
// alternations in tail position and sequences (all of the Split patterns of real files) take a
// direct path instead: the same search in the same order (a greedy repeat's backtracking skips
// the places where what follows cannot start, so it never takes more steps than the general one),
// but each node returns where its match ends (the continuation after the root always accepts,
// so only a sequence's rest needs trying), with no continuation objects or indirect calls.
// GPT-2's, Llama 3's and Qwen2's patterns, recognised by their text, skip both: a hand-written
// scanner reads the bytes (find_all on a string_view; tests check it against the general matcher).
#include "text/regex.h"

#include <algorithm>
#include <array>
#include <bit>
#include <climits>

#include "core/check.h"
#include "io/json.h"

namespace mhsa::text {

void decode_units(std::string_view text, std::vector<Unit>& out) {
  static const auto kAscii = [] {  // each ASCII character's category and White_Space
    std::array<std::pair<Category, bool>, 128> t{};
    for (char32_t c = 0; c < 128; ++c) t[c] = {category(c), char_class(c) == CharClass::space};
    return t;
  }();
  out.clear();
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      out.push_back({c, static_cast<uint32_t>(i), kAscii[c].first, kAscii[c].second});
      ++i;
      continue;
    }
    const Utf8 d = decode_utf8(text, i);
    if (d.valid) out.push_back({d.cp, static_cast<uint32_t>(i), category(d.cp), is_white_space(d.cp)});
    else out.push_back({0x110000u + c, static_cast<uint32_t>(i), Category::Cn, false});
    i += static_cast<size_t>(d.len);
  }
}

namespace {

constexpr uint32_t bit(Category c) { return uint32_t{1} << static_cast<int>(c); }
constexpr uint32_t kLetters = bit(Category::Lu) | bit(Category::Ll) | bit(Category::Lt) | bit(Category::Lm) | bit(Category::Lo);
constexpr uint32_t kMarks = bit(Category::Mn) | bit(Category::Mc) | bit(Category::Me);
constexpr uint32_t kNumbers = bit(Category::Nd) | bit(Category::Nl) | bit(Category::No);
constexpr uint32_t kPunctuation = bit(Category::Pc) | bit(Category::Pd) | bit(Category::Ps) | bit(Category::Pe) |
                                  bit(Category::Pi) | bit(Category::Pf) | bit(Category::Po);
constexpr uint32_t kSymbols = bit(Category::Sm) | bit(Category::Sc) | bit(Category::Sk) | bit(Category::So);
constexpr uint32_t kSeparators = bit(Category::Zs) | bit(Category::Zl) | bit(Category::Zp);
constexpr uint32_t kOthers = bit(Category::Cc) | bit(Category::Cf) | bit(Category::Cs) | bit(Category::Co) | bit(Category::Cn);

// Oniguruma's names for the general categories: short and long, compared without case, spaces,
// hyphens or underscores.
uint32_t property_mask(std::string name) {
  std::string key;
  for (const char c : name)
    if (c != ' ' && c != '_' && c != '-') key += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  static const std::array<std::pair<const char*, uint32_t>, 76> kNames = {{
      {"l", kLetters}, {"letter", kLetters}, {"lu", bit(Category::Lu)}, {"uppercaseletter", bit(Category::Lu)},
      {"ll", bit(Category::Ll)}, {"lowercaseletter", bit(Category::Ll)}, {"lt", bit(Category::Lt)},
      {"titlecaseletter", bit(Category::Lt)}, {"lm", bit(Category::Lm)}, {"modifierletter", bit(Category::Lm)},
      {"lo", bit(Category::Lo)}, {"otherletter", bit(Category::Lo)},
      {"lc", bit(Category::Lu) | bit(Category::Ll) | bit(Category::Lt)},
      {"casedletter", bit(Category::Lu) | bit(Category::Ll) | bit(Category::Lt)},
      {"m", kMarks}, {"mark", kMarks}, {"combiningmark", kMarks}, {"mn", bit(Category::Mn)},
      {"nonspacingmark", bit(Category::Mn)}, {"mc", bit(Category::Mc)}, {"spacingmark", bit(Category::Mc)},
      {"me", bit(Category::Me)}, {"enclosingmark", bit(Category::Me)},
      {"n", kNumbers}, {"number", kNumbers}, {"nd", bit(Category::Nd)}, {"decimalnumber", bit(Category::Nd)},
      {"digit", bit(Category::Nd)}, {"nl", bit(Category::Nl)}, {"letternumber", bit(Category::Nl)},
      {"no", bit(Category::No)}, {"othernumber", bit(Category::No)},
      {"p", kPunctuation}, {"punctuation", kPunctuation}, {"punct", kPunctuation}, {"pc", bit(Category::Pc)},
      {"connectorpunctuation", bit(Category::Pc)}, {"pd", bit(Category::Pd)}, {"dashpunctuation", bit(Category::Pd)},
      {"ps", bit(Category::Ps)}, {"openpunctuation", bit(Category::Ps)}, {"pe", bit(Category::Pe)},
      {"closepunctuation", bit(Category::Pe)}, {"pi", bit(Category::Pi)}, {"initialpunctuation", bit(Category::Pi)},
      {"pf", bit(Category::Pf)}, {"finalpunctuation", bit(Category::Pf)}, {"po", bit(Category::Po)},
      {"otherpunctuation", bit(Category::Po)},
      {"s", kSymbols}, {"symbol", kSymbols}, {"sm", bit(Category::Sm)}, {"mathsymbol", bit(Category::Sm)},
      {"sc", bit(Category::Sc)}, {"currencysymbol", bit(Category::Sc)}, {"sk", bit(Category::Sk)},
      {"modifiersymbol", bit(Category::Sk)}, {"so", bit(Category::So)}, {"othersymbol", bit(Category::So)},
      {"z", kSeparators}, {"separator", kSeparators}, {"zs", bit(Category::Zs)}, {"spaceseparator", bit(Category::Zs)},
      {"zl", bit(Category::Zl)}, {"lineseparator", bit(Category::Zl)}, {"zp", bit(Category::Zp)},
      {"paragraphseparator", bit(Category::Zp)},
      {"c", kOthers}, {"other", kOthers}, {"cc", bit(Category::Cc)}, {"control", bit(Category::Cc)},
      {"cf", bit(Category::Cf)}, {"format", bit(Category::Cf)}, {"co", bit(Category::Co)},
      {"privateuse", bit(Category::Co)}, {"cn", bit(Category::Cn)},
  }};
  for (const auto& [n, mask] : kNames)
    if (key == n) return mask;
  return 0;
}

bool item_matches(const Regex::Item& it, char32_t cp, Category cat, bool space) {
  bool m;
  switch (it.kind) {
    case Regex::Item::Kind::categories: m = (it.categories & bit(cat)) != 0; break;
    case Regex::Item::Kind::space: m = space; break;
    default: m = cp >= it.first && cp <= it.last; break;
  }
  return m != it.negated;
}

bool set_matches(const Regex::Set& s, char32_t cp, Category cat, bool space) {
  if (cp < 128) return (s.ascii[cp >> 6] >> (cp & 63)) & 1;
  bool any = false;
  for (const Regex::Item& it : s.items)
    if (item_matches(it, cp, cat, space)) {
      any = true;
      break;
    }
  return any != s.negated;
}

}  // namespace

class RegexParser {
 public:
  RegexParser(Regex& re, std::string_view pattern, std::string_view fn, std::string_view arg)
      : re_(re), pattern_(pattern), fn_(fn), arg_(arg) {
    for (size_t i = 0; i < pattern.size();) {
      const Utf8 d = decode_utf8(pattern, i);
      if (!d.valid) refuse("valid UTF-8", "an invalid byte");
      cps_.push_back(d.cp);
      offsets_.push_back(i);
      i += static_cast<size_t>(d.len);
    }
    offsets_.push_back(pattern.size());
    re_.root_ = alternation(false);
    if (pos_ < cps_.size()) refuse("a balanced pattern", "an unmatched ')'");
    for (Regex::Set& s : re_.sets_)
      for (char32_t cp = 0; cp < 128; ++cp) {
        bool any = false;
        for (const Regex::Item& it : s.items) any = any || item_matches(it, cp, category(cp), char_class(cp) == CharClass::space);
        if (any != s.negated) s.ascii[cp >> 6] |= uint64_t{1} << (cp & 63);
      }
  }

 private:
  Regex& re_;
  std::string_view pattern_, fn_, arg_;
  std::vector<char32_t> cps_;
  std::vector<size_t> offsets_;
  size_t pos_ = 0;
  int depth_ = 0;

  [[noreturn]] void refuse(std::string_view what, std::string_view got) const {
    const size_t at = offsets_[std::min(pos_, offsets_.size() - 1)];
    detail::fail(fn_, arg_, std::string(what),
                 detail::message(got, " at byte ", at, " of ", detail::quote(pattern_.substr(at > 20 ? at - 20 : 0))));
  }
  [[noreturn]] void unsupported(std::string_view construct) const {
    refuse("a regex of the supported subset (see regex.h)", detail::message("the unsupported construct ", construct));
  }
  bool at_end() const { return pos_ >= cps_.size(); }
  char32_t peek(size_t ahead = 0) const { return pos_ + ahead < cps_.size() ? cps_[pos_ + ahead] : 0; }

  int add(Regex::Node n) {
    re_.nodes_.push_back(std::move(n));
    return static_cast<int>(re_.nodes_.size()) - 1;
  }
  int add_set(Regex::Set s) {
    re_.sets_.push_back(std::move(s));
    return add({.op = Regex::Op::set, .set = static_cast<int>(re_.sets_.size()) - 1});
  }

  // A literal (with its case variants under (?i)) as a set.
  Regex::Set literal(char32_t cp, bool fold) {
    Regex::Set s;
    s.items.push_back({Regex::Item::Kind::range, false, 0, cp, cp});
    if (fold) {
      const char32_t f = simple_fold(cp);
      for (const CodePointPair& p : case_folds())
        if (p.to == f && p.from != cp) s.items.push_back({Regex::Item::Kind::range, false, 0, p.from, p.from});
      if (f != cp) s.items.push_back({Regex::Item::Kind::range, false, 0, f, f});
    }
    return s;
  }

  int alternation(bool fold) {
    if (++depth_ > 100) unsupported("nesting deeper than 100 groups");
    std::vector<int> alts{sequence(fold)};
    while (!at_end() && peek() == '|') {
      ++pos_;
      alts.push_back(sequence(fold));
    }
    --depth_;
    return alts.size() == 1 ? alts[0] : add({.op = Regex::Op::alt, .kids = std::move(alts)});
  }

  int sequence(bool fold) {
    std::vector<int> parts;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '(' && peek(1) == '?' && peek(2) == 'i' && peek(3) == ')') {  // (?i): the rest of the group
        pos_ += 4;
        fold = true;
        continue;
      }
      int atom_node = atom(fold);
      parts.push_back(quantified(atom_node));
    }
    return parts.size() == 1 ? parts[0] : add({.op = Regex::Op::seq, .kids = std::move(parts)});
  }

  std::optional<int> number() {
    if (at_end() || peek() < '0' || peek() > '9') return std::nullopt;
    int v = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + static_cast<int>(peek() - '0');
      if (v > 1000) unsupported("a repeat count above 1000");
      ++pos_;
    }
    return v;
  }

  int quantified(int node) {
    if (at_end()) return node;
    int min, max;
    const char32_t c = peek();
    if (c == '?') min = 0, max = 1;
    else if (c == '*') min = 0, max = -1;
    else if (c == '+') min = 1, max = -1;
    else if (c == '{') {
      const size_t save = pos_;
      ++pos_;
      const auto lo = number();
      std::optional<int> hi = lo;
      bool ok = lo.has_value();
      if (ok && peek() == ',') {
        ++pos_;
        hi = number();
        if (!hi) hi = -1;
      }
      if (!ok || peek() != '}') {  // not a quantifier: a literal '{', as Oniguruma reads it
        pos_ = save;
        return node;
      }
      min = *lo, max = *hi;
      if (max >= 0 && max < min) refuse("a repeat {n,m} with n <= m", "a reversed range");
    } else {
      return node;
    }
    ++pos_;
    bool greedy = true;
    if (!at_end() && peek() == '?') greedy = false, ++pos_;
    else if (!at_end() && peek() == '+') unsupported("possessive quantifier");
    if (!at_end() && (peek() == '?' || peek() == '*' || peek() == '+')) unsupported("a quantifier of a quantifier");
    return add({.op = Regex::Op::repeat, .kids = {node}, .min = min, .max = max, .greedy = greedy});
  }

  uint32_t property() {  // after \p or \P: {Name}, {^Name} or a single letter
    std::string name;
    bool negated = false;
    if (peek() == '{') {
      ++pos_;
      if (peek() == '^') negated = true, ++pos_;
      while (!at_end() && peek() != '}') {
        if (peek() >= 128) unsupported("a property name that is not ASCII");
        name += static_cast<char>(peek());
        ++pos_;
      }
      if (at_end()) refuse("a closing '}'", "the end of the pattern");
      ++pos_;
    } else if (!at_end() && peek() < 128) {
      name += static_cast<char>(peek());
      ++pos_;
    }
    const uint32_t mask = property_mask(name);
    if (!mask) unsupported(detail::message("property \\p{", name, "} (only general categories are supported)"));
    return negated ? ~mask & ((uint32_t{1} << 30) - 1) : mask;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char32_t c = peek();
      const int d = c >= '0' && c <= '9' ? static_cast<int>(c - '0') : c >= 'a' && c <= 'f' ? static_cast<int>(c - 'a' + 10)
                  : c >= 'A' && c <= 'F' ? static_cast<int>(c - 'A' + 10) : -1;
      if (d < 0) refuse("a hexadecimal digit", "another character");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // After a backslash: an item of a class (a set or one character). Returns a character in `cp`
  // when it is one.
  std::optional<Regex::Item> escape(char32_t& cp) {
    if (at_end()) refuse("an escaped character", "the end of the pattern");
    const char32_t c = peek();
    ++pos_;
    using K = Regex::Item::Kind;
    switch (c) {
      case 's': return Regex::Item{K::space, false, 0, 0, 0};
      case 'S': return Regex::Item{K::space, true, 0, 0, 0};
      case 'd': return Regex::Item{K::categories, false, bit(Category::Nd), 0, 0};
      case 'D': return Regex::Item{K::categories, true, bit(Category::Nd), 0, 0};
      case 'p': return Regex::Item{K::categories, false, property(), 0, 0};
      case 'P': return Regex::Item{K::categories, true, property(), 0, 0};
      case 'n': cp = '\n'; return std::nullopt;
      case 'r': cp = '\r'; return std::nullopt;
      case 't': cp = '\t'; return std::nullopt;
      case 'f': cp = '\f'; return std::nullopt;
      case 'v': cp = '\v'; return std::nullopt;
      case 'a': cp = '\a'; return std::nullopt;
      case 'e': cp = 0x1B; return std::nullopt;
      case 'x':
        if (peek() == '{') {
          ++pos_;
          uint32_t v = 0;
          int n = 0;
          while (!at_end() && peek() != '}') {
            v = v * 16 + hex(1);
            if (++n > 8 || v > 0x10FFFF) refuse("a code point up to 10FFFF", "a larger one");
          }
          if (at_end()) refuse("a closing '}'", "the end of the pattern");
          ++pos_;
          cp = v;
        } else {
          cp = hex(2);
        }
        return std::nullopt;
      case 'u': cp = hex(4); return std::nullopt;
      default: break;
    }
    if (c < 128 && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
      unsupported(detail::message("escape \\", static_cast<char>(c), " (anchors, \\w, \\b, \\h, backreferences, ...)"));
    cp = c;  // an escaped punctuation character or any other character: itself
    return std::nullopt;
  }

  void add_range(Regex::Set& s, char32_t lo, char32_t hi, bool fold) {
    s.items.push_back({Regex::Item::Kind::range, false, 0, lo, hi});
    if (!fold) return;
    if (hi - lo > 256) unsupported("a case-insensitive range wider than 256 characters");
    for (char32_t c = lo; c <= hi; ++c) {
      Regex::Set variants = literal(c, true);
      s.items.insert(s.items.end(), variants.items.begin() + 1, variants.items.end());
    }
  }

  int bracket(bool fold) {
    Regex::Set s;
    if (peek() == '^') s.negated = true, ++pos_;
    bool first = true;
    while (true) {
      if (at_end()) refuse("a closing ']'", "the end of the pattern");
      char32_t c = peek();
      if (c == ']' && !first) break;
      first = false;
      if (c == '[') unsupported("nested character class");
      if (c == '&' && peek(1) == '&') unsupported("class intersection &&");
      ++pos_;
      if (c == '\\') {
        if (auto item = escape(c)) {
          s.items.push_back(*item);
          continue;
        }
      }
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < cps_.size()) {
        ++pos_;
        char32_t hi = peek();
        ++pos_;
        if (hi == '\\' && escape(hi)) unsupported("a range ending in a class escape");
        if (hi == '[') unsupported("nested character class");
        if (hi < c) refuse("a range a-b with a <= b", "a reversed range");
        add_range(s, c, hi, fold);
      } else {
        add_range(s, c, c, fold);
      }
    }
    ++pos_;
    return add_set(std::move(s));
  }

  int atom(bool fold) {
    const char32_t c = peek();
    ++pos_;
    switch (c) {
      case '(': {
        Regex::Op op = Regex::Op::seq;
        bool inner_fold = fold;
        if (peek() == '?') {
          const char32_t k = peek(1);
          if (k == ':') pos_ += 2;
          else if (k == '=') op = Regex::Op::look_ahead, pos_ += 2;
          else if (k == '!') op = Regex::Op::negative_look_ahead, pos_ += 2;
          else if (k == 'i' && peek(2) == ':') inner_fold = true, pos_ += 3;
          else if (k == '<' && (peek(2) == '=' || peek(2) == '!')) unsupported("lookbehind");
          else unsupported("group flags or named groups (only (?:, (?i:, (?i), (?=, (?! are supported)");
        }
        const int inner = alternation(inner_fold);
        if (at_end() || peek() != ')') refuse("a closing ')'", "the end of the pattern");
        ++pos_;
        if (op == Regex::Op::seq) return inner;
        return add({.op = op, .kids = {inner}});
      }
      case '[': return bracket(fold);
      case '.': {
        Regex::Set s;
        s.negated = true;
        s.items.push_back({Regex::Item::Kind::range, false, 0, '\n', '\n'});
        return add_set(std::move(s));
      }
      case '$': return add({.op = Regex::Op::end_of_line});
      case '^': unsupported("anchor ^");
      case '?': case '*': case '+': refuse("something to repeat before a quantifier", "a bare quantifier");
      case ')': refuse("a balanced pattern", "an unmatched ')'");
      case '\\': {
        char32_t cp = 0;
        if (auto item = escape(cp)) {
          Regex::Set s;
          s.items.push_back(*item);
          return add_set(std::move(s));
        }
        return add_set(literal(cp, fold));
      }
      default: return add_set(literal(c, fold));
    }
  }
};

Regex::Regex(std::string_view pattern, std::string_view fn, std::string_view arg) {
  RegexParser(*this, pattern, fn, arg);
  if (pattern == R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)")
    scanner_ = pretoken_end;
  else if (pattern == R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")
    scanner_ = [](std::string_view text, size_t begin) { return split_pretoken_end(text, begin, 3); };
  else if (pattern == R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")
    scanner_ = [](std::string_view text, size_t begin) { return split_pretoken_end(text, begin, 1); };
  compute_first_sets();
  direct_ = direct_tail(root_);
  for (Node& n : nodes_) {
    if (n.op != Op::alt || n.kids.size() > 64) continue;
    n.ascii_kids.assign(128, 0);
    for (size_t k = 0; k < n.kids.size(); ++k) {
      const Node& kid = nodes_[static_cast<size_t>(n.kids[k])];
      for (char32_t cp = 0; cp < 128; ++cp)
        if (kid.nullable || ((kid.first_ascii[cp >> 6] >> (cp & 63)) & 1)) n.ascii_kids[cp] |= uint64_t{1} << k;
    }
  }
}

// Whether node `id`, matched with a continuation that always accepts, takes the direct path:
// a set, a repeat of a set, a look-ahead of such a node, an alternation of such nodes, or a
// sequence of direct_step() nodes ending in such a node.
bool Regex::direct_tail(int id) const {
  const Node& n = nodes_[static_cast<size_t>(id)];
  switch (n.op) {
    case Op::set: case Op::end_of_line: return true;
    case Op::repeat: return nodes_[static_cast<size_t>(n.kids[0])].op == Op::set;
    case Op::alt: return std::all_of(n.kids.begin(), n.kids.end(), [&](int k) { return direct_tail(k); });
    case Op::seq:
      for (size_t i = 0; i + 1 < n.kids.size(); ++i)
        if (!direct_step(n.kids[i])) return false;
      return n.kids.empty() || direct_tail(n.kids.back());
    default: return direct_tail(n.kids[0]);
  }
}
// Whether node `id` takes the direct path inside a sequence, followed by the sequence's rest: a
// set, a repeat of a set, or a look-ahead of a direct_tail() node.
bool Regex::direct_step(int id) const {
  const Node& n = nodes_[static_cast<size_t>(id)];
  switch (n.op) {
    case Op::set: case Op::end_of_line: return true;
    case Op::repeat: return nodes_[static_cast<size_t>(n.kids[0])].op == Op::set;
    case Op::look_ahead: case Op::negative_look_ahead: return direct_tail(n.kids[0]);
    default: return false;
  }
}

// A node's parts come before it in nodes_, so one pass in order sees every part first. A
// look-ahead or $ is taken as nullable (it consumes nothing), so a sequence that starts with one
// is never skipped.
void Regex::compute_first_sets() {
  for (Node& n : nodes_) {
    const auto take = [&](const Node& kid) {
      n.first_ascii[0] |= kid.first_ascii[0], n.first_ascii[1] |= kid.first_ascii[1];
      n.first_any = n.first_any || kid.first_any;
      for (const int set : kid.first_sets)
        if (std::find(n.first_sets.begin(), n.first_sets.end(), set) == n.first_sets.end()) n.first_sets.push_back(set);
    };
    switch (n.op) {
      case Op::set:
        n.first_ascii[0] = sets_[static_cast<size_t>(n.set)].ascii[0], n.first_ascii[1] = sets_[static_cast<size_t>(n.set)].ascii[1];
        n.first_sets = {n.set};
        break;
      case Op::seq:
        n.nullable = true;
        for (const int kid : n.kids) {
          take(nodes_[static_cast<size_t>(kid)]);
          if (!nodes_[static_cast<size_t>(kid)].nullable) {
            n.nullable = false;
            break;
          }
        }
        break;
      case Op::alt:
        for (const int kid : n.kids) {
          take(nodes_[static_cast<size_t>(kid)]);
          n.nullable = n.nullable || nodes_[static_cast<size_t>(kid)].nullable;
        }
        break;
      case Op::repeat:
        take(nodes_[static_cast<size_t>(n.kids[0])]);
        n.nullable = n.min == 0 || nodes_[static_cast<size_t>(n.kids[0])].nullable;
        break;
      default:
        n.nullable = true;
        break;
    }
  }
}

// False only when no match of n can start at units[pos].
bool Regex::can_start(const Node& n, std::span<const Unit> units, size_t pos) const {
  if (n.nullable) return true;
  if (pos >= units.size()) return false;
  const Unit& u = units[pos];
  if (u.cp < 128) return (n.first_ascii[u.cp >> 6] >> (u.cp & 63)) & 1;
  if (n.first_any) return true;
  for (const int set : n.first_sets)
    if (set_matches(sets_[static_cast<size_t>(set)], u.cp, u.cat, u.space)) return true;
  return false;
}

namespace {
struct Cont {
  bool (*fn)(const void*, size_t);
  const void* ctx;
  bool operator()(size_t p) const { return fn(ctx, p); }
};
template <class F>
Cont cont(const F& f) {
  return {[](const void* c, size_t p) { return (*static_cast<const F*>(c))(p); }, &f};
}
constexpr int kMaxDepth = 4000;  // continuation frames: far below any thread's stack
}  // namespace

class Matcher {
 public:
  Matcher(const Regex& re, std::span<const Unit> u, uint64_t budget) : re_(re), u_(u), budget_(budget) {}

  static constexpr size_t kFail = SIZE_MAX;

  bool match(int id, size_t pos, Cont k) {
    step();
    const Regex::Node& n = re_.nodes_[static_cast<size_t>(id)];
    switch (n.op) {
      case Regex::Op::set: return pos < u_.size() && test(n.set, pos) && k(pos + 1);
      case Regex::Op::seq: return seq(n, 0, pos, k);
      case Regex::Op::alt:
        for (const int kid : n.kids)
          if (re_.can_start(re_.nodes_[static_cast<size_t>(kid)], u_, pos) && match(kid, pos, k)) return true;
        return false;
      case Regex::Op::repeat: {
        const Regex::Node& kid = re_.nodes_[static_cast<size_t>(n.kids[0])];
        if (kid.op == Regex::Op::set) return repeat_set(n, kid.set, pos, k);
        return repeat(n, 0, pos, k);
      }
      case Regex::Op::end_of_line: return end_of_line(pos) && k(pos);
      default: {
        const bool found = nested(n.kids[0], pos, cont([](size_t) { return true; }));
        return found == (n.op == Regex::Op::look_ahead) && k(pos);
      }
    }
  }

  // The direct path (Regex::direct_tail): where the match of node `id` at `pos` ends when
  // whatever follows it accepts, or kFail. It counts steps and depth as match() does.
  size_t tail(int id, size_t pos) {
    step();
    const Regex::Node& n = re_.nodes_[static_cast<size_t>(id)];
    switch (n.op) {
      case Regex::Op::set: return pos < u_.size() && test(n.set, pos) ? pos + 1 : kFail;
      case Regex::Op::seq: return seq_tail(n, 0, pos);
      case Regex::Op::alt:
        if (pos < u_.size() && u_[pos].cp < 128 && !n.ascii_kids.empty()) {
          for (uint64_t bits = n.ascii_kids[u_[pos].cp]; bits; bits &= bits - 1)
            if (const size_t end = tail(n.kids[static_cast<size_t>(std::countr_zero(bits))], pos); end != kFail) return end;
          return kFail;
        }
        for (const int kid : n.kids)
          if (re_.can_start(re_.nodes_[static_cast<size_t>(kid)], u_, pos))
            if (const size_t end = tail(kid, pos); end != kFail) return end;
        return kFail;
      case Regex::Op::repeat: {
        const size_t run = n.greedy ? run_of(n, pos) : static_cast<size_t>(n.min);
        if (n.greedy) return run < static_cast<size_t>(n.min) ? kFail : pos + run;
        for (size_t i = 0; i < run; ++i)
          if (pos + i >= u_.size() || !test(re_.nodes_[static_cast<size_t>(n.kids[0])].set, pos + i)) return kFail;
        return pos + run;
      }
      case Regex::Op::end_of_line: return end_of_line(pos) ? pos : kFail;
      default: return look(n, pos) ? pos : kFail;
    }
  }

 private:
  const Regex& re_;
  std::span<const Unit> u_;
  uint64_t budget_;
  int depth_ = 0;

  void step() {
    if (budget_-- == 0) detail::fail("Tokenizer::encode", "pattern", "a regex that matches without heavy backtracking", "one that took too many steps on this text");
  }
  void enter() {
    if (++depth_ > kMaxDepth) detail::fail("Tokenizer::encode", "pattern", "a regex that matches within a bounded depth", "one that nests too deeply on this text");
  }
  // How many characters from pos a greedy repeat of a set takes at most.
  size_t run_of(const Regex::Node& n, size_t pos) const {
    const size_t limit = n.max < 0 ? u_.size() - pos : std::min(u_.size() - pos, static_cast<size_t>(n.max));
    const Regex::Set& set = re_.sets_[static_cast<size_t>(re_.nodes_[static_cast<size_t>(n.kids[0])].set)];
    size_t run = 0;
    while (run < limit && set_matches(set, u_[pos + run].cp, u_[pos + run].cat, u_[pos + run].space)) ++run;
    return run;
  }
  bool look(const Regex::Node& n, size_t pos) {
    enter();
    const bool found = tail(n.kids[0], pos) != kFail;
    --depth_;
    return found == (n.op == Regex::Op::look_ahead);
  }
  // The direct path of a sequence from its part i.
  size_t seq_tail(const Regex::Node& n, size_t i, size_t pos) {
    if (i == n.kids.size()) return pos;
    if (i + 1 == n.kids.size()) return tail(n.kids[i], pos);
    enter();
    const size_t end = seq_step(n, i, pos);
    --depth_;
    return end;
  }
  size_t seq_step(const Regex::Node& seq, size_t i, size_t pos) {
    step();
    const Regex::Node& n = re_.nodes_[static_cast<size_t>(seq.kids[i])];
    switch (n.op) {
      case Regex::Op::set: return pos < u_.size() && test(n.set, pos) ? seq_tail(seq, i + 1, pos + 1) : kFail;
      case Regex::Op::repeat: {
        const int set = re_.nodes_[static_cast<size_t>(n.kids[0])].set;
        const size_t min = static_cast<size_t>(n.min);
        if (n.greedy) {
          const size_t run = run_of(n, pos);
          if (run < min) return kFail;
          // The rest is tried only where its first part can start (never nullable there, as at
          // the end of a whitespace run for \s*[\r\n]+): the same result in fewer steps.
          const Regex::Node& next = re_.nodes_[static_cast<size_t>(seq.kids[i + 1])];
          for (size_t c = run + 1; c-- > min;)
            if (re_.can_start(next, u_, pos + c))
              if (const size_t end = seq_tail(seq, i + 1, pos + c); end != kFail) return end;
          return kFail;
        }
        const size_t limit = n.max < 0 ? u_.size() - pos : std::min(u_.size() - pos, static_cast<size_t>(n.max));
        size_t run = 0;
        for (; run < min; ++run)
          if (run >= limit || !test(set, pos + run)) return kFail;
        for (;; ++run) {
          if (const size_t end = seq_tail(seq, i + 1, pos + run); end != kFail) return end;
          if (run >= limit || !test(set, pos + run)) return kFail;
        }
      }
      case Regex::Op::end_of_line: return end_of_line(pos) ? seq_tail(seq, i + 1, pos) : kFail;
      default: return look(n, pos) ? seq_tail(seq, i + 1, pos) : kFail;
    }
  }

  // Oniguruma's $ (Ruby syntax, no ONIG_OPTION_SINGLELINE): the end of the text or of a line.
  bool end_of_line(size_t pos) const { return pos == u_.size() || u_[pos].cp == '\n'; }

  bool test(int set, size_t pos) const {
    const Unit& u = u_[pos];
    return set_matches(re_.sets_[static_cast<size_t>(set)], u.cp, u.cat, u.space);
  }
  bool nested(int id, size_t pos, Cont k) {
    enter();
    const bool r = match(id, pos, k);
    --depth_;
    return r;
  }
  bool seq(const Regex::Node& n, size_t i, size_t pos, Cont k) {
    if (i == n.kids.size()) return k(pos);
    if (i + 1 == n.kids.size()) return match(n.kids[i], pos, k);
    const auto rest = [&](size_t p) { return seq(n, i + 1, p, k); };
    return nested(n.kids[i], pos, cont(rest));
  }
  bool repeat_set(const Regex::Node& n, int set, size_t pos, Cont k) {
    const size_t limit = n.max < 0 ? u_.size() - pos : std::min(u_.size() - pos, static_cast<size_t>(n.max));
    size_t run = 0;
    if (n.greedy) {
      while (run < limit && test(set, pos + run)) ++run;
      if (run < static_cast<size_t>(n.min)) return false;
      for (size_t c = run + 1; c-- > static_cast<size_t>(n.min);)
        if (k(pos + c)) return true;
      return false;
    }
    for (; run < static_cast<size_t>(n.min); ++run)
      if (run >= limit || !test(set, pos + run)) return false;
    for (;; ++run) {
      if (k(pos + run)) return true;
      if (run >= limit || !test(set, pos + run)) return false;
    }
  }
  bool repeat(const Regex::Node& n, int count, size_t pos, Cont k) {
    const bool more = n.max < 0 || count < n.max;
    const auto next = [&](size_t p) { return p == pos ? count + 1 >= n.min && k(p) : repeat(n, count + 1, p, k); };
    if (count < n.min) return nested(n.kids[0], pos, cont(next));
    if (n.greedy) return (more && nested(n.kids[0], pos, cont(next))) || k(pos);
    return k(pos) || (more && nested(n.kids[0], pos, cont(next)));
  }
};

void Regex::find_all(std::span<const Unit> units, std::vector<std::pair<size_t, size_t>>& out) const {
  find_all(units, out, direct_);
}
void Regex::find_all_ref(std::span<const Unit> units, std::vector<std::pair<size_t, size_t>>& out) const {
  find_all(units, out, false);
}

void Regex::find_all(std::string_view text, std::vector<Unit>& units, std::vector<std::pair<size_t, size_t>>& out) const {
  if (scanner_) {
    for (size_t pos = 0, end; pos < text.size(); pos = end) out.emplace_back(pos, end = scanner_(text, pos));
    return;
  }
  decode_units(text, units);
  const size_t first = out.size();
  find_all(units, out);
  const auto offset = [&](size_t u) { return u < units.size() ? units[u].offset : text.size(); };
  for (size_t i = first; i < out.size(); ++i) out[i] = {offset(out[i].first), offset(out[i].second)};
}

void Regex::find_all(std::span<const Unit> units, std::vector<std::pair<size_t, size_t>>& out, bool direct) const {
  // Enough for every pattern of real files many times over; a pathological one stops early.
  Matcher m(*this, units, 1'000'000 + 1'000 * static_cast<uint64_t>(units.size()));
  size_t last_end = SIZE_MAX;
  for (size_t s = 0; s <= units.size();) {
    size_t end = 0;
    const auto done = [&](size_t p) {
      end = p;
      return true;
    };
    bool found = can_start(nodes_[static_cast<size_t>(root_)], units, s);
    if (found && direct) {
      end = m.tail(root_, s);
      found = end != Matcher::kFail;
    } else if (found) {
      found = m.match(root_, s, cont(done));
    }
    if (found && !(end == s && s == last_end)) {
      out.emplace_back(s, end);
      last_end = end;
      if (end > s) {
        s = end;
        continue;
      }
    }
    ++s;
  }
}

}  // namespace mhsa::text
