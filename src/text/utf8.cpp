// text/utf8.cpp — strict UTF-8: decoding one character, the first invalid byte of a string, and
// the incomplete tail a stream holds back (declared in text/unicode_data.h). Apart from the
// tokenizers so that the readers and writers of JSON files (io/) can use it on their own.
#include <algorithm>
#include <string_view>

#include "text/unicode_data.h"

namespace mhsa::text {

size_t incomplete_utf8_tail(std::string_view s) {
  for (size_t back = 1; back <= std::min<size_t>(3, s.size()); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

size_t invalid_utf8_at(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Utf8 u = decode_utf8(s, i);
    if (!u.valid) return i;
    i += static_cast<size_t>(u.len);
  }
  return std::string_view::npos;
}

// Strict UTF-8, as Python decodes it: no overlong forms, no surrogates, nothing past U+10FFFF.
// A byte that does not start a well-formed sequence is invalid on its own; the next byte starts
// afresh.
Utf8 decode_utf8(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return {c, 1, true};
  int len;
  char32_t cp;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range, narrower after E0, ED, F0, F4
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2, cp = c & 0x1Fu;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, cp = c & 0x0Fu;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, cp = c & 0x07u;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return {c, 1, false};
  }
  if (s.size() - i < static_cast<size_t>(len)) return {c, 1, false};
  for (int k = 1; k < len; ++k) {
    const unsigned char t = byte(i + k);
    if (t < (k == 1 ? lo : 0x80) || t > (k == 1 ? hi : 0xBF)) return {c, 1, false};
    cp = (cp << 6) | (t & 0x3Fu);
  }
  return {cp, len, true};
}

}  // namespace mhsa::text
