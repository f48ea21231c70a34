// text/tokenizer.cpp — mhsa::Tokenizer: GPT-2's byte-level BPE (loading and validating the vocab
// and merges, the pre-tokeniser, hand-written scanners for GPT-2's regex and Llama 3's and
// Qwen2's Split regex, encoding and decoding;
// equal to tiktoken's and Hugging Face tokenizers' for GPT-2, tests/python), and the front of
// tokenizer.json files, whose work hf_tokenizer.cpp does.
#include "mhsa/tokenizer.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "core/check.h"
#include "io/checkpoint_dir.h"
#include "io/file.h"
#include "io/gguf.h"
#include "io/json.h"
#include "mhsa/chat_template.h"
#include "text/bpe.h"
#include "text/hf_tokenizer.h"
#include "text/unicode_data.h"
#include "text/word_cache.h"

namespace mhsa {
namespace text {
namespace {

CharClass lookup(char32_t cp) {
  const auto ranges = class_ranges();
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                             [](char32_t c, const CodePointRange& r) { return c < r.first; });
  if (it == ranges.begin() || cp > (--it)->last) return CharClass::other;
  return it->cls;
}

// ASCII, nearly all of most text, without the binary search; constexpr, so ready for any static
// initialiser's use. tests/cpp/test_tokenizer.cpp checks it against the generated ranges.
constexpr std::array<CharClass, 128> kAsciiClass = [] {
  std::array<CharClass, 128> table{};
  for (char32_t cp = 0; cp < 128; ++cp) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) table[cp] = CharClass::letter;
    else if (cp >= '0' && cp <= '9') table[cp] = CharClass::number;
    else if (cp == ' ' || (cp >= '\t' && cp <= '\r')) table[cp] = CharClass::space;
    else table[cp] = CharClass::other;
  }
  return table;
}();

struct ClassedChar {
  CharClass cls;
  int len;
};

[[gnu::noinline]] ClassedChar non_ascii_at(std::string_view s, size_t i) {
  const Utf8 d = decode_utf8(s, i);
  return {d.valid ? char_class(d.cp) : CharClass::other, d.len};
}
inline ClassedChar unit_at(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  return c < 0x80 ? ClassedChar{kAsciiClass[c], 1} : non_ascii_at(s, i);
}

size_t run_end(std::string_view s, size_t i, CharClass cls) {
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {  // ASCII, in a tight loop
      if (kAsciiClass[c] != cls) break;
      ++i;
      continue;
    }
    const ClassedChar u = non_ascii_at(s, i);
    if (u.cls != cls) break;
    i += static_cast<size_t>(u.len);
  }
  return i;
}

}  // namespace

CharClass char_class(char32_t cp) { return cp < 128 ? kAsciiClass[cp] : lookup(cp); }

size_t pretoken_end(std::string_view s, size_t begin) {
  if (s[begin] == '\'')
    for (const std::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"})
      if (s.substr(begin + 1).starts_with(suffix)) return begin + 1 + suffix.size();
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: the class of the character after an optional
  // U+0020 picks the alternative, and the run of that class is the match.
  const size_t start = s[begin] == ' ' && begin + 1 < s.size() ? begin + 1 : begin;
  const ClassedChar first = unit_at(s, start);
  if (first.cls != CharClass::space) return run_end(s, start + static_cast<size_t>(first.len), first.cls);
  // Whitespace from `begin`. Before a non-space, `\s+(?!\S)` backs off one character so that
  // the last one can lead the next pre-token (" world"); a lone space there is `\s+`'s.
  size_t end = begin, last = begin, count = 0;
  for (ClassedChar u; end < s.size() && (u = unit_at(s, end)).cls == CharClass::space; ++count) {
    last = end;
    end += static_cast<size_t>(u.len);
  }
  return end < s.size() && count > 1 ? last : end;
}

size_t split_pretoken_end(std::string_view s, size_t begin, size_t max_digits) {
  const ClassedChar first = unit_at(s, begin);
  const size_t next = begin + static_cast<size_t>(first.len);
  // (?i:'s|'t|'re|'ve|'m|'ll|'d): the letters compared by their simple case folds (U+017F LONG S
  // is an s), as Oniguruma's (?i) does.
  const auto folded = [&](size_t i, int& len) -> char32_t {
    if (i >= s.size()) return 0;
    const Utf8 d = decode_utf8(s, i);
    len = d.len;
    return d.valid ? simple_fold(d.cp) : 0;
  };
  if (s[begin] == '\'') {
    int len1 = 0, len2 = 0;
    const char32_t a = folded(next, len1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return next + static_cast<size_t>(len1);
    if (a == 'r' || a == 'v' || a == 'l') {
      const char32_t b = folded(next + static_cast<size_t>(len1), len2);
      if (b == (a == 'l' ? 'l' : 'e')) return next + static_cast<size_t>(len1 + len2);
    }
  }
  if (first.cls == CharClass::letter) return run_end(s, next, CharClass::letter);  // \p{L}+
  if (first.cls == CharClass::number) {                                            // \p{N}{1,max_digits}
    size_t end = next;
    for (size_t n = 1; n < max_digits && end < s.size(); ++n) {
      const ClassedChar u = unit_at(s, end);
      if (u.cls != CharClass::number) break;
      end += static_cast<size_t>(u.len);
    }
    return end;
  }
  const bool newline = s[begin] == '\r' || s[begin] == '\n';
  // [^\r\n\p{L}\p{N}]\p{L}+
  if (!newline && next < s.size() && unit_at(s, next).cls == CharClass::letter) return run_end(s, next, CharClass::letter);
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  const size_t start = s[begin] == ' ' && next < s.size() && unit_at(s, next).cls == CharClass::other ? next : begin;
  if (unit_at(s, start).cls == CharClass::other) {
    size_t end = run_end(s, start, CharClass::other);
    while (end < s.size() && (s[end] == '\r' || s[end] == '\n')) ++end;
    return end;
  }
  // Whitespace from `begin`: `\s*[\r\n]+` ends after its last \r or \n; else `\s+(?!\S)` backs
  // off one character before a non-space, unless there is only one (`\s+`).
  size_t end = begin, last = begin, count = 0, after_newline = 0;
  for (ClassedChar u; end < s.size() && (u = unit_at(s, end)).cls == CharClass::space; ++count) {
    last = end;
    if (s[end] == '\r' || s[end] == '\n') after_newline = end + 1;
    end += static_cast<size_t>(u.len);
  }
  if (after_newline) return after_newline;
  return end < s.size() && count > 1 ? last : end;
}

}  // namespace text

namespace {

using detail::fail;
using detail::message;
using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr std::string_view kLoad = "Tokenizer::load";
constexpr std::string_view kEndOfText = "<|endoftext|>";

// GPT-2 writes tokens as text: the printable bytes 33–126, 161–172 and 174–255 stand for
// themselves, the other 68 bytes, in order, for U+0100..U+0143 (so vocab files hold no spaces or
// control characters).
constexpr std::array<char32_t, 256> kByteChar = [] {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (char32_t b = 0; b < 256; ++b)
    map[b] = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174 ? b : next++;
  return map;
}();
constexpr std::array<int16_t, 256 + 68> kCharByte = [] {  // the inverse; -1: not in the alphabet
  std::array<int16_t, 256 + 68> map{};
  map.fill(-1);
  for (int16_t b = 0; b < 256; ++b) map[kByteChar[b]] = b;
  return map;
}();

// The bytes a vocab or merges entry stands for; false if it has a character outside the alphabet.
bool from_byte_level(std::string_view text, std::string& bytes) {
  bytes.clear();
  for (size_t i = 0; i < text.size();) {
    const text::Utf8 d = text::decode_utf8(text, i);
    if (!d.valid || d.cp >= kCharByte.size() || kCharByte[d.cp] < 0) return false;
    bytes += static_cast<char>(kCharByte[d.cp]);
    i += static_cast<size_t>(d.len);
  }
  return true;
}

// Text from a file, quoted and safe to print: valid UTF-8 as is, control characters and invalid
// bytes as \xNN, cut after 60 bytes.
std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  for (size_t i = 0; i < text.size() && i < 60;) {
    const text::Utf8 d = text::decode_utf8(text, i);
    if (d.valid && d.cp >= 0x20 && d.cp != 0x7F) {
      out.append(text.substr(i, static_cast<size_t>(d.len)));
    } else {
      const auto c = static_cast<unsigned char>(text[i]);
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
    i += static_cast<size_t>(d.len);
  }
  return out + (text.size() > 60 ? "'..." : "'");
}

struct StringHash {
  using is_transparent = void;  // lookups by string_view, without a temporary std::string
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class T>
using StringMap = std::unordered_map<std::string, T, StringHash, std::equal_to<>>;

// Reads vocab.json as it streams past: one flat object of token → integer id, nothing else.
// Stops at the first problem, remembered in `expected` / `got` for the caller to throw.
class VocabReader : public nlohmann::json_sax<json> {
 public:
  struct Entry {
    std::string key, bytes;
    int64_t id;
  };
  std::vector<Entry> entries;
  std::string arg, expected, got;  // the problem: the place, what was expected, what was found

  explicit VocabReader(std::string file) : file_(std::move(file)) {}

  bool start_object(std::size_t) override {
    if (depth_++ == 0) return true;
    return value_rejected("an object");
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool key(string_t& key) override {
    key_ = key;
    if (from_byte_level(key, bytes_)) return true;
    return reject(key_arg(), "characters of GPT-2's byte alphabet (printable Latin-1, U+0100..U+0143)", printable(key));
  }
  bool number_integer(number_integer_t id) override {
    if (depth_ == 0) return value_rejected(std::to_string(id));
    if (id < 0) return reject(key_arg(), "a non-negative id", std::to_string(id));
    entries.push_back({key_, bytes_, id});
    return true;
  }
  bool number_unsigned(number_unsigned_t id) override {
    if (depth_ == 0) return value_rejected(std::to_string(id));
    if (id > static_cast<uint64_t>(INT32_MAX)) return reject(key_arg(), "an id below 2^31", std::to_string(id));
    entries.push_back({key_, bytes_, static_cast<int64_t>(id)});
    return true;
  }
  bool number_float(number_float_t, const string_t& text) override { return value_rejected(detail::printable(text)); }
  bool null() override { return value_rejected("null"); }
  bool boolean(bool b) override { return value_rejected(b ? "true" : "false"); }
  bool string(string_t& s) override { return value_rejected("the string " + printable(s)); }
  bool binary(binary_t&) override { return value_rejected("binary data"); }
  bool start_array(std::size_t) override { return value_rejected("an array"); }
  bool end_array() override { return false; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return reject(file_arg(), "JSON", detail::parse_error_text(e));
  }

 private:
  std::string file_, key_, bytes_;
  int depth_ = 0;

  std::string file_arg() const { return "vocab '" + file_ + "'"; }
  std::string key_arg() const { return file_arg() + " key " + printable(key_); }
  bool reject(std::string where, std::string want, std::string found) {
    arg = std::move(where), expected = std::move(want), got = std::move(found);
    return false;
  }
  // A value where an id (inside the object) or the object (at the top) belongs.
  bool value_rejected(const std::string& found) {
    if (depth_ == 0) return reject(file_arg(), "a JSON object of token → id", found);
    return reject(key_arg(), "an integer id", found);
  }
};

}  // namespace

struct Tokenizer::Impl {
  std::vector<std::string> tokens;              // id → bytes
  StringMap<int32_t> ids;                       // bytes → id
  std::array<int32_t, 256> byte_ids{};          // the single-byte tokens BPE starts from
  text::BpeMerges merges;
  int32_t eos = -1;                             // <|endoftext|>
  std::unique_ptr<text::HfTokenizer> hf;       // tokenizer.json; the rest is unused then
  std::string chat_template;                    // without hf: a GGUF file's tokenizer.chat_template
  mutable std::mutex cache_mutex;               // encode is const and may run on many threads
  mutable text::WordCache cache;                // pre-token → its ids
  mutable std::mutex template_mutex;
  mutable StringMap<std::shared_ptr<const ChatTemplate>> templates;  // template name ("" alone) → compiled

  void read_vocab(std::string_view text, const std::string& name);
  void read_merges(std::string_view text, const std::string& name);
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;
};

void Tokenizer::Impl::read_vocab(std::string_view text, const std::string& name) {
  VocabReader reader(name);
  if (!json::sax_parse(text, &reader)) fail(kLoad, reader.arg, reader.expected, reader.got);
  const std::string file = "vocab '" + name + "'";
  // Ids must number the tokens 0..n-1: then an id is an index, and every index is a token.
  const auto n = static_cast<int64_t>(reader.entries.size());
  tokens.resize(static_cast<size_t>(n));
  std::vector<const std::string*> key_of(static_cast<size_t>(n), nullptr);
  ids.reserve(static_cast<size_t>(n));
  for (VocabReader::Entry& e : reader.entries) {
    const std::string arg = file + " key " + printable(e.key);
    if (e.id >= n)
      fail(kLoad, arg, message("an id in [0, ", n, ") (the file has ", n, " tokens)"), std::to_string(e.id));
    const auto id = static_cast<size_t>(e.id);
    if (key_of[id]) fail(kLoad, arg, "a unique id", message(e.id, ", the id of ", printable(*key_of[id]), " too"));
    if (!ids.emplace(e.bytes, static_cast<int32_t>(e.id)).second)
      fail(kLoad, arg, "each token once", "a second entry");
    key_of[id] = &e.key;
    tokens[id] = std::move(e.bytes);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = ids.find(std::string(1, static_cast<char>(b)));
    if (it == ids.end()) {
      std::string key;
      text::append_utf8(key, kByteChar[static_cast<size_t>(b)]);
      fail(kLoad, file, "a token for every byte", message("none for byte ", b, " ('", key, "')"));
    }
    byte_ids[static_cast<size_t>(b)] = it->second;
  }
  const auto it = ids.find(kEndOfText);
  if (it == ids.end()) fail(kLoad, file, "the special token <|endoftext|>", "none");
  eos = it->second;
}

void Tokenizer::Impl::read_merges(std::string_view text, const std::string& name) {
  const std::string file = "merges '" + name + "'";
  merges.reserve(static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) + 1);
  std::string left, right;
  int32_t rank = 0;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t eol = std::min(text.find('\n', pos), text.size());
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (line.starts_with("#version")) continue;
    const std::string arg = message(file, " line ", line_no);
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos)
      fail(kLoad, arg, "two tokens separated by one space", printable(line));
    const std::string_view left_text = line.substr(0, space), right_text = line.substr(space + 1);
    if (!from_byte_level(left_text, left) || !from_byte_level(right_text, right))
      fail(kLoad, arg, "characters of GPT-2's byte alphabet (printable Latin-1, U+0100..U+0143)", printable(line));
    const auto l = ids.find(left), r = ids.find(right), m = ids.find(left + right);
    if (l == ids.end()) fail(kLoad, arg, "tokens of the vocab", printable(left_text) + ", which it does not have");
    if (r == ids.end()) fail(kLoad, arg, "tokens of the vocab", printable(right_text) + ", which it does not have");
    if (m == ids.end())
      fail(kLoad, arg, "a merge whose result is in the vocab",
           message(printable(left_text), " + ", printable(right_text), ", which it does not have"));
    if (!merges.add(l->second, r->second, {rank, m->second}))
      fail(kLoad, arg, "each merge once", printable(line) + " again");
    ++rank;
  }
}

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  thread_local std::vector<int32_t> symbols;  // reused: no allocation per word
  symbols.resize(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) symbols[i] = byte_ids[static_cast<unsigned char>(piece[i])];
  text::bpe_merge(symbols, merges, out);
  if (symbols.capacity() > text::WordCache::kMaxWordBytes * 1024) symbols = {};  // a huge piece's buffer is not kept
}

// Pre-token → ids cache: English text encodes several times faster with it. Longer pre-tokens
// rarely repeat.
void Tokenizer::Impl::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() > text::WordCache::kMaxWordBytes) return bpe(piece, out);
  const uint64_t h = text::WordCache::hash(piece);
  {
    std::lock_guard lock(cache_mutex);
    if (cache.find(piece, h, out)) return;
  }
  const size_t first = out.size();
  bpe(piece, out);
  std::lock_guard lock(cache_mutex);
  cache.insert(piece, h, std::span(out).subspan(first));
}

void Tokenizer::Impl::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = text::pretoken_end(text, pos);
    encode_piece(text.substr(pos, end - pos), out);
    pos = end;
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const fs::path& vocab, const fs::path& merges) {
  const std::string vocab_json = detail::read_file(vocab, kLoad, "vocab");
  return parse(vocab_json, detail::read_file(merges, kLoad, "merges"), vocab.string(), merges.string());
}

Tokenizer Tokenizer::parse(std::string_view vocab_json, std::string_view merges_txt, const std::string& vocab_name,
                           const std::string& merges_name) {
  auto impl = std::make_unique<Impl>();
  impl->read_vocab(vocab_json, vocab_name);
  impl->read_merges(merges_txt, merges_name);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load_dir(const fs::path& dir) {
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) return text::gguf_tokenizer(detail::GgufFile::open(dir), -1);
  if (!fs::is_directory(dir, ec))
    fail("Tokenizer::load_dir", "dir", "a directory", message("'", dir.string(), "' (", fs::exists(dir, ec) ? "not a directory" : "no such directory", ")"));
  const detail::DirLock lock(dir, detail::DirLock::Mode::shared);  // one checkpoint's files (io/checkpoint_dir.h)
  if (fs::exists(dir / "tokenizer.json", ec)) {
    const auto read_bounded = [&](const fs::path& p, uint64_t limit) -> std::string {
      if (!fs::exists(p, ec)) return {};
      detail::InputFile f(p, kLoad, p.filename().string());
      if (f.size() > limit)
        fail(kLoad, p.string(), message("a file of at most ", limit >> 20, " MiB"), message(f.size(), " bytes"));
      return f.read_all();
    };
    const std::string tj = read_bounded(dir / "tokenizer.json", uint64_t{512} << 20);
    Tokenizer t = parse_json(tj, read_bounded(dir / "tokenizer_config.json", uint64_t{64} << 20),
                             read_bounded(dir / "generation_config.json", uint64_t{1} << 20), dir.string());
    // As transformers: chat_template.jinja ("default") and additional_chat_templates/NAME.jinja,
    // when present, replace tokenizer_config.json's templates.
    std::vector<std::pair<std::string, std::string>> files;
    if (fs::exists(dir / "chat_template.jinja", ec))
      files.emplace_back("default", read_bounded(dir / "chat_template.jinja", uint64_t{16} << 20));
    if (fs::is_directory(dir / "additional_chat_templates", ec))
      for (const fs::directory_entry& e : fs::directory_iterator(dir / "additional_chat_templates", ec))
        if (e.path().extension() == ".jinja")
          files.emplace_back(e.path().stem().string(), read_bounded(e.path(), uint64_t{16} << 20));
    if (!files.empty()) {
      text::HfTokenizer& hf = *t.impl_->hf;
      hf.chat_template.clear();
      hf.chat_templates.clear();
      for (const auto& [name, source] : files)
        if (name == "default") hf.chat_template = source;
      if (!(files.size() == 1 && files[0].first == "default")) hf.chat_templates = std::move(files);
    }
    return t;
  }
  // Prefer Hugging Face's names; a half pair is loaded anyway so the error names the missing file.
  if (fs::exists(dir / "vocab.json", ec)) return load(dir / "vocab.json", dir / "merges.txt");
  if (fs::exists(dir / "encoder.json", ec)) return load(dir / "encoder.json", dir / "vocab.bpe");
  fail("Tokenizer::load_dir", "dir", "a directory with tokenizer.json, vocab.json + merges.txt or encoder.json + vocab.bpe",
       message("'", dir.string(), "' (none of tokenizer.json, vocab.json, encoder.json)"));
}

Tokenizer Tokenizer::parse_json(std::string_view tokenizer_json, std::string_view config_json,
                                std::string_view generation_json, const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  impl->hf = std::make_unique<text::HfTokenizer>(tokenizer_json, config_json, generation_json, dir);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_hf(std::unique_ptr<text::HfTokenizer> hf) {
  auto impl = std::make_unique<Impl>();
  impl->hf = std::move(hf);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::bytes() {
  auto impl = std::make_unique<Impl>();
  for (int b = 0; b < 256; ++b) {
    impl->tokens.emplace_back(1, static_cast<char>(b));
    impl->byte_ids[static_cast<size_t>(b)] = b;
  }
  for (int b = 0; b < 256; ++b) impl->ids.emplace(impl->tokens[static_cast<size_t>(b)], b);
  return Tokenizer(std::move(impl));  // no merges: BPE leaves every byte its own token
}

Tokenizer Tokenizer::for_model(const fs::path& dir, int64_t vocab_size) {
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) return text::gguf_tokenizer(detail::GgufFile::open(dir), vocab_size);
  if (fs::exists(dir / "tokenizer.json", ec) || fs::exists(dir / "vocab.json", ec) || fs::exists(dir / "encoder.json", ec))
    return load_dir(dir);
  if (vocab_size == 256) return bytes();
  fail("Tokenizer::for_model", "dir", "vocab.json and merges.txt (or a byte-level model of 256 tokens)",
       message("neither in '", dir.string(), "' for a vocabulary of ", vocab_size));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  return encode(text, EncodeOptions{false, allow_special});
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  if (impl_->hf) return impl_->hf->encode(text, options.add_special_tokens, options.allow_special);
  const bool allow_special = options.allow_special;  // GPT-2's files have no post-processor
  // Positions inside a pre-token are int32_t; a 2 GiB text is far beyond GPT-2's use anyway.
  if (text.size() > static_cast<size_t>(INT32_MAX))
    fail("Tokenizer::encode", "text", "at most 2^31 - 1 bytes", message(text.size(), " bytes"));
  std::vector<int32_t> out;
  out.reserve(text.size() / 4 + 1);  // English averages about 4 bytes a token
  if (allow_special && impl_->eos >= 0) {  // the byte-level tokenizer has no special token
    const std::string_view special = impl_->tokens[static_cast<size_t>(impl_->eos)];
    for (size_t at; (at = text.find(special)) != std::string_view::npos; text.remove_prefix(at + special.size())) {
      impl_->encode_ordinary(text.substr(0, at), out);
      out.push_back(impl_->eos);
    }
  }
  impl_->encode_ordinary(text, out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  if (impl_->hf) return impl_->hf->decode(ids, skip_special_tokens);
  const auto n = static_cast<int32_t>(impl_->tokens.size());
  size_t bytes = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0) fail("Tokenizer::decode", message("ids[", i, "]"), "a token id >= 0", std::to_string(ids[i]));
    if (ids[i] < n) bytes += impl_->tokens[static_cast<size_t>(ids[i])].size();
  }
  std::string out;
  out.reserve(bytes);
  for (const int32_t id : ids)  // ids past the vocabulary are skipped, as Hugging Face's decode does
    if (id < n && !(skip_special_tokens && id == impl_->eos)) out += impl_->tokens[static_cast<size_t>(id)];
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (impl_->hf) return impl_->hf->token_bytes(id);
  if (id < 0 || id >= vocab_size())
    fail("Tokenizer::token_bytes", "id", message("an id in [0, ", vocab_size(), ")"), std::to_string(id));
  return impl_->tokens[static_cast<size_t>(id)];
}

std::vector<std::string_view> Tokenizer::pretokenize(std::string_view text) {
  std::vector<std::string_view> out;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = text::pretoken_end(text, pos);
    out.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return out;
}

std::string Tokenizer::token_string(int32_t id) const {
  if (impl_->hf) return impl_->hf->token_string(id);
  std::string out;
  for (const char c : token_bytes(id)) text::append_utf8(out, kByteChar[static_cast<unsigned char>(c)]);
  return out;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view bytes) const {
  if (impl_->hf) return impl_->hf->token_id(bytes);
  const auto it = impl_->ids.find(bytes);
  if (it == impl_->ids.end()) return std::nullopt;
  return it->second;
}

int32_t Tokenizer::vocab_size() const {
  return impl_->hf ? impl_->hf->vocab_size() : static_cast<int32_t>(impl_->tokens.size());
}
int32_t Tokenizer::eos_id() const {
  if (!impl_->hf) return impl_->eos;
  return impl_->hf->eos_ids.empty() ? -1 : impl_->hf->eos_ids[0];
}
std::vector<int32_t> Tokenizer::eos_ids() const {
  if (impl_->hf) return impl_->hf->eos_ids;
  if (impl_->eos < 0) return {};
  return {impl_->eos};
}
std::optional<int32_t> Tokenizer::bos_id() const {
  if (impl_->hf) return impl_->hf->bos_id;
  if (impl_->eos < 0) return std::nullopt;
  return impl_->eos;  // GPT-2's BOS is <|endoftext|> too
}
bool Tokenizer::is_special(int32_t id) const { return impl_->hf ? impl_->hf->is_special(id) : id >= 0 && id == impl_->eos; }
std::vector<std::pair<std::string, int32_t>> Tokenizer::special_tokens() const {
  if (impl_->hf) return impl_->hf->special_tokens;
  if (impl_->eos < 0) return {};
  return {{std::string(kEndOfText), impl_->eos}};
}
void Tokenizer::set_gguf_chat_template(std::string source) { impl_->chat_template = std::move(source); }
std::string Tokenizer::chat_template() const { return impl_->hf ? impl_->hf->chat_template : impl_->chat_template; }
std::string Tokenizer::bos_token() const {
  if (impl_->hf) return impl_->hf->bos_token;
  return impl_->eos < 0 ? std::string() : std::string(kEndOfText);
}
std::string Tokenizer::eos_token() const {
  if (impl_->hf) return impl_->hf->eos_token;
  return impl_->eos < 0 ? std::string() : std::string(kEndOfText);
}
bool Tokenizer::is_tokenizer_json() const { return impl_->hf != nullptr; }

std::string Tokenizer::apply_chat_template(std::string_view messages_json, bool add_generation_prompt,
                                           std::string_view variables_json) const {
  ChatTemplateOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.variables_json = variables_json;
  return apply_chat_template(messages_json, o);
}

std::string Tokenizer::apply_chat_template(std::string_view messages_json, const ChatTemplateOptions& o) const {
  constexpr std::string_view fn = "Tokenizer::apply_chat_template";
  const nlohmann::ordered_json given = detail::parse_ordered_json(o.variables_json, fn, "variables");
  if (!given.is_object()) fail(fn, "variables", "a JSON object", detail::json_excerpt(json(given)));
  if (o.add_generation_prompt && !o.continue_final_message.empty())
    fail(fn, "continue_final_message",
         "add_generation_prompt false (continue the final message, or open a new assistant one: not both)", "both set");
  const text::HfTokenizer* hf = impl_->hf.get();
  // transformers' get_chat_template: a template the caller names or gives, the only one, or one
  // of the named ones.
  const auto named = [&](std::string_view n) -> const std::string* {
    if (hf)
      for (const auto& [k, v] : hf->chat_templates)
        if (k == n) return &v;
    return nullptr;
  };
  std::string name;  // the cache key of a template of the tokenizer's
  const std::string* source = nullptr;
  std::shared_ptr<const ChatTemplate> compiled;
  if (!o.chat_template.empty()) {
    source = named(o.chat_template);
    if (source) name = o.chat_template;
    else compiled = std::make_shared<const ChatTemplate>(o.chat_template);  // the caller's own: not cached
  } else if (!hf) {
    if (impl_->chat_template.empty())
      fail(fn, "tokenizer", "a tokenizer.json with a chat template (or a chat_template given)",
           "GPT-2's vocab files (no chat template)");
    source = &impl_->chat_template;
  } else if (!hf->chat_templates.empty()) {
    const bool tools = given.contains("tools") && !given["tools"].is_null();
    source = tools ? named("tool_use") : nullptr;
    name = source ? "tool_use" : "default";
    if (!source) source = named("default");
    if (!source) {
      std::string names;
      for (const auto& [k, v] : hf->chat_templates) names += (names.empty() ? "" : ", ") + detail::printable(k);
      fail(fn, "tokenizer_config.json chat_template", "a template named \"default\" (or chat_template given)",
           "only " + names);
    }
  } else if (hf->chat_template.empty()) {
    fail(fn, "tokenizer", "a chat_template in tokenizer_config.json (or chat_template.jinja)", "none");
  } else {
    source = &hf->chat_template;
  }
  if (!compiled) {
    {
      const std::lock_guard lock(impl_->template_mutex);
      if (auto it = impl_->templates.find(name); it != impl_->templates.end()) compiled = it->second;
    }
    if (!compiled) {  // compiled outside the lock; a second thread's copy is as good
      compiled = std::make_shared<const ChatTemplate>(*source);
      const std::lock_guard lock(impl_->template_mutex);
      impl_->templates.emplace(name, compiled);
    }
  }
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  if (hf) {
    for (const auto& [k, v] : hf->template_tokens) vars[k] = v;
  } else {  // GPT-2's files: <|endoftext|> begins and ends texts
    if (const std::string t = bos_token(); !t.empty()) vars["bos_token"] = t;
    if (const std::string t = eos_token(); !t.empty()) vars["eos_token"] = t;
  }
  for (const auto& [k, v] : given.items()) vars[k] = v;
  return compiled->render(messages_json, o.add_generation_prompt,
                          vars.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace),
                          o.continue_final_message);
}

}  // namespace mhsa
