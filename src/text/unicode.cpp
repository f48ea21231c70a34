// text/unicode.cpp — lookups in the generated Unicode tables (unicode_props.cpp): general
// category, White_Space, case folds, combining classes; UTF-8 encoding; and the four Unicode
// normalisation forms (NFC, NFD, NFKC, NFKD) that tokenizer.json normalizers name. Not ICU: no
// collation, no case mapping beyond single-character folds.
#include <algorithm>
#include <array>

#include "text/normalize.h"
#include "text/unicode_data.h"

namespace mhsa::text {
namespace {

constexpr std::array<Category, 128> kAsciiCategory = [] {
  std::array<Category, 128> t{};
  for (char32_t c = 0; c < 128; ++c) {
    if (c < 0x20 || c == 0x7F) t[c] = Category::Cc;
    else if (c == ' ') t[c] = Category::Zs;
    else if (c >= '0' && c <= '9') t[c] = Category::Nd;
    else if (c >= 'A' && c <= 'Z') t[c] = Category::Lu;
    else if (c >= 'a' && c <= 'z') t[c] = Category::Ll;
    else if (c == '$') t[c] = Category::Sc;
    else if (c == '+' || c == '<' || c == '=' || c == '>' || c == '|' || c == '~') t[c] = Category::Sm;
    else if (c == '^' || c == '`') t[c] = Category::Sk;
    else if (c == '_') t[c] = Category::Pc;
    else if (c == '-') t[c] = Category::Pd;
    else if (c == '(' || c == '[' || c == '{') t[c] = Category::Ps;
    else if (c == ')' || c == ']' || c == '}') t[c] = Category::Pe;
    else t[c] = Category::Po;
  }
  return t;
}();

template <class Range>
const Range* find_range(std::span<const Range> ranges, char32_t cp) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp, [](char32_t c, const Range& r) { return c < r.first; });
  if (it == ranges.begin() || cp > (--it)->last) return nullptr;
  return &*it;
}

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

void decompose(char32_t cp, bool compat, std::u32string& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {  // Hangul syllables, algorithmically
    const char32_t s = cp - kSBase;
    out += kLBase + s / kNCount;
    out += kVBase + (s % kNCount) / kTCount;
    if (s % kTCount) out += kTBase + s % kTCount;
    return;
  }
  const auto table = decompositions();
  auto it = std::lower_bound(table.begin(), table.end(), cp, [](const Decomposition& d, char32_t c) { return d.cp < c; });
  for (; it != table.end() && it->cp == cp; ++it) {
    if (it->compat && !compat) continue;
    // With compat, the NFKD entry (listed after the NFD one) wins when there is one.
    const auto next = it + 1;
    if (compat && !it->compat && next != table.end() && next->cp == cp) continue;
    out.append(decomposition_pool().data() + it->offset, it->length);
    return;
  }
  out += cp;
}

char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto table = compositions();
  const auto it = std::lower_bound(table.begin(), table.end(), std::pair{a, b}, [](const Composition& c, std::pair<char32_t, char32_t> k) {
    return c.first != k.first ? c.first < k.first : c.second < k.second;
  });
  return it != table.end() && it->first == a && it->second == b ? it->composite : 0;
}

// One segment that starts at a starter: decompose, order the marks, recompose.
void normalize_segment(std::u32string_view in, bool compat, bool compose, std::u32string& buf, std::string& out) {
  buf.clear();
  for (const char32_t cp : in) decompose(cp, compat, buf);
  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < buf.size();) {
    if (combining_class(buf[i]) == 0) { ++i; continue; }
    size_t j = i;
    while (j < buf.size() && combining_class(buf[j]) != 0) ++j;
    std::stable_sort(buf.begin() + static_cast<std::ptrdiff_t>(i), buf.begin() + static_cast<std::ptrdiff_t>(j),
                     [](char32_t x, char32_t y) { return combining_class(x) < combining_class(y); });
    i = j;
  }
  if (compose && !buf.empty()) {
    size_t starter = std::u32string::npos, kept = 0;
    int last_ccc = -1;
    for (size_t i = 0; i < buf.size(); ++i) {
      const char32_t cp = buf[i];
      const int ccc = combining_class(cp);
      if (starter != std::u32string::npos && (last_ccc < ccc || (last_ccc == 0 && kept == starter + 1))) {
        if (const char32_t c = compose_pair(buf[starter], cp)) {
          buf[starter] = c;
          continue;
        }
      }
      if (ccc == 0) {
        starter = kept;
        last_ccc = 0;
      } else {
        last_ccc = ccc;
      }
      buf[kept++] = cp;
    }
    buf.resize(kept);
  }
  for (const char32_t cp : buf) append_utf8(out, cp);
}

}  // namespace

Category category(char32_t cp) {
  if (cp < 128) return kAsciiCategory[cp];
  const CategoryRange* r = find_range(category_ranges(), cp);
  return r ? r->cat : Category::Cn;
}

bool is_white_space(char32_t cp) { return char_class(cp) == CharClass::space; }

char32_t simple_fold(char32_t cp) {
  const auto folds = case_folds();
  const auto it = std::lower_bound(folds.begin(), folds.end(), cp, [](const CodePointPair& p, char32_t c) { return p.from < c; });
  return it != folds.end() && it->from == cp ? it->to : cp;
}

uint8_t combining_class(char32_t cp) {
  if (cp < 0x300) return 0;
  const CombiningRange* r = find_range(combining_ranges(), cp);
  return r ? r->ccc : 0;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// ASCII is never changed by any form and never combines with what precedes it, so the text is
// cut before each ASCII byte that follows non-ASCII text, and only the non-ASCII stretches (with
// the starter before them) go through the full algorithm. Invalid UTF-8 bytes pass through.
std::string normalize(std::string_view text, NormalForm form) {
  const bool compat = form == NormalForm::nfkc || form == NormalForm::nfkd;
  const bool compose = form == NormalForm::nfc || form == NormalForm::nfkc;
  std::string out;
  out.reserve(text.size());
  std::u32string segment, buf;
  const auto flush = [&] {
    if (!segment.empty()) normalize_segment(segment, compat, compose, buf, out);
    segment.clear();
  };
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {  // a run of ASCII, copied as it is
      flush();
      size_t end = i + 1;
      while (end < text.size() && static_cast<unsigned char>(text[end]) < 0x80) ++end;
      // The run's last character may compose with the marks after it: it starts the next segment.
      const bool more = end < text.size();
      out.append(text.substr(i, end - i - (more ? 1 : 0)));
      if (more) segment += static_cast<char32_t>(text[end - 1]);
      i = end;
      continue;
    }
    const Utf8 d = decode_utf8(text, i);
    if (!d.valid) {
      flush();
      out += text[i];
    } else {
      segment += d.cp;
    }
    i += static_cast<size_t>(d.len);
  }
  flush();
  return out;
}

}  // namespace mhsa::text
