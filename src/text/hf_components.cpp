// text/hf_components.cpp — the components of a tokenizer.json pipeline (see hf_components.h):
// reading each one from the file (anything outside the supported set refused by name) and
// applying it as the tokenizers crate does, edge cases included (Split's five behaviors,
// Metaspace's prepend schemes, ByteFallback's one U+FFFD per invalid byte, Strip).
#include "text/hf_components.h"

#include <algorithm>

#include "core/check.h"
#include "text/unicode_data.h"

namespace mhsa::text {

using detail::fail;
using detail::message;

namespace hf {

namespace {

int char_byte(char32_t cp) {
  if (cp < 256) return kByteChar[cp] == cp ? static_cast<int>(cp) : -1;
  for (int b = 0; b < 256; ++b)
    if (kByteChar[static_cast<size_t>(b)] == cp) return b;
  return -1;
}
}  // namespace

std::optional<std::string> from_byte_level(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const Utf8 d = decode_utf8(s, i);
    const int b = d.valid ? char_byte(d.cp) : -1;
    if (b < 0) return std::nullopt;
    out += static_cast<char>(b);
    i += static_cast<size_t>(d.len);
  }
  return out;
}

Where Where::operator/(std::string_view key) const { return {path + "." + std::string(key)}; }
Where Where::operator[](size_t i) const { return {message(path, "[", i, "]")}; }

const json& member(const json& obj, std::string_view key, const Where& w) {
  if (!obj.is_object()) fail(kFn, w.path, "an object", detail::json_excerpt(obj));
  const auto it = obj.find(key);
  if (it == obj.end()) fail(kFn, (w / key).path, "a value", "none");
  return *it;
}
const json* optional_member(const json& obj, std::string_view key) {
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}
std::string get_string(const json& obj, std::string_view key, const Where& w) {
  const json& v = member(obj, key, w);
  if (!v.is_string()) fail(kFn, (w / key).path, "a string", detail::json_excerpt(v));
  return v.get<std::string>();
}
bool get_bool(const json& obj, std::string_view key, const Where& w, bool fallback) {
  const json* v = optional_member(obj, key);
  if (!v) return fallback;
  if (!v->is_boolean()) fail(kFn, (w / key).path, "true or false", detail::json_excerpt(*v));
  return v->get<bool>();
}
const json& get_array(const json& obj, std::string_view key, const Where& w) {
  const json& v = member(obj, key, w);
  if (!v.is_array()) fail(kFn, (w / key).path, "an array", detail::json_excerpt(v));
  return v;
}
std::string type_of(const json& obj, const Where& w) { return get_string(obj, "type", w); }
[[noreturn]] void unsupported(const Where& w, std::string_view what, const std::string& type, std::string_view supported) {
  fail(kFn, w.path, message(what, " of a supported type (", supported, ")"), message("'", detail::printable(type), "'"));
}

void Pattern::find(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  if (!regex) {
    for (size_t at = s.find(literal); at != std::string_view::npos; at = s.find(literal, at + literal.size()))
      out.emplace_back(at, at + literal.size());
    return;
  }
  thread_local std::vector<Unit> units;  // reused: a text's characters, 16 bytes each
  regex->find_all(s, units, out);
}

}  // namespace hf

using hf::json;
using hf::kFn;
using hf::Pattern;
using hf::Pieces;
using hf::Where;
using hf::get_array;
using hf::get_bool;
using hf::get_string;
using hf::member;
using hf::optional_member;
using hf::type_of;
using hf::unsupported;
using hf::from_byte_level;
using hf::kByteChar;

namespace {

Pattern read_pattern(const json& obj, const Where& w) {
  const json& p = member(obj, "pattern", w);
  Pattern out;
  if (p.is_object() && p.size() == 1 && p.contains("String") && p["String"].is_string()) {
    out.literal = p["String"].get<std::string>();
    if (out.literal.empty()) fail(kFn, (w / "pattern").path, "a non-empty string", "\"\"");
  } else if (p.is_object() && p.size() == 1 && p.contains("Regex") && p["Regex"].is_string()) {
    out.regex = std::make_unique<Regex>(p["Regex"].get<std::string>(), kFn, (w / "pattern.Regex").path);
  } else {
    fail(kFn, (w / "pattern").path, "{\"String\": ...} or {\"Regex\": ...}", detail::json_excerpt(p));
  }
  return out;
}

// Cuts s = text[base, base + s.size()) at the matches (byte ranges of s) the way tokenizers'
// split(pattern, behavior) does, appending the pieces as ranges of the text; empty pieces go.
void split_by(std::string_view s, size_t base, const std::vector<std::pair<size_t, size_t>>& matches,
              HfTokenizer::Behavior b, bool invert, bool origin, std::vector<Pieces::Range>& out) {
  struct Part {
    size_t begin, end;
    bool match;
  };
  if (s.empty()) return;
  thread_local std::vector<Part> parts;
  parts.clear();
  size_t prev = 0;
  for (const auto& [mb, me] : matches) {
    if (prev < mb) parts.push_back({prev, mb, false});
    parts.push_back({mb, me, true});
    prev = me;
  }
  if (prev < s.size()) parts.push_back({prev, s.size(), false});
  if (invert)
    for (Part& p : parts) p.match = !p.match;
  const size_t first = out.size();
  const auto push = [&](const Part& p) { out.push_back({base + p.begin, base + p.end, origin && p.begin == 0}); };
  bool previous = false;
  using B = HfTokenizer::Behavior;
  switch (b) {
    case B::removed:
      for (const Part& p : parts)
        if (!p.match) push(p);
      break;
    case B::isolated:
      for (const Part& p : parts) push(p);
      break;
    case B::merged_with_previous:
      for (const Part& p : parts) {
        if (p.match && !previous && out.size() > first) out.back().end = base + p.end;
        else push(p);
        previous = p.match;
      }
      break;
    case B::merged_with_next:  // a match joins the part after it when that one is not a match
      for (size_t i = 0; i < parts.size(); ++i) {
        if (parts[i].match && i + 1 < parts.size() && !parts[i + 1].match) {
          parts[i + 1].begin = parts[i].begin;
          continue;
        }
        push(parts[i]);
      }
      break;
    case B::contiguous:
      for (const Part& p : parts) {
        if (p.match == previous && out.size() > first) out.back().end = base + p.end;
        else push(p);
        previous = p.match;
      }
      break;
  }
  out.erase(std::remove_if(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(),
                           [](const Pieces::Range& r) { return r.end == r.begin; }),
            out.end());
}

std::string replace_all(std::string_view s, const Pattern& p, std::string_view content) {
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  matches.clear();
  p.find(s, matches);
  std::string out;
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    out.append(s.substr(prev, b - prev));
    out.append(content);
    prev = e;
  }
  out.append(s.substr(prev));
  return out;
}

std::string single_char(const json& obj, std::string_view key, const Where& w) {
  const std::string s = get_string(obj, key, w);
  if (s.empty() || static_cast<size_t>(decode_utf8(s, 0).len) != s.size() || !decode_utf8(s, 0).valid)
    fail(kFn, (w / key).path, "one character", detail::quote(s));
  return s;
}

bool decode_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Utf8 d = decode_utf8(s, i);
    if (!d.valid) return false;
    i += static_cast<size_t>(d.len);
  }
  return true;
}

// "<0xNN>" as tokenizers reads it (Rust's u8::from_str_radix, so "<0x+F>" is 15 too).
std::optional<uint8_t> byte_token(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return std::nullopt;
  const auto digit = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  const int hi = digit(t[3]), lo = digit(t[4]);
  if (t[3] == '+' && lo >= 0) return static_cast<uint8_t>(lo);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

}  // namespace

// ---- normalizers --------------------------------------------------------------------------------

HfTokenizer::Normalizer HfTokenizer::Normalizer::read(const json& j, const Where& w) {
  const std::string t = type_of(j, w);
  Normalizer n{Type::sequence, {}, {}, {}, NormalForm::nfc};
  if (t == "Sequence") {
    const json& list = get_array(j, "normalizers", w);
    for (size_t i = 0; i < list.size(); ++i) n.parts.push_back(read(list[i], (w / "normalizers")[i]));
  } else if (t == "Prepend") {
    n.type = Type::prepend, n.text = get_string(j, "prepend", w);
  } else if (t == "Replace") {
    n.type = Type::replace, n.pattern = read_pattern(j, w), n.text = get_string(j, "content", w);
  } else if (t == "NFC" || t == "NFD" || t == "NFKC" || t == "NFKD") {
    n.type = Type::unicode;
    n.form = t == "NFC" ? NormalForm::nfc : t == "NFD" ? NormalForm::nfd : t == "NFKC" ? NormalForm::nfkc : NormalForm::nfkd;
  } else {
    unsupported(w, "a normalizer", t, "Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD");
  }
  return n;
}
std::string HfTokenizer::Normalizer::apply(std::string s) const {
  switch (type) {
    case Type::sequence:
      for (const Normalizer& p : parts) s = p.apply(std::move(s));
      return s;
    case Type::prepend: return s.empty() ? s : text + s;
    case Type::replace: return replace_all(s, pattern, text);
    default: return normalize(s, form);
  }
}

// ---- pre-tokenizers ------------------------------------------------------------------------------

HfTokenizer::PreTokenizer HfTokenizer::PreTokenizer::read(const json& j, const Where& w) {
  const std::string t = type_of(j, w);
  PreTokenizer p{.type = Type::sequence};
  if (t == "Sequence") {
    const json& list = get_array(j, "pretokenizers", w);
    for (size_t i = 0; i < list.size(); ++i) {
      p.parts.push_back(read(list[i], (w / "pretokenizers")[i]));
      if (i + 1 < list.size() && p.parts.back().ends_byte_level())
        fail(kFn, (w / "pretokenizers")[i].path, "ByteLevel as the last pre-tokenizer", "one after it");
    }
  } else if (t == "Split") {
    p.type = Type::split;
    p.pattern = read_pattern(j, w);
    p.invert = get_bool(j, "invert", w, false);
    const std::string b = get_string(j, "behavior", w);
    if (b == "Removed") p.behavior = Behavior::removed;
    else if (b == "Isolated") p.behavior = Behavior::isolated;
    else if (b == "MergedWithPrevious") p.behavior = Behavior::merged_with_previous;
    else if (b == "MergedWithNext") p.behavior = Behavior::merged_with_next;
    else if (b == "Contiguous") p.behavior = Behavior::contiguous;
    else unsupported(w / "behavior", "a split behavior", b, "Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
  } else if (t == "Digits") {  // tokenizers' Digits: Rust's char::is_numeric (\p{N}) split off
    p.type = Type::split;
    p.pattern.regex = std::make_unique<Regex>("\\p{N}", kFn, w.path);
    p.behavior = get_bool(j, "individual_digits", w, false) ? Behavior::isolated : Behavior::contiguous;
  } else if (t == "ByteLevel") {
    p.type = Type::byte_level;
    p.add_prefix_space = get_bool(j, "add_prefix_space", w, true);
    p.use_regex = get_bool(j, "use_regex", w, true);
  } else if (t == "Metaspace") {
    p.type = Type::metaspace;
    p.replacement = single_char(j, "replacement", w);
    p.split = get_bool(j, "split", w, true);
    if (const json* s = optional_member(j, "prepend_scheme")) {
      const std::string v = s->is_string() ? s->get<std::string>() : "";
      if (v == "always") p.prepend = Prepend::always;
      else if (v == "first") p.prepend = Prepend::first;
      else if (v == "never") p.prepend = Prepend::never;
      else fail(kFn, (w / "prepend_scheme").path, "\"always\", \"first\" or \"never\"", detail::json_excerpt(*s));
    } else {
      p.prepend = get_bool(j, "add_prefix_space", w, true) ? Prepend::always : Prepend::never;
    }
  } else {
    unsupported(w, "a pre-tokenizer", t, "Sequence, Split, Digits, ByteLevel, Metaspace");
  }
  return p;
}
Regex::Scanner HfTokenizer::PreTokenizer::scanner() const {
  const auto no_op = [](const PreTokenizer& p) { return p.type == Type::byte_level && !p.add_prefix_space && !p.use_regex; };
  switch (type) {
    case Type::split: return behavior == Behavior::isolated && !invert && pattern.regex ? pattern.regex->scanner() : nullptr;
    case Type::byte_level: return !add_prefix_space && use_regex ? pretoken_end : nullptr;
    case Type::sequence:
      if (parts.size() == 1 || (parts.size() == 2 && no_op(parts[1]))) return parts[0].scanner();
      return nullptr;
    default: return nullptr;
  }
}

bool HfTokenizer::PreTokenizer::ends_byte_level() const {
  if (type == Type::byte_level) return true;
  return type == Type::sequence && !parts.empty() && parts.back().ends_byte_level();
}

void HfTokenizer::PreTokenizer::apply(Pieces& pieces) const {
  std::vector<Pieces::Range> out;
  switch (type) {
    case Type::sequence:
      for (const PreTokenizer& p : parts) p.apply(pieces);
      return;
    case Type::split: {
      thread_local std::vector<std::pair<size_t, size_t>> matches;
      for (const Pieces::Range& r : pieces.ranges) {
        matches.clear();
        pattern.find(pieces.view(r), matches);
        split_by(pieces.view(r), r.begin, matches, behavior, invert, r.origin, out);
      }
      break;
    }
    case Type::byte_level:
      if (add_prefix_space) {
        std::string text;
        text.reserve(pieces.text.size() + pieces.ranges.size());
        for (Pieces::Range& r : pieces.ranges) {
          const std::string_view s = pieces.view(r);
          const size_t begin = text.size();
          if (!s.starts_with(' ')) text += ' ';
          text += s;
          r = {begin, text.size(), r.origin};
        }
        pieces.text = std::move(text);
      }
      if (!use_regex) return;
      for (const Pieces::Range& r : pieces.ranges) {
        const std::string_view s = pieces.view(r);
        for (size_t pos = 0; pos < s.size();) {
          const size_t end = pretoken_end(s, pos);
          out.push_back({r.begin + pos, r.begin + end, r.origin && pos == 0});
          pos = end;
        }
      }
      break;
    case Type::metaspace: {
      Pattern space, rep;
      space.literal = " ";
      rep.literal = replacement;
      std::string text;
      std::vector<std::pair<size_t, size_t>> matches;
      for (const Pieces::Range& r : pieces.ranges) {
        std::string s = replace_all(pieces.view(r), space, replacement);
        if (!s.starts_with(replacement) && (prepend == Prepend::always || (prepend == Prepend::first && r.origin)))
          s.insert(0, replacement);
        const size_t begin = text.size();
        text += s;
        if (!split) {
          if (!s.empty()) out.push_back({begin, text.size(), r.origin});
          continue;
        }
        matches.clear();
        rep.find(s, matches);
        split_by(s, begin, matches, Behavior::merged_with_next, false, r.origin, out);
      }
      pieces.text = std::move(text);
      break;
    }
  }
  pieces.ranges = std::move(out);
}

// ---- decoders ------------------------------------------------------------------------------------

HfTokenizer::Decoder HfTokenizer::Decoder::read(const json& j, const Where& w) {
  const std::string t = type_of(j, w);
  Decoder d{.type = Type::sequence};
  if (t == "Sequence") {
    const json& list = get_array(j, "decoders", w);
    for (size_t i = 0; i < list.size(); ++i) d.parts.push_back(read(list[i], (w / "decoders")[i]));
  } else if (t == "ByteLevel") {
    d.type = Type::byte_level;
  } else if (t == "Metaspace") {
    d.type = Type::metaspace;
    d.from = single_char(j, "replacement", w);
    if (const json* s = optional_member(j, "prepend_scheme")) d.strip_first = !(s->is_string() && s->get<std::string>() == "never");
    else d.strip_first = get_bool(j, "add_prefix_space", w, true);
  } else if (t == "Replace") {
    d.type = Type::replace;
    Pattern p = read_pattern(j, w);
    if (p.regex) fail(kFn, (w / "pattern").path, "a {\"String\": ...} pattern (a decoder's Regex is not supported)", "a Regex");
    d.from = p.literal, d.to = get_string(j, "content", w);
  } else if (t == "ByteFallback") {
    d.type = Type::byte_fallback;
  } else if (t == "Fuse") {
    d.type = Type::fuse;
  } else if (t == "Strip") {
    d.type = Type::strip;
    d.content = decode_utf8(single_char(j, "content", w), 0).cp;
    d.start = detail::json_integer<uint32_t>(member(j, "start", w), kFn, (w / "start").path);
    d.stop = detail::json_integer<uint32_t>(member(j, "stop", w), kFn, (w / "stop").path);
  } else {
    unsupported(w, "a decoder", t, "Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip");
  }
  return d;
}

void HfTokenizer::Decoder::apply(std::vector<std::string>& tokens, bool exact, bool first_is_start) const {
  switch (type) {
    case Type::sequence:
      for (const Decoder& d : parts) d.apply(tokens, exact, first_is_start);
      return;
    case Type::byte_level: {
      std::string bytes;
      for (const std::string& t : tokens) {
        const auto b = from_byte_level(t);
        bytes += b ? *b : t;
      }
      tokens.assign(1, exact ? bytes : lossy_utf8(bytes));
      return;
    }
    case Type::metaspace:
      for (size_t i = 0; i < tokens.size(); ++i) {
        std::string out;
        const std::string& t = tokens[i];
        for (size_t at = 0; at < t.size();) {
          if (t.compare(at, from.size(), from) == 0) {
            if (!(i == 0 && first_is_start && strip_first)) out += ' ';
            at += from.size();
          } else {
            out += t[at++];
          }
        }
        tokens[i] = std::move(out);
      }
      return;
    case Type::replace: {
      Pattern p;
      p.literal = from;
      for (std::string& t : tokens) t = replace_all(t, p, to);
      return;
    }
    case Type::byte_fallback: {
      std::vector<std::string> out;
      std::string pending;
      size_t count = 0;
      const auto flush = [&] {
        if (count == 0) return;
        if (exact || decode_valid(pending)) out.push_back(pending);
        else for (size_t k = 0; k < count; ++k) out.push_back("\xEF\xBF\xBD");
        pending.clear();
        count = 0;
      };
      for (std::string& t : tokens) {
        if (const auto b = byte_token(t)) {
          pending += static_cast<char>(*b);
          ++count;
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      tokens = std::move(out);
      return;
    }
    case Type::fuse: {
      std::string all;
      for (const std::string& t : tokens) all += t;
      tokens.assign(1, std::move(all));
      return;
    }
    case Type::strip:
      for (std::string& t : tokens) {
        size_t b = 0, e = t.size();
        std::string c;
        append_utf8(c, content);
        for (size_t k = 0; k < start && first_is_start && t.compare(b, c.size(), c) == 0 && b < e; ++k) b += c.size();
        for (size_t k = 0; k < stop && e >= b + c.size() && t.compare(e - c.size(), c.size(), c) == 0; ++k) e -= c.size();
        t = t.substr(b, e - b);
      }
      return;
  }
}

}  // namespace mhsa::text
