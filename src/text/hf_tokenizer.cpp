// text/hf_tokenizer.cpp — tokenizer.json: loading and validating it (the model, the vocabulary
// and merges, added tokens, the post-processor, tokenizer_config.json and generation_config.json;
// the components are hf_components.cpp's), and the pipeline of tokenizers' Tokenizer.encode:
// added tokens split off (raw ones, then normalized ones after the normalizer), pre-tokenizers,
// the BPE model (byte-level or with byte fallback) behind a cache of words, the post-processor's
// template; and decode through the decoder chain. Each step mirrors the tokenizers crate's
// semantics, including its edge cases (lstrip/rstrip/single_word, fuse_unk, ignore_merges).
// When the pre-tokenizer is one hand-scanned pattern (Llama 3's, Qwen2's, GPT-2's), the pieces
// go from the scanner to the model a batch at a time, never listed whole (the fast path of most
// real files; the list is what every other pre-tokenizer makes).
#include "text/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <functional>

#include "core/check.h"
#include "text/hf_components.h"
#include "text/unicode_data.h"

namespace mhsa::text {

using detail::fail;
using detail::message;

namespace {

using hf::json;
using hf::kFn;
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

constexpr int32_t kMaxId = 1 << 24;  // 16M tokens: far beyond any vocabulary in use

// A token id from the file: below `limit` (the file's count of tokens plus 65,536 for holes, and
// kMaxId at most), so that a small file cannot make a huge table.
int32_t read_id(const json& v, const std::string& where, int64_t limit) {
  const auto id = detail::json_integer<uint32_t>(v, kFn, where);
  if (id >= limit) fail(kFn, where, message("an id below ", limit), std::to_string(id));
  return static_cast<int32_t>(id);
}

// tokenizer_config.json's "bos_token"/"eos_token": a string or an AddedToken object.
std::string config_token(const json& config, std::string_view key) {
  const json* v = optional_member(config, key);
  if (!v) return {};
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object() && v->contains("content") && (*v)["content"].is_string()) return (*v)["content"].get<std::string>();
  fail(kFn, message("tokenizer_config.json ", key), "a string or {\"content\": ...}", detail::json_excerpt(*v));
}

}  // namespace

HfTokenizer::~HfTokenizer() = default;

HfTokenizer::HfTokenizer(std::string_view tokenizer_json, std::string_view config_json, std::string_view generation_json,
                         const std::string& dir) {
  init(detail::parse_json(tokenizer_json, kFn, message("'", dir, "/tokenizer.json'")), config_json, generation_json, dir);
}

HfTokenizer::HfTokenizer(const json& root, std::string_view config_json, std::string_view generation_json,
                         const std::string& dir) {
  init(root, config_json, generation_json, dir);
}

void HfTokenizer::init(const json& root, std::string_view config_json, std::string_view generation_json,
                       const std::string& dir) {
  const Where file{"tokenizer.json"};
  if (!root.is_object()) fail(kFn, file.path, "a JSON object", detail::json_excerpt(root));
  for (const char* key : {"truncation", "padding"})
    if (optional_member(root, key))
      fail(kFn, (file / key).path, "null (truncation and padding are not supported)", detail::json_excerpt(root[key]));

  // The model.
  const Where mw = file / "model";
  const json& m = member(root, "model", file);
  if (!m.is_object()) fail(kFn, mw.path, "an object", detail::json_excerpt(m));
  const std::string mtype = m.contains("type") ? type_of(m, mw) : "BPE";
  if (mtype != "BPE") unsupported(mw, "a model", mtype, "BPE");
  if (const json* d = optional_member(m, "dropout"); d && !(d->is_number() && d->get<double>() == 0.0))
    fail(kFn, (mw / "dropout").path, "null (BPE dropout is not supported)", detail::json_excerpt(*d));
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* v = optional_member(m, key); v && !(v->is_string() && v->get<std::string>().empty()))
      fail(kFn, (mw / key).path, "null (not supported)", detail::json_excerpt(*v));
  byte_fallback_ = get_bool(m, "byte_fallback", mw, false);
  fuse_unk_ = get_bool(m, "fuse_unk", mw, false);
  ignore_merges_ = get_bool(m, "ignore_merges", mw, false);

  if (const json* n = optional_member(root, "normalizer"))
    normalizer_ = std::make_unique<Normalizer>(Normalizer::read(*n, file / "normalizer"));
  if (const json* p = optional_member(root, "pre_tokenizer")) {
    pre_tokenizer_ = std::make_unique<PreTokenizer>(PreTokenizer::read(*p, file / "pre_tokenizer"));
    byte_level_ = pre_tokenizer_->ends_byte_level();
    scan_ = pre_tokenizer_->scanner();
  }
  if (const json* d = optional_member(root, "decoder"))
    decoder_ = std::make_unique<Decoder>(Decoder::read(*d, file / "decoder"));

  // Vocabulary: ids unique and below kMaxId; holes allowed (tokenizers allows them).
  const json& vocab = member(m, "vocab", mw);
  if (!vocab.is_object()) fail(kFn, (mw / "vocab").path, "an object of token → id", detail::json_excerpt(vocab));
  const json* added_list = optional_member(root, "added_tokens");
  const int64_t id_limit = std::min<int64_t>(
      kMaxId, static_cast<int64_t>(vocab.size() + (added_list && added_list->is_array() ? added_list->size() : 0)) + 65536);
  StrMap<int32_t> spelled;  // the file's spelling → id, for the merges
  spelled.reserve(vocab.size());
  for (const auto& [token, idv] : vocab.items()) {
    const std::string where = (mw / "vocab").path + " " + detail::quote(token);
    const int32_t id = read_id(idv, where, id_limit);
    if (static_cast<size_t>(id) >= tokens_.size()) tokens_.resize(static_cast<size_t>(id) + 1), kinds_.resize(tokens_.size());
    if (kinds_[static_cast<size_t>(id)] != Kind::none)
      fail(kFn, where, "a unique id", message(id, ", the id of ", detail::quote(tokens_[static_cast<size_t>(id)]), " too"));
    tokens_[static_cast<size_t>(id)] = token;
    kinds_[static_cast<size_t>(id)] = Kind::model;
    spelled.emplace(token, id);
    if (!byte_level_) model_ids_.emplace(token, id);
    else if (const auto bytes = from_byte_level(token)) model_ids_.emplace(*bytes, id);
  }
  byte_ids_.fill(-1);
  fallback_ids_.fill(-1);
  ascii_ids_.fill(-1);
  for (int c = 0; c < 128 && !byte_level_; ++c)
    if (const auto it = spelled.find(std::string(1, static_cast<char>(c))); it != spelled.end()) ascii_ids_[static_cast<size_t>(c)] = it->second;
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    append_utf8(ch, kByteChar[static_cast<size_t>(b)]);
    if (const auto it = spelled.find(ch); it != spelled.end()) byte_ids_[static_cast<size_t>(b)] = it->second;
    static constexpr char kHex[] = "0123456789ABCDEF";
    const std::string fb = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
    if (const auto it = spelled.find(fb); it != spelled.end()) fallback_ids_[static_cast<size_t>(b)] = it->second;
  }
  if (const json* u = optional_member(m, "unk_token")) {
    if (!u->is_string()) fail(kFn, (mw / "unk_token").path, "a string", detail::json_excerpt(*u));
    const auto it = spelled.find(u->get<std::string>());
    if (it == spelled.end()) fail(kFn, (mw / "unk_token").path, "a token of the vocab", detail::json_excerpt(*u));
    unk_ = it->second;
  }

  // Merges: "a b" or ["a", "b"]; both parts and their concatenation in the vocab.
  const json& merges = get_array(m, "merges", mw);
  merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string where = (mw / "merges")[i].path;
    const json& e = merges[i];
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail(kFn, where, "\"a b\": two tokens separated by one space", detail::json_excerpt(e));
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>(), b = e[1].get<std::string>();
    } else {
      fail(kFn, where, "\"a b\" or [\"a\", \"b\"]", detail::json_excerpt(e));
    }
    const auto l = spelled.find(a), r = spelled.find(b), c = spelled.find(a + b);
    if (l == spelled.end() || r == spelled.end() || c == spelled.end())
      fail(kFn, where, "a merge of two tokens of the vocab into a third", message(detail::json_excerpt(e), " (", l == spelled.end() ? detail::quote(a) : r == spelled.end() ? detail::quote(b) : detail::quote(a + b), " is not in the vocab)"));
    if (!merges_.add(l->second, r->second, {static_cast<int32_t>(i), c->second}))
      fail(kFn, where, "each merge once", detail::json_excerpt(e) + " again");
    if (!byte_level_) add_join(a, b);
  }
  cut_words_ = !byte_level_ && !ignore_merges_;

  // Added tokens: matched before the model; an id may be the model's own for the same token.
  if (const json* list = optional_member(root, "added_tokens")) {
    const Where aw = file / "added_tokens";
    if (!list->is_array()) fail(kFn, aw.path, "an array", detail::json_excerpt(*list));
    for (size_t i = 0; i < list->size(); ++i) {
      const json& t = (*list)[i];
      const Where w = aw[i];
      AddedToken a{get_string(t, "content", w), read_id(member(t, "id", w), (w / "id").path, id_limit),
                   get_bool(t, "special", w, false), get_bool(t, "lstrip", w, false), get_bool(t, "rstrip", w, false),
                   get_bool(t, "normalized", w, false), get_bool(t, "single_word", w, false)};
      if (a.content.empty()) fail(kFn, (w / "content").path, "a non-empty token", "\"\"");
      const auto id = static_cast<size_t>(a.id);
      if (id >= tokens_.size()) tokens_.resize(id + 1), kinds_.resize(tokens_.size());
      if (kinds_[id] == Kind::added || kinds_[id] == Kind::special)
        fail(kFn, (w / "id").path, "a unique id", message(a.id, ", the id of ", detail::quote(tokens_[id]), " too"));
      if (!content_ids_.emplace(a.content, a.id).second)
        fail(kFn, (w / "content").path, "each added token once", detail::quote(a.content) + " again");
      tokens_[id] = a.content;
      kinds_[id] = a.special ? Kind::special : Kind::added;
      if (a.special) special_tokens.emplace_back(a.content, a.id);
      added_.push_back(std::move(a));
    }
  }
  for (const auto& [token, id] : spelled) content_ids_.emplace(token, id);  // added tokens first
  for (int n = 0; n < 2; ++n) added_by_byte_[n].resize(256);
  for (size_t i = 0; i < added_.size(); ++i) {
    const int n = added_[i].normalized && normalizer_ ? 1 : 0;
    const auto first = static_cast<unsigned char>(added_[i].content[0]);
    added_by_byte_[n][first].push_back(static_cast<int32_t>(i));
    added_starts_[n][first] = true;
  }
  for (int n = 0; n < 2; ++n) {
    const auto count = std::count(added_starts_[n].begin(), added_starts_[n].end(), true);
    const auto first = std::find(added_starts_[n].begin(), added_starts_[n].end(), true) - added_starts_[n].begin();
    added_first_[n] = count == 0 ? -2 : count > 1 ? -1 : static_cast<int>(first);
  }
  for (auto& table : added_by_byte_)
    for (auto& list : table)
      std::stable_sort(list.begin(), list.end(), [&](int32_t x, int32_t y) { return added_[static_cast<size_t>(x)].content.size() > added_[static_cast<size_t>(y)].content.size(); });

  // The post-processor: the special tokens a single sequence gets.
  std::optional<int32_t> template_bos;
  const std::function<void(const json&, const Where&)> read_processor = [&](const json& p, const Where& w) {
    const std::string t = type_of(p, w);
    if (t == "ByteLevel") return;
    if (t == "Sequence") {
      const json& list = get_array(p, "processors", w);
      for (size_t i = 0; i < list.size(); ++i) read_processor(list[i], (w / "processors")[i]);
      return;
    }
    if (t != "TemplateProcessing") unsupported(w, "a post-processor", t, "TemplateProcessing, ByteLevel, Sequence");
    if (!prefix_.empty() || !suffix_.empty()) fail(kFn, w.path, "one TemplateProcessing", "a second");
    const json& single = get_array(p, "single", w);
    const json& specials = member(p, "special_tokens", w);
    bool seen_a = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const Where iw = (w / "single")[i];
      const json& item = single[i];
      if (item.is_object() && item.contains("Sequence")) {
        const std::string seq = get_string(item["Sequence"], "id", iw / "Sequence");
        if (seq != "A" || seen_a) fail(kFn, iw.path, "the sequence A, once", detail::json_excerpt(item));
        seen_a = true;
        continue;
      }
      if (!item.is_object() || !item.contains("SpecialToken"))
        fail(kFn, iw.path, "{\"Sequence\": ...} or {\"SpecialToken\": ...}", detail::json_excerpt(item));
      const std::string name = get_string(item["SpecialToken"], "id", iw / "SpecialToken");
      const json& entry = member(specials, name, w / "special_tokens");
      const json& ids = get_array(entry, "ids", w / "special_tokens" / name);
      for (size_t k = 0; k < ids.size(); ++k) {
        const int32_t id = read_id(ids[k], ((w / "special_tokens" / name / "ids")[k]).path, kMaxId);
        if (id >= vocab_size() || kinds_[static_cast<size_t>(id)] == Kind::none)
          fail(kFn, ((w / "special_tokens" / name / "ids")[k]).path, message("an id of a token (below ", vocab_size(), ")"), std::to_string(id));
        (seen_a ? suffix_ : prefix_).push_back(id);
        if (!seen_a && i == 0 && k == 0) template_bos = id;
      }
    }
    if (!seen_a) fail(kFn, (w / "single").path, "a template with the sequence A", "none");
  };
  if (const json* p = optional_member(root, "post_processor")) read_processor(*p, file / "post_processor");

  // BOS/EOS and the chat template from tokenizer_config.json and generation_config.json.
  const auto id_of = [&](const std::string& t) -> std::optional<int32_t> { return token_id(t); };
  if (!config_json.empty()) {
    const json config = detail::parse_json(config_json, kFn, message("'", dir, "/tokenizer_config.json'"));
    if (!config.is_object()) fail(kFn, "tokenizer_config.json", "a JSON object", detail::json_excerpt(config));
    bos_token = config_token(config, "bos_token");
    eos_token = config_token(config, "eos_token");
    // transformers' special_tokens_map, the chat template's variables: every top-level "*_token"
    // that is a string or an AddedToken, and extra_special_tokens given as name → token.
    const auto add_template_token = [&](const std::string& name, const json& v) {
      if (v.is_string()) template_tokens.emplace_back(name, v.get<std::string>());
      else if (v.is_object() && v.contains("content") && v["content"].is_string())
        template_tokens.emplace_back(name, v["content"].get<std::string>());
    };
    for (const auto& [key, v] : config.items())
      if (key.size() > 6 && key.ends_with("_token")) add_template_token(key, v);
    if (const json* extra = optional_member(config, "extra_special_tokens"); extra && extra->is_object())
      for (const auto& [key, v] : extra->items()) add_template_token(key, v);
    if (!bos_token.empty()) bos_id = id_of(bos_token);
    if (!eos_token.empty())
      if (const auto e = id_of(eos_token)) eos_ids.push_back(*e);
    if (const json* t = optional_member(config, "chat_template")) {
      if (t->is_string()) {
        chat_template = t->get<std::string>();
      } else if (t->is_array()) {  // [{"name": "default", "template": ...}, ...]
        for (const json& e : *t)
          if (e.is_object() && e.contains("name") && e["name"].is_string() && e.contains("template") &&
              e["template"].is_string()) {
            chat_templates.emplace_back(e["name"].get<std::string>(), e["template"].get<std::string>());
            if (e["name"] == "default") chat_template = e["template"].get<std::string>();
          }
      }
    }
  }
  if (!generation_json.empty()) {
    const json gen = detail::parse_json(generation_json, kFn, message("'", dir, "/generation_config.json'"));
    const auto add_eos = [&](const json& v, const std::string& where) {
      const int32_t id = read_id(v, where, kMaxId);
      if (id >= vocab_size()) fail(kFn, where, message("an id below ", vocab_size()), std::to_string(id));
      if (std::find(eos_ids.begin(), eos_ids.end(), id) == eos_ids.end()) eos_ids.push_back(id);
    };
    if (const json* e = gen.is_object() ? optional_member(gen, "eos_token_id") : nullptr) {
      if (e->is_array())
        for (size_t i = 0; i < e->size(); ++i) add_eos((*e)[i], message("generation_config.json eos_token_id[", i, "]"));
      else
        add_eos(*e, "generation_config.json eos_token_id");
    }
    if (const json* b = gen.is_object() ? optional_member(gen, "bos_token_id") : nullptr; b && !bos_id) {
      const int32_t id = read_id(*b, "generation_config.json bos_token_id", kMaxId);
      if (id < vocab_size()) bos_id = id;
    }
  }
  if (!bos_id) bos_id = template_bos;
}

// ---- encoding ---------------------------------------------------------------------------------

namespace {

// Rust's \w, which tokenizers' single_word check uses: letters, marks, decimal digits, letter
// numbers, connector punctuation and the joiners.
bool is_word_char(const Utf8& d) {
  if (!d.valid) return false;
  const Category c = category(d.cp);
  return c <= Category::Me || c == Category::Nd || c == Category::Nl || c == Category::Pc || d.cp == 0x200C || d.cp == 0x200D;
}
// The last character of s[0, end).
Utf8 last_char(std::string_view s, size_t end) {
  size_t b = end - 1;
  while (b > 0 && end - b < 4 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  const Utf8 d = decode_utf8(s, b);
  if (b + static_cast<size_t>(d.len) == end) return d;
  return decode_utf8(s, end - 1);
}

}  // namespace

// tokenizers' leftmost-longest matching of added tokens, with single_word, lstrip and rstrip.
void HfTokenizer::split_added(std::string_view text, bool normalized, bool allow_special, std::vector<Span>& out) const {
  const auto& table = added_by_byte_[normalized ? 1 : 0];
  const auto& starts = added_starts_[normalized ? 1 : 0];
  const int first = added_first_[normalized ? 1 : 0];
  size_t start_offset = 0;
  for (size_t pos = first == -2 ? text.size() : 0; pos < text.size();) {
    if (first >= 0) {  // one byte starts every added token (often '<'): the library's search for it
      const void* at = std::memchr(text.data() + pos, first, text.size() - pos);
      pos = at ? static_cast<size_t>(static_cast<const char*>(at) - text.data()) : text.size();
    }
    while (pos < text.size() && !starts[static_cast<unsigned char>(text[pos])]) ++pos;  // no token starts here
    if (pos == text.size()) break;
    const AddedToken* hit = nullptr;
    for (const int32_t i : table[static_cast<unsigned char>(text[pos])]) {
      const AddedToken& a = added_[static_cast<size_t>(i)];
      if (text.compare(pos, a.content.size(), a.content) != 0 || (a.special && !allow_special)) continue;
      hit = &a;
      break;
    }
    if (!hit) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + hit->content.size();
    pos = stop;
    if (hit->single_word) {
      const bool before = start == 0 || !is_word_char(last_char(text, start));
      const bool after = stop == text.size() || !is_word_char(decode_utf8(text, stop));
      if (!before || !after) continue;  // the match is used up all the same, as tokenizers' find_iter does
    }
    if (hit->lstrip) {
      size_t s = start;
      while (s > 0) {
        const Utf8 d = last_char(text, s);
        if (!d.valid || !is_white_space(d.cp)) break;
        s -= static_cast<size_t>(d.len);
      }
      start = std::max(s, start_offset);
    }
    if (hit->rstrip)
      while (stop < text.size()) {
        const Utf8 d = decode_utf8(text, stop);
        if (!d.valid || !is_white_space(d.cp)) break;
        stop += static_cast<size_t>(d.len);
      }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, hit->id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
}

// A merge of `left` and `right` joins a symbol ending in left's last character to one starting
// with right's first. (A part with no characters is never a symbol of a text.)
void HfTokenizer::add_join(std::string_view left, std::string_view right) {
  if (left.empty() || right.empty()) return;
  const Utf8 x = last_char(left, left.size()), s = decode_utf8(right, 0);
  if (x.cp < 128 && s.cp < 128) ascii_joins_[x.cp * 2 + s.cp / 64] |= uint64_t{1} << (s.cp % 64);
  else joins_.insert(uint64_t{x.cp} << 32 | s.cp);
}

// A piece longer than the cache takes (a whole text, for a model without a pre-tokenizer) is
// cut into words that are then encoded on their own, through the cache. Merging by score
// (use_scores) cuts between characters x and s wherever no token that text may form has x
// followed by s: no symbol can then ever span the cut, and each side's pairs are queued in the
// same order alone as together (highest score first, leftmost first). Merging by rank cuts into words that are then encoded on their own, through the cache, at each boundary
// between characters x and s where
//   - x and s are each a token of the vocabulary, so each is one initial symbol (and no unknown
//     characters, fused or not, meet there), and
//   - no merge joins a token ending in x to one starting with s.
// That is exact: a token's spelling is its parts' spellings end to end, so the first merge that
// would make a symbol spanning the boundary joins a symbol ending in x to one starting with s,
// and there is none; the merges on either side then happen in the same order alone as together
// (lowest rank first, leftmost first, each side's own pairs only). ignore_merges (the whole piece
// looked up first) turns this off, as does a byte-level model (its pieces are pre-tokens).
void HfTokenizer::model(std::string_view piece, std::vector<int32_t>& out) const {
  if (!cut_words_ || piece.size() <= WordCache::kMaxWordBytes) return model_word(piece, out);
  size_t word = 0;
  bool prev_known = false;
  char32_t prev = 0, memo_cp = 0x110000;  // the last non-ASCII character looked up, and its answer
  bool memo_known = false;
  for (size_t i = 0; i < piece.size();) {
    const auto c = static_cast<unsigned char>(piece[i]);
    char32_t cp = c;
    bool known;
    int len = 1;
    if (c < 0x80) {
      known = by_score_ || ascii_ids_[c] >= 0;
    } else {
      const Utf8 d = decode_utf8(piece, i);
      cp = d.valid ? d.cp : 0x110000 + c, len = d.len;
      if (!by_score_ && cp != memo_cp)
        memo_cp = cp, memo_known = d.valid && model_ids_.contains(piece.substr(i, static_cast<size_t>(len)));
      known = by_score_ || memo_known;
    }
    if (known && prev_known && i > word) {
      const bool joined = prev < 128 && cp < 128 ? (ascii_joins_[prev * 2 + cp / 64] >> (cp % 64)) & 1
                                                 : joins_.contains(uint64_t{prev} << 32 | cp);
      if (!joined) {
        model_word(piece.substr(word, i - word), out);
        word = i;
      }
    }
    prev = cp, prev_known = known;
    i += static_cast<size_t>(len);
  }
  model_word(piece.substr(word), out);
}

void HfTokenizer::model_word(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (piece.size() > WordCache::kMaxWordBytes) return model_uncached(piece, out);
  const uint64_t h = WordCache::hash(piece);
  std::lock_guard lock(cache_mutex_);
  cached(piece, h, out);
}

// The word's ids from the cache, or found and cached; the caller holds cache_mutex_.
void HfTokenizer::cached(std::string_view word, uint64_t h, std::vector<int32_t>& out) const {
  if (cache_.find(word, h, out)) return;
  const size_t first = out.size();
  model_uncached(word, out);
  cache_.insert(word, h, std::span(out).subspan(first));
}

// model() of each of a few pieces in turn, their cache slots asked for all at once beforehand and
// the lock taken once.
void HfTokenizer::model_words(std::span<const std::string_view> words, std::vector<int32_t>& out) const {
  std::array<uint64_t, kBatch> h;
  for (size_t i = 0; i < words.size(); ++i)
    if (words[i].size() <= WordCache::kMaxWordBytes) cache_.prefetch(h[i] = WordCache::hash(words[i]));
  std::unique_lock lock(cache_mutex_);
  for (size_t i = 0; i < words.size(); ++i) {
    if (words[i].size() <= WordCache::kMaxWordBytes) {
      cached(words[i], h[i], out);
      continue;
    }
    lock.unlock();  // model() takes it for each part of a long piece
    model(words[i], out);
    lock.lock();
  }
}

// tokenizers' BPE::tokenize: the whole piece when ignore_merges finds it in the vocab; else one
// symbol per character (byte-level: per byte), unknown ones by byte fallback, the unknown token
// (fused) or nothing, then the merges.
void HfTokenizer::model_uncached(std::string_view piece, std::vector<int32_t>& out) const {
  if (by_score_) return model_by_score(piece, out);
  if (ignore_merges_ || (newline_runs_ && piece.find_first_not_of('\n') == std::string_view::npos))
    if (const auto it = model_ids_.find(piece); it != model_ids_.end()) {
      out.push_back(it->second);
      return;
    }
  thread_local std::vector<int32_t> symbols;  // reused: no allocation per word
  symbols.clear();
  bool pending_unk = false;
  const auto unknown = [&](std::string_view ch) {
    if (byte_fallback_) {
      bool all = true;
      for (const char c : ch) all = all && fallback_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (const char c : ch) symbols.push_back(fallback_ids_[static_cast<unsigned char>(c)]);
        return;
      }
    }
    if (!unk_) return;
    if (pending_unk && !fuse_unk_) symbols.push_back(*unk_);
    pending_unk = true;
  };
  const auto known = [&](int32_t id) {
    if (pending_unk) symbols.push_back(*unk_);
    pending_unk = false;
    symbols.push_back(id);
  };
  for (size_t i = 0; i < piece.size();) {
    if (byte_level_) {
      const auto b = static_cast<unsigned char>(piece[i]);
      if (byte_ids_[b] >= 0) {
        known(byte_ids_[b]);
      } else {
        std::string ch;
        append_utf8(ch, kByteChar[b]);
        unknown(ch);
      }
      ++i;
      continue;
    }
    const auto c = static_cast<unsigned char>(piece[i]);
    if (c < 0x80 && ascii_ids_[c] >= 0) {  // most of most text, without a hash lookup
      known(ascii_ids_[c]);
      ++i;
      continue;
    }
    const Utf8 d = decode_utf8(piece, i);
    const std::string_view ch = piece.substr(i, static_cast<size_t>(d.len));
    if (const auto it = model_ids_.find(ch); it != model_ids_.end()) known(it->second);
    else unknown(ch);
    i += static_cast<size_t>(d.len);
  }
  if (pending_unk) symbols.push_back(*unk_);
  bpe_merge(symbols, merges_, out);
  if (symbols.capacity() > WordCache::kMaxWordBytes * 1024) symbols = {};  // a huge piece's buffer is not kept
}

void HfTokenizer::use_scores(std::vector<float> scores, std::vector<bool> mergeable) {
  if (byte_level_ || scores.size() != tokens_.size() || mergeable.size() != tokens_.size())
    fail("Tokenizer::use_scores", "scores", message(tokens_.size(), " scores of a model that is not byte-level"),
         message(scores.size(), byte_level_ ? " (byte-level)" : ""));
  scores_ = std::move(scores);
  mergeable_ = std::move(mergeable);
  by_score_ = true;
  cut_words_ = true;
  ascii_joins_.fill(0);
  joins_.clear();
  for (size_t id = 0; id < tokens_.size(); ++id) {  // each pair of adjacent characters in a token
    if (!mergeable_[id]) continue;
    const std::string& t = tokens_[id];
    char32_t prev = 0;
    for (size_t i = 0; i < t.size();) {
      const Utf8 d = decode_utf8(t, i);
      const char32_t cp = d.valid ? d.cp : 0x110000 + static_cast<unsigned char>(t[i]);  // as model() reads them
      if (i > 0) {
        if (prev < 128 && cp < 128) ascii_joins_[prev * 2 + cp / 64] |= uint64_t{1} << (cp % 64);
        else joins_.insert(uint64_t{prev} << 32 | cp);
      }
      prev = cp;
      i += static_cast<size_t>(d.len);
    }
  }
}

// llama.cpp's llm_tokenizer_spm (and sentencepiece's BPE): symbols are the piece's characters in a
// linked list; a heap holds every adjacent pair whose concatenation is a token, by that token's
// score (the leftmost of equal scores first). The best pair is joined unless one of its symbols
// has changed since it was queued (their lengths no longer add up), and the new symbol's pairs
// with its neighbours are queued: O(n log n). A symbol that is no token (a character the
// vocabulary lacks) becomes its bytes' <0xNN> tokens when it has them all, else the unknown token.
void HfTokenizer::model_by_score(std::string_view piece, std::vector<int32_t>& out) const {
  struct Symbol {
    uint32_t begin, len;
    int32_t prev, next;
  };
  struct Pair {
    float score;
    int32_t left, right;
    uint32_t len;
  };
  thread_local std::vector<Symbol> symbols;  // reused: no allocation per word
  thread_local std::vector<Pair> heap;
  symbols.clear();
  heap.clear();
  for (size_t i = 0; i < piece.size();) {
    const auto len = static_cast<uint32_t>(decode_utf8(piece, i).len);
    const auto k = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(i), len, k - 1, i + len < piece.size() ? k + 1 : -1});
    i += len;
  }
  const auto before = [](const Pair& a, const Pair& b) { return a.score < b.score || (a.score == b.score && a.left > b.left); };
  const auto queue = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const uint32_t len = l.len + symbols[static_cast<size_t>(right)].len;
    const auto it = model_ids_.find(piece.substr(l.begin, len));
    if (it == model_ids_.end() || !mergeable_[static_cast<size_t>(it->second)]) return;
    heap.push_back({scores_[static_cast<size_t>(it->second)], left, right, len});
    std::push_heap(heap.begin(), heap.end(), before);
  };
  for (size_t k = 1; k < symbols.size(); ++k) queue(static_cast<int32_t>(k - 1), static_cast<int32_t>(k));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), before);
    const Pair p = heap.back();
    heap.pop_back();
    Symbol& l = symbols[static_cast<size_t>(p.left)];
    Symbol& r = symbols[static_cast<size_t>(p.right)];
    if (l.len == 0 || r.len == 0 || l.len + r.len != p.len) continue;  // one of them has changed
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<size_t>(r.next)].prev = p.left;
    queue(l.prev, p.left);
    queue(p.left, l.next);
  }
  for (int32_t k = symbols.empty() ? -1 : 0; k >= 0; k = symbols[static_cast<size_t>(k)].next) {
    const Symbol& s = symbols[static_cast<size_t>(k)];
    const std::string_view text = piece.substr(s.begin, s.len);
    if (const auto it = model_ids_.find(text); it != model_ids_.end()) {
      out.push_back(it->second);
      continue;
    }
    bool bytes = true;
    for (const char c : text) bytes = bytes && fallback_ids_[static_cast<unsigned char>(c)] >= 0;
    if (bytes)
      for (const char c : text) out.push_back(fallback_ids_[static_cast<unsigned char>(c)]);
    else if (unk_)
      out.push_back(*unk_);
  }
  if (symbols.capacity() > WordCache::kMaxWordBytes * 1024) symbols = {}, heap = {};  // a huge piece's buffers are not kept
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens, bool allow_special) const {
  if (text.size() > static_cast<size_t>(INT32_MAX))
    fail("Tokenizer::encode", "text", "at most 2^31 - 1 bytes", message(text.size(), " bytes"));
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 4 + prefix_.size() + suffix_.size() + 1);
  if (add_special_tokens) ids = prefix_;
  std::vector<Span> raw, inner;
  hf::Pieces pieces;
  split_added(text, false, allow_special, raw);
  for (const Span& s : raw) {
    if (s.token >= 0) {
      ids.push_back(s.token);
      continue;
    }
    std::string normalized;  // the section when a normalizer rewrites it
    std::string_view section = text.substr(s.begin, s.end - s.begin);
    if (normalizer_) section = normalized = normalizer_->apply(std::string(section));
    inner.clear();
    split_added(section, true, allow_special, inner);
    for (const Span& t : inner) {
      if (t.token >= 0) {
        ids.push_back(t.token);
        continue;
      }
      if (scan_) {  // the pre-tokens to the model kBatch at a time as the scanner finds them: no list of pieces
        const std::string_view part = section.substr(t.begin, t.end - t.begin);
        std::array<std::string_view, kBatch> words;
        for (size_t pos = 0; pos < part.size();) {
          size_t n = 0;
          for (size_t end; n < kBatch && pos < part.size(); pos = end) words[n++] = part.substr(pos, (end = scan_(part, pos)) - pos);
          model_words(std::span(words).first(n), ids);
        }
        continue;
      }
      pieces.text.assign(section, t.begin, t.end - t.begin);
      pieces.ranges.assign(1, {0, pieces.text.size(), s.begin == 0 && t.begin == 0});
      if (pre_tokenizer_) pre_tokenizer_->apply(pieces);
      for (const hf::Pieces::Range& r : pieces.ranges) model(pieces.view(r), ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  return ids;
}

// ---- decoding ---------------------------------------------------------------------------------

std::vector<std::string> HfTokenizer::decode_tokens(std::vector<std::string> tokens, bool exact) const {
  if (decoder_) {
    decoder_->apply(tokens, exact, !exact);
    return tokens;
  }
  std::string joined;  // tokenizers joins the tokens with spaces when there is no decoder
  for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
  return {joined};
}

std::string HfTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0) fail("Tokenizer::decode", message("ids[", i, "]"), "a token id >= 0", std::to_string(ids[i]));
    if (ids[i] >= vocab_size()) continue;  // past the vocabulary: skipped, as tokenizers does
    const auto id = static_cast<size_t>(ids[i]);
    if (kinds_[id] == Kind::none || (skip_special && kinds_[id] == Kind::special)) continue;
    tokens.push_back(tokens_[id]);
  }
  std::string out;
  for (const std::string& t : decode_tokens(std::move(tokens), false)) out += t;
  return out;
}

std::string HfTokenizer::token_bytes(int32_t id) const {
  if (!has_token(id))
    fail("Tokenizer::token_bytes", "id", message("the id of a token in [0, ", vocab_size(), ")"), std::to_string(id));
  std::string out;
  for (const std::string& t : decode_tokens({tokens_[static_cast<size_t>(id)]}, true)) out += t;
  return out;
}

const std::string& HfTokenizer::token_string(int32_t id) const {
  if (!has_token(id))
    fail("Tokenizer::token_string", "id", message("the id of a token in [0, ", vocab_size(), ")"), std::to_string(id));
  return tokens_[static_cast<size_t>(id)];
}

std::optional<int32_t> HfTokenizer::token_id(std::string_view content) const {
  const auto it = content_ids_.find(content);
  if (it == content_ids_.end()) return std::nullopt;
  return it->second;
}

bool HfTokenizer::has_token(int32_t id) const { return id >= 0 && id < vocab_size() && kinds_[static_cast<size_t>(id)] != Kind::none; }
bool HfTokenizer::is_special(int32_t id) const { return has_token(id) && kinds_[static_cast<size_t>(id)] == Kind::special; }

std::string lossy_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Utf8 d = decode_utf8(s, i);
    if (d.valid) {
      out.append(s.substr(i, static_cast<size_t>(d.len)));
      i += static_cast<size_t>(d.len);
      continue;
    }
    // The maximal subpart: a lead byte and the continuation bytes that could still follow it.
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = 1;
    const int need = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
    for (int k = 1; k < need && i + static_cast<size_t>(k) < s.size(); ++k) {
      const auto t = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      unsigned char lo = 0x80, hi = 0xBF;
      if (k == 1) {
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
      }
      if (t < lo || t > hi) break;
      len = static_cast<size_t>(k) + 1;
    }
    out += "\xEF\xBF\xBD";
    i += len;
  }
  return out;
}

}  // namespace mhsa::text
