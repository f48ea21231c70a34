// text/jinja_lex.h — the tokens of the Jinja subset (text/jinja.h), between the lexer
// (jinja_lex.cpp) and the parser (jinja_parse.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mhsa::jinja {

enum class T : uint8_t { Text, VarBegin, BlockBegin, VarEnd, BlockEnd, Name, String, Int, Float, Op, End };

struct Token {
  T type;
  std::string text;  // Text: the data; String: the decoded value; others: as written
  size_t pos;        // byte offset in Lexed::source
};

struct Lexed {
  std::string source;  // the template with its line breaks normalised: positions refer to it
  std::vector<Token> tokens;
};

// The tokens of a template, ending with T::End. Throws mhsa::Error "ChatTemplate: source: ..."
// for invalid UTF-8, an unterminated tag, string or comment, or a character no token starts with.
Lexed lex(std::string_view source);

// Throws mhsa::Error "ChatTemplate: source: line L, column C: expected <expected>, got <got>" for
// byte offset `pos` of `source` (columns count characters).
[[noreturn]] void source_error(const std::string& source, size_t pos, const std::string& expected,
                               const std::string& got);

}  // namespace mhsa::jinja
