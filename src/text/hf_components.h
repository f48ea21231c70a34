// text/hf_components.h — the pipeline components of tokenizer.json (normalizers, pre-tokenizers,
// decoders, the {"String"}/{"Regex"} patterns they share) and the JSON-reading helpers the loader
// uses too. hf_components.cpp reads and applies them; hf_tokenizer.cpp loads a whole file and runs
// the pipeline. Private to hf_tokenizer*.cpp and hf_components.cpp.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/json.h"
#include "text/hf_tokenizer.h"
#include "text/normalize.h"
#include "text/regex.h"

namespace mhsa::text::hf {

using json = nlohmann::json;

inline constexpr std::string_view kFn = "Tokenizer::load";

// GPT-2's printable byte alphabet (as tokenizer.cpp): byte → character.
inline constexpr std::array<char32_t, 256> kByteChar = [] {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (char32_t b = 0; b < 256; ++b) map[b] = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174 ? b : next++;
  return map;
}();
// The bytes a byte-level spelling stands for; nullopt if a character is outside the alphabet.
std::optional<std::string> from_byte_level(std::string_view s);

struct Where {  // a place in a file, for messages: "tokenizer.json pre_tokenizer.pretokenizers[1]"
  std::string path;
  Where operator/(std::string_view key) const;
  Where operator[](size_t i) const;
};
const json& member(const json& obj, std::string_view key, const Where& w);
const json* optional_member(const json& obj, std::string_view key);  // null when absent or null
std::string get_string(const json& obj, std::string_view key, const Where& w);
bool get_bool(const json& obj, std::string_view key, const Where& w, bool fallback);
const json& get_array(const json& obj, std::string_view key, const Where& w);
std::string type_of(const json& obj, const Where& w);
[[noreturn]] void unsupported(const Where& w, std::string_view what, const std::string& type, std::string_view supported);

// A {"String": s} or {"Regex": r} pattern.
struct Pattern {
  std::string literal;
  std::unique_ptr<Regex> regex;
  // Matches of the pattern in `s`, as byte ranges, in order, appended to `out`.
  void find(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;
};

// The pieces a pre-tokenizer works on: ranges of one text. Splitting only adds ranges; a step
// that changes the text (ByteLevel's prefix space, Metaspace) writes a new text.
struct Pieces {
  struct Range {
    size_t begin, end;
    bool origin;  // starts where the original text starts (Metaspace's prepend_scheme "first")
  };
  std::string text;
  std::vector<Range> ranges;
  std::string_view view(const Range& r) const { return std::string_view(text).substr(r.begin, r.end - r.begin); }
};

}  // namespace mhsa::text::hf

namespace mhsa::text {

struct HfTokenizer::Normalizer {
  enum class Type { sequence, prepend, replace, unicode } type;
  std::vector<Normalizer> parts;
  std::string text;  // prepend: what; replace: the content
  hf::Pattern pattern;
  NormalForm form = NormalForm::nfc;

  static Normalizer read(const hf::json& j, const hf::Where& w);
  std::string apply(std::string s) const;
};

struct HfTokenizer::PreTokenizer {
  enum class Type { sequence, split, byte_level, metaspace } type;
  std::vector<PreTokenizer> parts{};
  hf::Pattern pattern{};
  Behavior behavior = Behavior::isolated;
  bool invert = false, add_prefix_space = false, use_regex = true, split = true;
  std::string replacement{};
  enum class Prepend { always, first, never } prepend = Prepend::always;

  static PreTokenizer read(const hf::json& j, const hf::Where& w);
  bool ends_byte_level() const;
  void apply(hf::Pieces& pieces) const;
  // When the whole pre-tokenizer is one hand-scanned pattern (regex.h's Regex::scanner): a Split
  // of it, Isolated, not inverted, or ByteLevel's own regex without a prefix space, alone or with
  // a ByteLevel that changes no piece after it. Its pieces are then the scanner's matches.
  Regex::Scanner scanner() const;
};

struct HfTokenizer::Decoder {
  enum class Type { sequence, byte_level, metaspace, replace, byte_fallback, fuse, strip } type;
  std::vector<Decoder> parts{};
  std::string from{}, to{};  // replace; metaspace: from = the replacement
  bool strip_first = true;  // metaspace: prepend_scheme != never
  char32_t content = 0;     // strip
  size_t start = 0, stop = 0;

  static Decoder read(const hf::json& j, const hf::Where& w);
  // exact: the bytes themselves, without the U+FFFD that tokenizers puts for invalid UTF-8.
  void apply(std::vector<std::string>& tokens, bool exact, bool first_is_start) const;
};

}  // namespace mhsa::text
