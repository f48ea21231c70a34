// io/json.cpp — see io/json.h.
#include "io/json.h"

namespace mhsa::detail {
namespace {

using json = nlohmann::json;

// Thrown from the parser's callback to stop at the first level too deep.
struct TooDeep {};

// Appends the JSON text of v to out until out holds more than `cap` characters. Recursive, which
// is safe: parse_json bounds the depth of every value read from a file.
void append_excerpt(const json& v, std::string& out, size_t cap) {
  const auto string_text = [](std::string_view s, size_t n) {  // strings cut before escaping
    return json(std::string(s.substr(0, n))).dump(-1, ' ', false, json::error_handler_t::replace);
  };
  if (v.is_array() || v.is_object()) {
    out += v.is_array() ? '[' : '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (out.size() > cap) return;
      if (!first) out += ", ";
      first = false;
      if (v.is_object()) out += string_text(it.key(), cap) + ": ";
      append_excerpt(*it, out, cap);
    }
    out += v.is_array() ? ']' : '}';
  } else if (v.is_string()) {
    out += string_text(v.get_ref<const std::string&>(), cap + 1);
  } else {
    out += v.dump();
  }
}

// s cut after n bytes, at a UTF-8 character boundary, with "…" when anything was cut.
std::string cut(std::string s, size_t n = kExcerptChars) {
  if (s.size() <= n) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  s.resize(n);
  return s + "…";
}

// Text's first kExcerptChars + 1 bytes as JSON escapes them (invalid UTF-8 replaced), unquoted.
std::string escaped(std::string_view text) {
  const std::string s = json(std::string(text.substr(0, kExcerptChars + 1))).dump(-1, ' ', false, json::error_handler_t::replace);
  return s.substr(1, s.size() - 2);
}

// Numbers, booleans and null show what they are; containers and strings say it.
const char* type_words(const json& v) {
  return v.is_object() ? "an object " : v.is_array() ? "an array " : v.is_string() ? "a string " : "";
}

}  // namespace

namespace {

template <class Json>
Json parse_bounded(std::string_view text, std::string_view fn, std::string_view arg, std::string_view what) {
  const typename Json::parser_callback_t limit = [](int depth, typename Json::parse_event_t event, Json&) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      throw TooDeep{};
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), limit);
  } catch (const TooDeep&) {
    fail(fn, arg, message(what, " nested at most ", kMaxJsonDepth, " levels deep"), "deeper nesting");
  } catch (const typename Json::exception& e) {
    fail(fn, arg, std::string(what), "invalid JSON (" + parse_error_text(e) + ")");
  }
}

}  // namespace

json parse_json(std::string_view text, std::string_view fn, std::string_view arg, std::string_view what) {
  return parse_bounded<json>(text, fn, arg, what);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, std::string_view fn, std::string_view arg,
                                          std::string_view what) {
  return parse_bounded<nlohmann::ordered_json>(text, fn, arg, what);
}

std::string parse_error_text(const std::exception& e) {
  std::string why = e.what();  // "[json.exception.parse_error.101] parse error at line 2, ...; last read: '...'"
  if (const size_t tag = why.find("] "); tag != std::string::npos) why.erase(0, tag + 2);
  // What follows these is a token of the file, of any length.
  for (const std::string_view token : {"last read: ", "number overflow parsing "})
    if (const size_t at = why.find(token); at != std::string::npos)
      why = why.substr(0, at + token.size()) + printable(std::string_view(why).substr(at + token.size()));
  return cut(why, 4 * kExcerptChars);
}

std::string json_excerpt(const json& v) {
  std::string text;
  append_excerpt(v, text, kExcerptChars);
  return type_words(v) + cut(std::move(text));
}

std::string printable(std::string_view text) { return cut(escaped(text)); }

std::string quote(std::string_view text) {
  std::string out(1, '\'');  // not "'" + printable(text): g++ 12 warns falsely (-Wrestrict) about that
  return out.append(printable(text)).append(1, '\'');
}

}  // namespace mhsa::detail
