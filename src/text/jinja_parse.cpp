// text/jinja_parse.cpp — the lexer and parser of the Jinja subset (text/jinja.h): template text
// into a tree of Nodes. Whitespace is handled as jinja2 does with trim_blocks and lstrip_blocks
// (transformers' settings): line breaks normalised to "\n", one trailing line break dropped, the
// first line break after a block or comment tag removed, spaces before a tag alone on its line
// removed, and `-` / `+` on either side of a tag. Not handled: line statements, `raw`, custom
// delimiters.
//
// Node layouts (kids): Output [expr]; Block [stmt...]; If [cond, body, cond, body, ..., else?];
// For [iter, body, filter or null, else or null] with names = targets; Set [expr] with names =
// targets (str = attribute for `set ns.attr`); SetBlock [body]; Macro [default or null per param...,
// body] with names = params; Attr [obj]; Item [obj, index]; Slice [obj, start?, stop?, step?];
// Call [callee, args...] and Filter/Test [input, args...] with names = keyword per arg ("" when
// positional); Unary [x]; Binary [a, b]; Cond [then, cond, else?].
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "mhsa/error.h"
#include "text/jinja.h"

namespace mhsa::jinja {
namespace {

enum class T : uint8_t { Text, VarBegin, BlockBegin, VarEnd, BlockEnd, Name, String, Int, Float, Op, End };

struct Token {
  T type;
  std::string text;  // Text: the data; String: the decoded value; others: as written
  size_t pos;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Python's str.splitlines() + "\n".join: every line break becomes "\n" and one final one goes.
std::string normalize_newlines(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = s[i];
    size_t skip = 0;
    if (c == '\r') skip = i + 1 < s.size() && s[i + 1] == '\n' ? 2 : 1;
    else if (c == '\n' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) skip = 1;
    else if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x85) skip = 2;
    else if (c == 0xe2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
             (static_cast<unsigned char>(s[i + 2]) == 0xa8 || static_cast<unsigned char>(s[i + 2]) == 0xa9))
      skip = 3;
    if (skip) {
      out += '\n';
      i += skip - 1;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    const int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    if (n < 0 || i + static_cast<size_t>(n) >= s.size()) return false;
    uint32_t cp = n == 0 ? c : c & (0x3f >> n);
    for (int k = 1; k <= n; ++k) {
      const unsigned char d = s[i + k];
      if ((d >> 6) != 2) return false;
      cp = cp << 6 | (d & 0x3f);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += static_cast<size_t>(n) + 1;
  }
  return true;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | cp >> 6);
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | cp >> 12);
    out += static_cast<char>(0x80 | (cp >> 6 & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | cp >> 18);
    out += static_cast<char>(0x80 | (cp >> 12 & 0x3f));
    out += static_cast<char>(0x80 | (cp >> 6 & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

class Lexer {
 public:
  explicit Lexer(const std::string& src) : s_(src) {}

  [[noreturn]] void error(size_t pos, const std::string& expected, const std::string& got) const {
    int line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < pos && i < s_.size(); ++i)
      if (s_[i] == '\n') ++line, line_start = i + 1;
    int col = 1;
    for (size_t i = line_start; i < pos && i < s_.size(); ++i) col += (static_cast<unsigned char>(s_[i]) >> 6) != 2;
    throw Error(detail::message("ChatTemplate: source: line ", line, ", column ", col, ": expected ", expected,
                                ", got ", got));
  }

  std::vector<Token> run() {
    bool line_starting = true;
    size_t pos = 0;
    while (pos < s_.size()) {
      size_t tag = pos;
      while ((tag = s_.find('{', tag)) != std::string::npos) {
        if (tag + 1 < s_.size() && (s_[tag + 1] == '{' || s_[tag + 1] == '%' || s_[tag + 1] == '#')) break;
        ++tag;
      }
      if (tag == std::string::npos) tag = s_.size();
      std::string text = s_.substr(pos, tag - pos);
      if (tag == s_.size()) {
        push_text(std::move(text), pos);
        break;
      }
      const char kind = s_[tag + 1];
      const char sign = tag + 2 < s_.size() ? s_[tag + 2] : '\0';
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks
        const size_t nl = text.rfind('\n');
        const size_t from = nl == std::string::npos ? 0 : nl + 1;
        if ((nl != std::string::npos || line_starting) && from < text.size() &&
            std::all_of(text.begin() + static_cast<ptrdiff_t>(from), text.end(), is_space))
          text.resize(from);
      }
      push_text(std::move(text), pos);
      pos = tag + 2 + (sign == '-' || (sign == '+' && kind != '{'));
      if (kind == '#') {
        const size_t end = s_.find("#}", pos);
        if (end == std::string::npos) error(tag, "'#}' to close the comment", "the end of the template");
        const bool strip = end > pos && s_[end - 1] == '-';
        pos = end + 2;
        pos = after_tag_end(pos, strip, end > pos && s_[end - 1] == '+');
      } else {
        out_.push_back({kind == '{' ? T::VarBegin : T::BlockBegin, "", tag});
        pos = lex_tag(pos, kind == '{');
      }
      line_starting = pos > 0 && s_[pos - 1] == '\n';
    }
    out_.push_back({T::End, "", s_.size()});
    return std::move(out_);
  }

 private:
  void push_text(std::string text, size_t pos) {
    if (!text.empty()) out_.push_back({T::Text, std::move(text), pos});
  }

  // After a tag's closing delimiter: `-` strips all whitespace, else trim_blocks takes one "\n".
  size_t after_tag_end(size_t pos, bool strip, bool keep) const {
    if (strip) {
      while (pos < s_.size() && is_space(s_[pos])) ++pos;
    } else if (!keep && pos < s_.size() && s_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  size_t lex_tag(size_t pos, bool var) {
    int depth = 0;  // open brackets: a closing delimiter inside them is two operators
    for (;;) {
      while (pos < s_.size() && is_space(s_[pos])) ++pos;
      if (pos >= s_.size()) error(pos, var ? "'}}'" : "'%}'", "the end of the template");
      const char c = s_[pos];
      if (depth == 0) {
        const bool sign = (c == '-' || (c == '+' && !var));
        const size_t at = pos + sign;
        if (s_.compare(at, 2, var ? "}}" : "%}") == 0) {
          out_.push_back({var ? T::VarEnd : T::BlockEnd, "", pos});
          return var ? (c == '-' ? after_tag_end(at + 2, true, false) : at + 2)
                     : after_tag_end(at + 2, c == '-', c == '+');
        }
      }
      if (is_name_start(c) || static_cast<unsigned char>(c) >= 0x80) {
        size_t e = pos;
        while (e < s_.size() && (is_name_start(s_[e]) || is_digit(s_[e]))) ++e;
        if (e == pos) error(pos, "a name, a literal or an operator", "a non-ASCII character");
        out_.push_back({T::Name, s_.substr(pos, e - pos), pos});
        pos = e;
      } else if (is_digit(c)) {
        pos = lex_number(pos);
      } else if (c == '\'' || c == '"') {
        pos = lex_string(pos);
      } else {
        static const char* const ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                          "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
        const char* found = nullptr;
        for (const char* op : ops)
          if (s_.compare(pos, std::strlen(op), op) == 0) {
            found = op;
            break;
          }
        if (!found) error(pos, "a name, a literal or an operator", detail::message("'", c, "'"));
        if (*found == '(' || *found == '[' || *found == '{') ++depth;
        if ((*found == ')' || *found == ']' || *found == '}') && depth > 0) --depth;
        out_.push_back({T::Op, found, pos});
        pos += std::strlen(found);
      }
    }
  }

  size_t lex_number(size_t pos) {
    auto digits = [&](size_t p) {  // (\d+_)*\d+
      while (p < s_.size() && (is_digit(s_[p]) || (s_[p] == '_' && p + 1 < s_.size() && is_digit(s_[p + 1])))) ++p;
      return p;
    };
    size_t e = digits(pos);
    bool is_float = false;
    if (e + 1 < s_.size() && s_[e] == '.' && is_digit(s_[e + 1])) {
      e = digits(e + 1);
      is_float = true;
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t x = e + 1;
      if (x < s_.size() && (s_[x] == '+' || s_[x] == '-')) ++x;
      if (x < s_.size() && is_digit(s_[x])) e = digits(x), is_float = true;
    }
    std::string text;
    for (size_t i = pos; i < e; ++i)
      if (s_[i] != '_') text += s_[i];
    out_.push_back({is_float ? T::Float : T::Int, text, pos});
    return e;
  }

  // Python's unicode-escape decoding of the literal's contents; unknown escapes stay as written.
  size_t lex_string(size_t pos) {
    const char q = s_[pos];
    std::string v;
    size_t i = pos + 1;
    for (;;) {
      if (i >= s_.size()) error(pos, "the end of the string literal", "the end of the template");
      const char c = s_[i];
      if (c == q) break;
      if (c != '\\') {
        v += c;
        ++i;
        continue;
      }
      if (i + 1 >= s_.size()) error(pos, "the end of the string literal", "the end of the template");
      const char e = s_[i + 1];
      i += 2;
      switch (e) {
        case 'n': v += '\n'; break;
        case 't': v += '\t'; break;
        case 'r': v += '\r'; break;
        case 'b': v += '\b'; break;
        case 'f': v += '\f'; break;
        case 'v': v += '\v'; break;
        case 'a': v += '\a'; break;
        case '\\': v += '\\'; break;
        case '\'': v += '\''; break;
        case '"': v += '"'; break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int k = 0; k < n; ++k, ++i) {
            const char h = i < s_.size() ? s_[i] : '\0';
            const int d = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (d < 0) error(i, detail::message(n, " hex digits after '\\", e, "'"), "something else");
            cp = cp << 4 | static_cast<uint32_t>(d);
          }
          if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            error(i - n - 2, "an escape for a Unicode scalar value", "a surrogate or a value past U+10FFFF");
          append_utf8(v, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < s_.size() && s_[i] >= '0' && s_[i] <= '7'; ++k, ++i) cp = cp * 8 + (s_[i] - '0');
            append_utf8(v, cp);
          } else {
            v += '\\';
            i -= 1;  // the character after the backslash is read as itself
          }
      }
    }
    out_.push_back({T::String, std::move(v), pos});
    return i + 1;
  }

  const std::string& s_;
  std::vector<Token> out_;
};

class Parser {
 public:
  Parser(std::vector<Token> tokens, const Lexer& lexer) : t_(std::move(tokens)), lexer_(lexer) {}

  NodePtr parse_template() {
    std::string end;
    NodePtr body = parse_body({}, end);
    return body;
  }

 private:
  // ---- helpers ----
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == T::Op && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == T::Name && cur().text == name; }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case T::End: return "the end of the template";
      case T::Text: return "text";
      case T::VarBegin: return "'{{'";
      case T::BlockBegin: return "'{%'";
      case T::VarEnd: return "'}}'";
      case T::BlockEnd: return "'%}'";
      case T::String: return "a string";
      default: return "'" + t.text.substr(0, 40) + "'";
    }
  }
  [[noreturn]] void error(const std::string& expected) const { lexer_.error(cur().pos, expected, describe(cur())); }
  void expect_op(const char* op) {
    if (!is_op(op)) error(std::string("'") + op + "'");
    ++i_;
  }
  void expect(T type, const char* what) {
    if (cur().type != type) error(what);
    ++i_;
  }
  std::string expect_name(const char* what = "a name") {
    if (cur().type != T::Name) error(what);
    return t_[i_++].text;
  }
  NodePtr node(N kind, const Token& at) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    locate(*n, at.pos);
    return n;
  }
  void locate(Node& n, size_t pos) {
    // line/column from the byte position, computed incrementally
    while (line_pos_ < pos) {
      if (src_[line_pos_] == '\n') ++line_, col_ = 1;
      else if ((static_cast<unsigned char>(src_[line_pos_]) >> 6) != 2) ++col_;
      ++line_pos_;
    }
    if (pos < line_pos_) {  // tokens come in order; a rewind recounts from the start
      line_ = 1, col_ = 1, line_pos_ = 0;
      locate(n, pos);
      return;
    }
    n.line = line_, n.col = col_;
  }
  struct Deeper {
    explicit Deeper(Parser& p) : p(p) {
      if (++p.depth_ > kMaxParseDepth) p.error(detail::message("at most ", kMaxParseDepth, " levels of nesting"));
    }
    ~Deeper() { --p.depth_; }
    Parser& p;
  };

 public:
  void set_source(const std::string& s) { src_ = s; }

 private:
  // ---- statements ----
  // Statements up to a `{% name %}` in `ends` (or the end of the template when ends is empty);
  // `end` gets the name, the tag's '%}' not yet consumed.
  NodePtr parse_body(const std::vector<std::string>& ends, std::string& end) {
    Deeper d(*this);
    NodePtr block = node(N::Block, cur());
    for (;;) {
      const Token& tok = cur();
      const auto want = [&] {
        std::string w;
        for (const auto& e : ends) w += (w.empty() ? "'{% " : " or '{% ") + e + " %}'";
        return w.empty() ? std::string("a statement") : w;
      };
      if (tok.type == T::End) {
        if (!ends.empty()) error(want());
        return block;
      }
      if (tok.type == T::Text) {
        NodePtr n = node(N::Text, tok);
        n->str = tok.text;
        block->kids.push_back(std::move(n));
        ++i_;
      } else if (tok.type == T::VarBegin) {
        ++i_;
        NodePtr n = node(N::Output, tok);
        n->kids.push_back(parse_tuple());
        expect(T::VarEnd, "'}}'");
        block->kids.push_back(std::move(n));
      } else {
        ++i_;
        const std::string name = expect_name("a statement name");
        if (std::find(ends.begin(), ends.end(), name) != ends.end()) {
          end = name;
          return block;
        }
        if (name.rfind("end", 0) == 0 || name == "else" || name == "elif")
          lexer_.error(t_[i_ - 1].pos, want(), "'{% " + name.substr(0, 40) + " %}'");
        block->kids.push_back(parse_statement(name, tok));
      }
    }
  }

  NodePtr parse_statement(const std::string& name, const Token& at) {
    if (name == "if") return parse_if(at);
    if (name == "for") return parse_for(at);
    if (name == "set") return parse_set(at);
    if (name == "macro") return parse_macro(at);
    if (name == "break" || name == "continue") {
      if (loops_ == 0) lexer_.error(at.pos, "'" + name + "' inside a for loop", "it outside one");
      NodePtr n = node(name == "break" ? N::Break : N::Continue, at);
      expect(T::BlockEnd, "'%}'");
      return n;
    }
    if (name == "generation") {  // transformers' assistant-mask tag: renders its body
      expect(T::BlockEnd, "'%}'");
      std::string end;
      NodePtr body = parse_body({"endgeneration"}, end);
      expect(T::BlockEnd, "'%}'");
      return body;
    }
    lexer_.error(at.pos + 2, "a statement this interpreter supports (if, for, set, macro, break, continue, generation)",
                 "'" + name.substr(0, 40) + "'");
  }

  NodePtr parse_if(const Token& at) {
    NodePtr n = node(N::If, at);
    for (;;) {
      n->kids.push_back(parse_tuple());
      expect(T::BlockEnd, "'%}'");
      std::string end;
      n->kids.push_back(parse_body({"elif", "else", "endif"}, end));
      if (end == "elif") continue;
      if (end == "else") {
        expect(T::BlockEnd, "'%}'");
        n->kids.push_back(parse_body({"endif"}, end));
      }
      expect(T::BlockEnd, "'%}'");
      return n;
    }
  }

  void parse_targets(Node& n) {
    const bool paren = is_op("(");
    if (paren) ++i_;
    n.names.push_back(expect_name("a loop variable"));
    while (is_op(",")) {
      ++i_;
      n.flag = true;
      if (cur().type != T::Name) break;
      n.names.push_back(expect_name());
    }
    if (paren) expect_op(")");
  }

  NodePtr parse_for(const Token& at) {
    NodePtr n = node(N::For, at);
    parse_targets(*n);
    if (!is_name("in")) error("'in'");
    ++i_;
    n->kids.push_back(parse_tuple(/*no_condexpr=*/true));
    NodePtr filter;
    if (is_name("if")) {
      ++i_;
      filter = parse_expression();
    }
    if (is_name("recursive")) error("'%}' (recursive loops are not supported)");
    expect(T::BlockEnd, "'%}'");
    ++loops_;
    std::string end;
    NodePtr body = parse_body({"else", "endfor"}, end);
    --loops_;
    NodePtr otherwise;
    if (end == "else") {
      expect(T::BlockEnd, "'%}'");
      const int saved = loops_;
      loops_ = 0;  // `else` runs outside the loop
      otherwise = parse_body({"endfor"}, end);
      loops_ = saved;
    }
    expect(T::BlockEnd, "'%}'");
    n->kids.push_back(std::move(body));
    n->kids.push_back(std::move(filter));
    n->kids.push_back(std::move(otherwise));
    return n;
  }

  NodePtr parse_set(const Token& at) {
    NodePtr n = node(N::Set, at);
    n->names.push_back(expect_name("a variable name"));
    if (is_op(".")) {
      ++i_;
      n->str = expect_name("an attribute name");
    } else {
      while (is_op(",")) {
        ++i_;
        n->flag = true;
        n->names.push_back(expect_name());
      }
    }
    if (cur().type == T::BlockEnd && n->str.empty() && !n->flag) {
      ++i_;
      n->kind = N::SetBlock;
      std::string end;
      n->kids.push_back(parse_body({"endset"}, end));
      expect(T::BlockEnd, "'%}'");
      return n;
    }
    expect_op("=");
    n->kids.push_back(parse_tuple());
    expect(T::BlockEnd, "'%}'");
    return n;
  }

  NodePtr parse_macro(const Token& at) {
    NodePtr n = node(N::Macro, at);
    n->str = expect_name("a macro name");
    expect_op("(");
    while (!is_op(")")) {
      if (!n->names.empty()) expect_op(",");
      if (is_op(")")) break;
      n->names.push_back(expect_name("a parameter name"));
      NodePtr def;
      if (is_op("=")) {
        ++i_;
        def = parse_expression();
      } else if (n->kids.size() && n->kids.back()) {
        error("a default value (parameters after one with a default need one)");
      }
      n->kids.push_back(std::move(def));
    }
    ++i_;
    expect(T::BlockEnd, "'%}'");
    const int saved = loops_;
    loops_ = 0;
    std::string end;
    n->kids.push_back(parse_body({"endmacro"}, end));
    loops_ = saved;
    if (cur().type == T::Name) ++i_;  // {% endmacro name %}
    expect(T::BlockEnd, "'%}'");
    return n;
  }

  // ---- expressions ----
  // expr [, expr ...] as a tuple (in outputs, `if` conditions, `set` values, `for` iterables).
  NodePtr parse_tuple(bool no_condexpr = false) {
    const Token& at = cur();
    NodePtr first = no_condexpr ? parse_or() : parse_expression();
    if (!is_op(",")) return first;
    NodePtr t = node(N::TupleLit, at);
    t->kids.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (cur().type == T::VarEnd || cur().type == T::BlockEnd || is_op(")") || is_name("if")) break;
      t->kids.push_back(no_condexpr ? parse_or() : parse_expression());
    }
    return t;
  }

  NodePtr parse_expression() {
    Deeper d(*this);
    const Token& at = cur();
    NodePtr x = parse_or();
    while (is_name("if")) {
      ++i_;
      NodePtr c = node(N::Cond, at);
      c->kids.push_back(std::move(x));
      c->kids.push_back(parse_or());
      NodePtr otherwise;
      if (is_name("else")) {
        ++i_;
        otherwise = parse_expression();
      }
      c->kids.push_back(std::move(otherwise));
      x = std::move(c);
    }
    return x;
  }

  NodePtr binary(const Token& at, std::string op, NodePtr a, NodePtr b) {
    NodePtr n = node(N::Binary, at);
    n->str = std::move(op);
    n->kids.push_back(std::move(a));
    n->kids.push_back(std::move(b));
    return n;
  }

  NodePtr parse_or() {
    NodePtr x = parse_and();
    while (is_name("or")) {
      const Token& at = t_[i_++];
      x = binary(at, "or", std::move(x), parse_and());
    }
    return x;
  }
  NodePtr parse_and() {
    NodePtr x = parse_not();
    while (is_name("and")) {
      const Token& at = t_[i_++];
      x = binary(at, "and", std::move(x), parse_not());
    }
    return x;
  }
  NodePtr parse_not() {
    if (is_name("not")) {
      Deeper d(*this);
      NodePtr n = node(N::Unary, t_[i_++]);
      n->str = "not";
      n->kids.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  NodePtr parse_compare() {
    NodePtr x = parse_math1();
    for (;;) {
      const Token& at = cur();
      std::string op;
      if (cur().type == T::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                  cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().type == T::Name && peek().text == "in") {
        op = "not in";
        i_ += 2;
      } else {
        return x;
      }
      x = binary(at, op, std::move(x), parse_math1());  // chained comparisons: (a < b) < c, as jinja2 does not
    }
  }
  NodePtr parse_math1() {
    NodePtr x = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& at = t_[i_++];
      x = binary(at, at.text, std::move(x), parse_concat());
    }
    return x;
  }
  NodePtr parse_concat() {
    NodePtr x = parse_math2();
    while (is_op("~")) {
      const Token& at = t_[i_++];
      x = binary(at, "~", std::move(x), parse_math2());
    }
    return x;
  }
  NodePtr parse_math2() {
    NodePtr x = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = t_[i_++];
      x = binary(at, at.text, std::move(x), parse_pow());
    }
    return x;
  }
  NodePtr parse_pow() {
    NodePtr x = parse_unary(true);
    while (is_op("**")) {
      const Token& at = t_[i_++];
      x = binary(at, "**", std::move(x), parse_unary(true));
    }
    return x;
  }
  NodePtr parse_unary(bool with_filter) {
    Deeper d(*this);
    NodePtr x;
    if (is_op("-") || is_op("+")) {
      x = node(N::Unary, cur());
      x->str = t_[i_++].text;
      x->kids.push_back(parse_unary(false));
    } else {
      x = parse_postfix(parse_primary());
    }
    if (with_filter) x = parse_filter_expr(std::move(x));
    return x;
  }

  NodePtr parse_primary() {
    Deeper d(*this);
    const Token& at = cur();
    switch (at.type) {
      case T::Name: {
        ++i_;
        NodePtr n = node(N::Literal, at);
        if (at.text == "true" || at.text == "True") n->value = Value::boolean(true);
        else if (at.text == "false" || at.text == "False") n->value = Value::boolean(false);
        else if (at.text == "none" || at.text == "None") n->value = Value::none();
        else n->kind = N::Name, n->str = at.text;
        return n;
      }
      case T::String: {
        NodePtr n = node(N::Literal, at);
        std::string s;
        while (cur().type == T::String) s += t_[i_++].text;  // adjacent literals join
        n->value = Value::str(std::move(s));
        return n;
      }
      case T::Int: {
        ++i_;
        NodePtr n = node(N::Literal, at);
        int64_t v = 0;
        for (char c : at.text)
          if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, c - '0', &v))
            lexer_.error(at.pos, "an integer below 2^63", "'" + at.text.substr(0, 40) + "'");
        n->value = Value::integer(v);
        return n;
      }
      case T::Float: {
        ++i_;
        NodePtr n = node(N::Literal, at);
        n->value = Value::number(std::strtod(at.text.c_str(), nullptr));
        return n;
      }
      case T::Op:
        if (at.text == "(") {
          ++i_;
          if (is_op(")")) {
            ++i_;
            return node(N::TupleLit, at);
          }
          NodePtr x = parse_expression();
          if (is_op(",")) {
            NodePtr t = node(N::TupleLit, at);
            t->kids.push_back(std::move(x));
            while (is_op(",")) {
              ++i_;
              if (is_op(")")) break;
              t->kids.push_back(parse_expression());
            }
            x = std::move(t);
          }
          expect_op(")");
          return x;
        }
        if (at.text == "[") {
          ++i_;
          NodePtr n = node(N::ListLit, at);
          while (!is_op("]")) {
            if (!n->kids.empty()) expect_op(",");
            if (is_op("]")) break;
            n->kids.push_back(parse_expression());
          }
          ++i_;
          return n;
        }
        if (at.text == "{") {
          ++i_;
          NodePtr n = node(N::DictLit, at);
          while (!is_op("}")) {
            if (!n->kids.empty()) expect_op(",");
            if (is_op("}")) break;
            n->kids.push_back(parse_expression());
            expect_op(":");
            n->kids.push_back(parse_expression());
          }
          ++i_;
          return n;
        }
        break;
      default:
        break;
    }
    error("an expression");
  }

  NodePtr parse_postfix(NodePtr x) {
    for (;;) {
      const Token& at = cur();
      if (is_op(".")) {
        ++i_;
        NodePtr n = node(N::Attr, at);
        if (cur().type == T::Name) {
          n->str = t_[i_++].text;
        } else if (cur().type == T::Int) {  // x.0 is x[0]
          n->kind = N::Item;
          NodePtr idx = node(N::Literal, cur());
          idx->value = Value::integer(std::strtoll(t_[i_++].text.c_str(), nullptr, 10));
          n->kids.push_back(std::move(x));
          n->kids.push_back(std::move(idx));
          x = std::move(n);
          continue;
        } else {
          error("an attribute name");
        }
        n->kids.push_back(std::move(x));
        x = std::move(n);
      } else if (is_op("[")) {
        ++i_;
        x = parse_subscript(at, std::move(x));
      } else if (is_op("(")) {
        x = parse_call(std::move(x));
      } else {
        return x;
      }
    }
  }

  NodePtr parse_subscript(const Token& at, NodePtr obj) {
    Deeper d(*this);
    NodePtr parts[3];
    int colons = 0;
    for (;;) {
      if (is_op("]")) break;
      if (is_op(":")) {
        if (++colons > 2) error("']'");
        ++i_;
        continue;
      }
      if (parts[colons]) error(colons ? "']'" : "':' or ']'");
      parts[colons] = parse_expression();
    }
    ++i_;
    if (colons == 0) {
      if (!parts[0]) error("an index");
      NodePtr n = node(N::Item, at);
      n->kids.push_back(std::move(obj));
      n->kids.push_back(std::move(parts[0]));
      return n;
    }
    NodePtr n = node(N::Slice, at);
    n->kids.push_back(std::move(obj));
    for (auto& p : parts) n->kids.push_back(std::move(p));
    return n;
  }

  // (args) into n->kids and n->names, after kids[0].
  void parse_args(Node& n) {
    expect_op("(");
    bool kw_seen = false;
    while (!is_op(")")) {
      if (n.kids.size() > 1) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) error("an argument (*args and **kwargs are not supported)");
      if (cur().type == T::Name && peek().type == T::Op && peek().text == "=") {
        n.names.push_back(t_[i_].text);
        i_ += 2;
        kw_seen = true;
      } else {
        if (kw_seen) error("a keyword argument (positional arguments come first)");
        n.names.emplace_back();
      }
      n.kids.push_back(parse_expression());
    }
    ++i_;
  }

  NodePtr parse_call(NodePtr callee) {
    Deeper d(*this);
    NodePtr n = node(N::Call, cur());
    n->line = callee->line, n->col = callee->col;
    n->kids.push_back(std::move(callee));
    parse_args(*n);
    return n;
  }

  NodePtr parse_filter_expr(NodePtr x) {
    for (;;) {
      const Token& at = cur();
      if (is_op("|")) {
        ++i_;
        Deeper d(*this);
        NodePtr n = node(N::Filter, at);
        n->str = expect_name("a filter name");
        n->kids.push_back(std::move(x));
        if (is_op("(")) parse_args(*n);
        x = std::move(n);
      } else if (is_name("is")) {
        ++i_;
        Deeper d(*this);
        NodePtr n = node(N::Test, at);
        if (is_name("not")) ++i_, n->flag = true;
        n->str = expect_name("a test name");
        n->kids.push_back(std::move(x));
        if (is_op("(")) {
          parse_args(*n);
        } else if ((cur().type == T::Name && !is_name("else") && !is_name("or") && !is_name("and") &&
                    !is_name("if") && !is_name("in") && !is_name("not") && !is_name("is")) ||
                   cur().type == T::String || cur().type == T::Int || cur().type == T::Float ||
                   is_op("(") || is_op("[") || is_op("{")) {
          n->names.emplace_back();
          n->kids.push_back(parse_postfix(parse_primary()));
        }
        x = std::move(n);
      } else if (is_op("(")) {
        x = parse_call(std::move(x));
      } else {
        return x;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  const Lexer& lexer_;
  std::string src_;
  size_t line_pos_ = 0;
  int line_ = 1, col_ = 1;
  int depth_ = 0;
  int loops_ = 0;
};

}  // namespace

NodePtr parse(std::string_view source) {
  if (!valid_utf8(source)) throw Error("ChatTemplate: source: expected UTF-8 text, got invalid UTF-8");
  const std::string text = normalize_newlines(source);
  Lexer lexer(text);
  Parser parser(lexer.run(), lexer);
  parser.set_source(text);
  return parser.parse_template();
}

}  // namespace mhsa::jinja
