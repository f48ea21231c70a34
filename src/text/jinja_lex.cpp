// text/jinja_lex.cpp — the lexer of the Jinja subset (text/jinja_lex.h): template text into
// tokens, with jinja2's whitespace handling under trim_blocks and lstrip_blocks (transformers'
// settings): line breaks normalised to "\n", one trailing line break dropped, the first line
// break after a block or comment tag removed, spaces before a tag alone on its line removed, and
// `-` / `+` on either side of a tag. String literals are decoded as Python's unicode-escape
// decodes them. Not handled: line statements, `raw`, custom delimiters.
#include "text/jinja_lex.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "mhsa/error.h"
#include "text/jinja.h"

namespace mhsa::jinja {
namespace {

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
    source_error(s_, pos, expected, got);
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


}  // namespace

void source_error(const std::string& s, size_t pos, const std::string& expected, const std::string& got) {
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < pos && i < s.size(); ++i)
    if (s[i] == '\n') ++line, line_start = i + 1;
  int col = 1;
  for (size_t i = line_start; i < pos && i < s.size(); ++i) col += (static_cast<unsigned char>(s[i]) >> 6) != 2;
  throw Error(detail::message("ChatTemplate: source: line ", line, ", column ", col, ": expected ", expected,
                              ", got ", got));
}

Lexed lex(std::string_view source) {
  // The tree takes ~120 bytes per byte of source at worst: a bound on the text bounds the memory.
  if (source.size() > kMaxSourceBytes)
    throw Error(detail::message("ChatTemplate: source: expected a template of at most ", kMaxSourceBytes,
                                " bytes, got ", source.size(), " bytes"));
  if (!valid_utf8(source)) throw Error("ChatTemplate: source: expected UTF-8 text, got invalid UTF-8");
  Lexed out;
  out.source = normalize_newlines(source);
  out.tokens = Lexer(out.source).run();
  return out;
}

}  // namespace mhsa::jinja
