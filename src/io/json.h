// io/json.h — parsing JSON from files (safetensors headers, config.json, checkpoint metadata) and
// showing its values in error messages, both bounded: a parse refuses nesting deeper than
// kMaxJsonDepth (formatting or walking a value 100,000 levels deep overflows the stack), and
// messages show a value's type and its first characters, never the whole of it. Not a JSON
// library: nlohmann::json does the work.
#pragma once

#include <cstdint>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>

#include "core/check.h"

namespace mhsa::detail {

// No file the library reads needs more than a few levels; this leaves room and stays far from
// any stack limit.
constexpr int kMaxJsonDepth = 64;
// The most characters of a value (or of a name from a file) that a message shows.
constexpr size_t kExcerptChars = 60;

// `text` as JSON, or mhsa::Error "<fn>: <arg>: expected <what>, got ..." for invalid JSON (with a
// short reason) or nesting deeper than kMaxJsonDepth.
nlohmann::json parse_json(std::string_view text, std::string_view fn, std::string_view arg,
                          std::string_view what = "JSON");

// The same, keeping the objects' keys in the text's order (as Python's dicts do).
nlohmann::ordered_json parse_ordered_json(std::string_view text, std::string_view fn, std::string_view arg,
                                          std::string_view what = "JSON");

// nlohmann's message for a parse error, without its tag and with the token it quotes (file text
// of any length) cut.
std::string parse_error_text(const std::exception& e);

// A value for the "got" part of a message: its type and its JSON text, cut after kExcerptChars
// with "…" ("an array [1, 2, 3]", "a string \"F64\"", "-1", "null").
std::string json_excerpt(const nlohmann::json& v);

// Text from a file (a name, a key, a parser's message) safe to print: control characters and
// quotes escaped as JSON escapes them, invalid UTF-8 replaced, cut after kExcerptChars with "…".
// quote() puts it in single quotes.
std::string printable(std::string_view text);
std::string quote(std::string_view text);

// v as an integer of type T, or mhsa::Error naming fn and arg for anything else: another type, a
// value outside T's range (never truncated or wrapped).
template <class T>
T json_integer(const nlohmann::json& v, std::string_view fn, std::string_view arg) {
  constexpr auto lo = std::numeric_limits<T>::min();
  constexpr auto hi = std::numeric_limits<T>::max();
  bool ok = false;
  if (v.is_number_unsigned()) {
    ok = v.get<uint64_t>() <= static_cast<uint64_t>(hi);
  } else if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    ok = x >= 0 ? static_cast<uint64_t>(x) <= static_cast<uint64_t>(hi)
                : std::is_signed_v<T> && x >= static_cast<int64_t>(lo);
  }
  if (!ok) fail(fn, arg, message("an integer in [", +lo, ", ", +hi, "]"), json_excerpt(v));
  return v.get<T>();
}

}  // namespace mhsa::detail
