// text/gguf_tokenizer.cpp — the tokenizer stored in a GGUF file's metadata (tokenizer.ggml.*), read
// as llama.cpp reads it (src/llama-vocab.cpp), for the tokenizers mhsa has:
//   - "gpt2" with pre-tokenizer "gpt-2" and no special token but <|endoftext|>: GPT-2's byte-level
//     BPE, read as vocab.json + merges.txt (as from GPT-2's files);
//   - "gpt2" with another pre-tokenizer llama.cpp names (Llama 3's "llama-bpe", "qwen2", "smollm",
//     "starcoder", "command-r", "deepseek-llm", "default", ...): byte-level BPE behind that name's
//     list of Split regexes;
//   - "llama": SentencePiece BPE (Llama 2, Mistral v0.1, TinyLlama, Phi-3): a "▁" for each space
//     and before the text (add_space_prefix), pieces joined by score, <0xNN> byte fallback.
//   - "gemma4": BPE of characters (Gemma 4): a "▁" for each space, merges by rank within lines and
//     runs of "\n", <0xNN> byte fallback.
// Each is built as the tokenizer.json that expresses the same pipeline (HfTokenizer; the
// SentencePiece model merging by score through HfTokenizer::use_scores). Control and unknown
// tokens (token_type 3, 2) are special tokens, matched in text only when special tokens are
// allowed; user-defined ones (4) always match, as llama.cpp's parse_special does. BOS/EOS come
// from the metadata (add_bos_token/add_eos_token as llama.cpp's defaults), end-of-generation
// tokens as llama.cpp finds them, the chat template from tokenizer.chat_template. Anything else
// (other models, pre-tokenizer names, malformed arrays, ids out of range) is refused by name,
// never approximated. A file with no vocabulary of a 256-token model is byte-level, as a model
// directory without files is.
#include <algorithm>
#include <array>
#include <cmath>
#include <cctype>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "core/check.h"
#include "io/gguf.h"
#include "io/json.h"
#include "mhsa/tokenizer.h"
#include "text/hf_tokenizer.h"
#include "text/unicode_data.h"

namespace mhsa::text {
namespace {

using detail::fail;
using detail::message;
using detail::quote;
using json = nlohmann::json;

// llama.cpp's token types (llama_token_type).
enum TokenType : int64_t { kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// GPT-2's pattern as Hugging Face's ByteLevel writes it (the text regex.cpp's scanner knows).
// llama.cpp's lists end it without "|\s+", which splits the same: a lone whitespace character
// before a non-space is then left between two matches, its own piece all the same.
constexpr std::string_view kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama 3's and Qwen2's patterns as their tokenizer.json files write them (llama.cpp spells the
// (?i:...) out as [sS] etc.; Oniguruma's case folding also lets U+017F ſ stand for s).
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen35 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// DeepSeek's CJK pattern [一-龥ࠀ-一가-퟿]+ as llama.cpp matches it: it runs the patterns without
// \p{..} through std::wregex on the text with each White_Space character above U+007F replaced
// by U+000B, so the class never takes U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F or
// U+3000 (inside U+0800-U+4E00); \s still does.
constexpr std::string_view kDeepseekCjk =
    R"([一-龥가-퟿\x{0800}-\x{167F}\x{1681}-\x{1FFF}\x{200B}-\x{2027}\x{202A}-\x{202E}\x{2030}-\x{205E}\x{2060}-\x{2FFF}\x{3001}-\x{4E00}]+)";
// DeepSeek LLM's letters (the Latin, Greek, Cyrillic, ... ranges of its tokenizer.json) and
// punctuation; the punctuation's range U+3000-U+3002 is U+3001-U+3002 for the same reason.
constexpr std::string_view kDeepseekLetters =
    R"(\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+)";
constexpr std::string_view kDeepseekPunctuation = R"(\s?[!-/:-~！-／：-～‘-‟\x{3001}-\x{3002}]+)";

// A pre-tokenizer of llama.cpp's llm_tokenizer_bpe: the names that select it, its regexes (each
// splits every piece in turn, keeping matches and the text between them), and the flags
// llama.cpp sets with it.
struct PreTokenizer {
  std::vector<std::string_view> names;
  std::vector<std::string_view> regexes;
  bool ignore_merges = false, add_bos = false;
};

const std::vector<PreTokenizer>& pre_tokenizers() {
  static const std::vector<PreTokenizer> table = {
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"}, {kLlama3}, true, true},
      {{"dbrx", "smaug-bpe"}, {kLlama3}},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2"}, {kQwen2}},
      {{"qwen35"}, {kQwen35}},
      {{"phi-2", "mpt", "olmo"}, {kGpt2}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}, {R"(\p{N})", kGpt2}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}},
      {{"deepseek-coder"}, {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"}},
      // \s+$: the pieces it sees hold no "\n" but a lone one ("[\r\n]" split them off first), so
      // Oniguruma's $ (regex.cpp) and llama.cpp's std::wregex $ (the end of the piece) agree.
      {{"deepseek-llm"}, {"[\r\n]", kDeepseekLetters, kDeepseekPunctuation, R"(\s+$)", kDeepseekCjk, R"(\p{N}+)"}},
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
  };
  return table;
}

std::string supported_names() {
  std::string out = "\"gpt-2\"";
  for (const PreTokenizer& p : pre_tokenizers())
    for (std::string_view n : p.names) out += message(", \"", n, "\"");
  return out;
}

// What llama.cpp's load() reads, checked: a token list, its types and scores of the same length,
// special token ids inside it.
struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int64_t> types;
  std::vector<float> scores;
};

std::string key_arg(std::string_view key) { return "metadata " + quote(key); }

Vocab read_vocab(const detail::GgufFile& f, const std::string& fn, bool want_scores) {
  Vocab v;
  const std::vector<std::string_view> tokens = f.get_strings("tokenizer.ggml.tokens");
  if (tokens.empty())
    fail(fn, key_arg("tokenizer.ggml.tokens"), "a non-empty array of strings (the vocabulary)",
         f.value("tokenizer.ggml.tokens") ? "an empty array" : "none");
  if (tokens.size() > (size_t{1} << 24))
    fail(fn, key_arg("tokenizer.ggml.tokens"), "at most 2^24 tokens", message(tokens.size()));
  const size_t n = tokens.size();
  v.tokens.reserve(n);
  for (size_t id = 0; id < n; ++id)  // llama.cpp's name for an empty token
    v.tokens.emplace_back(tokens[id].empty() ? message("[EMPTY_", id, "]") : std::string(tokens[id]));
  if (f.value("tokenizer.ggml.token_type")) {
    v.types = f.get_ints("tokenizer.ggml.token_type");
    if (v.types.size() != n)
      fail(fn, key_arg("tokenizer.ggml.token_type"), message("one type per token (", n, ")"), message(v.types.size(), " types"));
    for (size_t id = 0; id < n; ++id)
      if (v.types[id] < kUndefined || v.types[id] > kByte)
        fail(fn, message(key_arg("tokenizer.ggml.token_type"), "[", id, "]"),
             "a llama.cpp token type 0..6 (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)",
             std::to_string(v.types[id]));
  } else {
    v.types.assign(n, kNormal);
  }
  if (const detail::GgufValue* s = f.value("tokenizer.ggml.scores")) {
    if (s->type == detail::GgufValueType::array && s->elem == detail::GgufValueType::i32) {
      for (const int64_t x : f.get_ints("tokenizer.ggml.scores")) v.scores.push_back(static_cast<float>(x));
    } else {
      v.scores = f.get_floats("tokenizer.ggml.scores");  // an error naming the key unless float32
    }
    if (v.scores.size() != n)
      fail(fn, key_arg("tokenizer.ggml.scores"), message("one score per token (", n, ")"), message(v.scores.size(), " scores"));
    for (size_t id = 0; id < n; ++id)
      if (std::isnan(v.scores[id])) fail(fn, message(key_arg("tokenizer.ggml.scores"), "[", id, "]"), "a number", "NaN");
  } else if (want_scores) {
    fail(fn, key_arg("tokenizer.ggml.scores"), "an array of float32 (SentencePiece's piece scores)", "none");
  }
  return v;
}

// tokenizer.ggml.<name>_token_id: the id when the key is there (an error when it names no token),
// else the fallback when it is a token, else -1.
int32_t special_id(const detail::GgufFile& f, const std::string& fn, std::string_view name, size_t n, int32_t fallback) {
  const std::string key = message("tokenizer.ggml.", name, "_token_id");
  const std::optional<uint64_t> id = f.get_uint(key);
  if (!id) return fallback >= 0 && static_cast<size_t>(fallback) < n ? fallback : -1;
  if (*id >= n) fail(fn, key_arg(key), message("the id of a token (below ", n, ")"), std::to_string(*id));
  return static_cast<int32_t>(*id);
}

// The tokenizer_config.json and generation_config.json a converter would have had: the special
// tokens by name (chat templates read them), the chat template, and the end-of-generation ids —
// EOS, EOT, EOM, and the control tokens llama.cpp treats as ending a generation by their text.
std::pair<std::string, std::string> configs(const detail::GgufFile& f, const std::string& fn, const Vocab& v) {
  const size_t n = v.tokens.size();
  const bool spm = f.get_string("tokenizer.ggml.model") == "llama";
  json config = json::object(), generation = json::object();
  const int32_t bos = special_id(f, fn, "bos", n, spm ? 1 : -1), eos = special_id(f, fn, "eos", n, spm ? 2 : -1);
  const int32_t unk = special_id(f, fn, "unknown", n, spm ? 0 : -1), pad = special_id(f, fn, "padding", n, -1);
  for (const auto& [name, id] : {std::pair{"bos_token", bos}, {"eos_token", eos}, {"unk_token", unk}, {"pad_token", pad}})
    if (id >= 0) config[name] = v.tokens[static_cast<size_t>(id)];
  if (const std::optional<std::string> t = f.get_string("tokenizer.chat_template")) config["chat_template"] = *t;
  json ends = json::array();
  const auto end = [&](int32_t id) {
    if (id >= 0 && std::find(ends.begin(), ends.end(), json(id)) == ends.end()) ends.push_back(id);
  };
  end(eos);
  end(special_id(f, fn, "eot", n, -1));
  end(special_id(f, fn, "eom", n, -1));
  static constexpr std::array<std::string_view, 13> kEnds = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                                            "<|endoftext|>", "<|eom_id|>", "<EOT>", "<|end_of_text|>",
                                                            "<end_of_utterance>", "<｜end▁of▁sentence｜>", "<eos>",
                                                            "<turn|>", "<|tool_response>"};
  for (size_t id = 0; id < n; ++id)
    if (v.types[id] == kControl && std::find(kEnds.begin(), kEnds.end(), v.tokens[id]) != kEnds.end())
      end(static_cast<int32_t>(id));
  if (!ends.empty()) generation["eos_token_id"] = ends;
  if (bos >= 0) generation["bos_token_id"] = bos;
  const auto dump = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
  return {dump(config), dump(generation)};
}

json added_token(const Vocab& v, size_t id, bool rstrip) {
  return {{"id", id}, {"content", v.tokens[id]}, {"special", v.types[id] != kUserDefined}, {"lstrip", false},
          {"rstrip", rstrip}, {"normalized", false}, {"single_word", false}};
}

// BOS and EOS around the text when add_special_tokens asks for them (llama.cpp's add_bos/add_eos).
json post_processor(const detail::GgufFile& f, const std::string& fn, const Vocab& v, bool add_bos_default,
                    bool always_bos = false) {
  const size_t n = v.tokens.size();
  const bool spm = f.get_string("tokenizer.ggml.model") == "llama";
  const bool add_bos = always_bos || f.get_bool("tokenizer.ggml.add_bos_token").value_or(add_bos_default);
  const bool add_eos = f.get_bool("tokenizer.ggml.add_eos_token").value_or(false);
  json single = json::array(), specials = json::object();
  const auto add = [&](const char* name, int32_t fallback, bool want) {
    if (!want) return;
    const int32_t id = special_id(f, fn, name, n, fallback);
    if (id < 0)
      fail(fn, key_arg(message("tokenizer.ggml.", name, "_token_id")),
           message("a token id (tokenizer.ggml.add_", name, "_token is true)"), "none");
    const std::string& t = v.tokens[static_cast<size_t>(id)];
    single.push_back({{"SpecialToken", {{"id", t}, {"type_id", 0}}}});
    specials[t] = {{"id", t}, {"ids", {id}}, {"tokens", {t}}};
  };
  add("bos", spm ? 1 : -1, add_bos);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  add("eos", spm ? 2 : -1, add_eos);
  if (single.size() == 1) return nullptr;
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", json::array()}, {"special_tokens", specials}};
}

// The vocabulary as tokenizer.json's: every token in the model's vocab (llama.cpp finds any of
// them by its text), the special and user-defined ones also as added tokens.
void vocab_json(json& model, json& added, const Vocab& v, const std::string& fn, bool phi3) {
  json vocab = json::object();
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    json& slot = vocab[v.tokens[id]];
    if (!slot.is_null())
      fail(fn, key_arg("tokenizer.ggml.tokens"), "each token once",
           message(quote(v.tokens[id]), " at ", slot.get<size_t>(), " and ", id));
    slot = id;
    const int64_t t = v.types[id];
    if (t == kControl || t == kUnknown || t == kUserDefined) {
      // llama.cpp's Phi-3 fix-up: its special tokens eat the spaces after them, but for these.
      const bool rstrip = phi3 && v.tokens[id] != "<unk>" && v.tokens[id] != "<s>" && v.tokens[id] != "<|endoftext|>";
      added.push_back(added_token(v, id, rstrip));
    }
  }
  model["vocab"] = std::move(vocab);
}

void sentencepiece(const detail::GgufFile& f, const std::string& fn, std::unique_ptr<HfTokenizer>& out) {
  Vocab v = read_vocab(f, fn, true);
  const size_t n = v.tokens.size();
  json model = {{"type", "BPE"}, {"merges", json::array()}, {"byte_fallback", true}};
  json added = json::array();
  std::string name = f.get_string("general.name").value_or("");
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  vocab_json(model, added, v, fn, name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos);
  // Byte tokens: llama.cpp reads the byte from a type-6 token's text, which must say <0xNN>.
  for (size_t id = 0; id < n; ++id) {
    const std::string& t = v.tokens[id];
    if (v.types[id] == kByte && !(t.size() == 6 && t.starts_with("<0x") && t[5] == '>' &&
                                  std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4]))))
      fail(fn, message(key_arg("tokenizer.ggml.tokens"), "[", id, "]"), "a byte token (type 6) written <0xNN>", quote(t));
  }
  // A character no piece covers becomes its bytes' tokens, else the unknown token (llama.cpp's
  // default id 0 when the metadata names none).
  if (const int32_t unk = special_id(f, fn, "unknown", n, 0); unk >= 0) model["unk_token"] = v.tokens[static_cast<size_t>(unk)];
  // The text gets "▁" for each space, and one before it (add_space_prefix) that decoding removes.
  const bool prefix = f.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
  json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}};
  json normalizer = prefix ? json{{"type", "Sequence"}, {"normalizers", {{{"type", "Prepend"}, {"prepend", "▁"}}, replace}}} : replace;
  json decoders = {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                   {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}}};
  if (prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  json root = {{"model", std::move(model)}, {"added_tokens", std::move(added)}, {"normalizer", std::move(normalizer)},
               {"decoder", {{"type", "Sequence"}, {"decoders", std::move(decoders)}}},
               {"post_processor", post_processor(f, fn, v, true)}};
  const auto [config, generation] = configs(f, fn, v);
  out = std::make_unique<HfTokenizer>(root, config, generation, fn);
  std::vector<bool> mergeable(n);
  for (size_t id = 0; id < n; ++id)  // as sentencepiece: text never forms control, unknown or unused pieces
    mergeable[id] = v.types[id] != kControl && v.types[id] != kUnknown && v.types[id] != kUnused;
  out->use_scores(std::move(v.scores), std::move(mergeable));
}

// tokenizer.ggml.merges as tokenizer.json's, each checked.
json merges_json(const detail::GgufFile& f, const std::string& fn, const Vocab& v) {
  std::unordered_set<std::string_view> known(v.tokens.begin(), v.tokens.end());
  // Merges "a b": split at the first space after the first character, as llama.cpp does.
  json merges = json::array();
  const std::vector<std::string_view> list = f.get_strings("tokenizer.ggml.merges");
  if (list.empty())
    fail(fn, key_arg("tokenizer.ggml.merges"), "an array of merges \"a b\"", f.value("tokenizer.ggml.merges") ? "an empty array" : "none");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string_view m = list[i];
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
    const std::string_view a = m.substr(0, sp == std::string_view::npos ? 0 : sp);
    const std::string_view b = sp == std::string_view::npos ? std::string_view() : m.substr(sp + 1);
    if (sp == std::string_view::npos || !known.contains(a) || !known.contains(b) || !known.contains(std::string(a) + std::string(b)))
      fail(fn, message(key_arg("tokenizer.ggml.merges"), "[", i, "]"), "\"a b\": two tokens whose concatenation is a token",
           quote(m));
    if (b.find(' ') == std::string_view::npos) merges.push_back(m);  // tokenizer.json's "a b" when that is unambiguous
    else merges.push_back({a, b});
  }
  return merges;
}

// Byte-level BPE behind one of llama.cpp's pre-tokenizers.
void byte_level(const detail::GgufFile& f, const std::string& fn, const PreTokenizer& pre, std::unique_ptr<HfTokenizer>& out) {
  const Vocab v = read_vocab(f, fn, false);
  json model = {{"type", "BPE"}, {"ignore_merges", pre.ignore_merges}};
  json added = json::array();
  vocab_json(model, added, v, fn, false);
  // A byte with no token (Falcon's and StarCoder's vocabularies lack some) is left out of the
  // ids, as llama.cpp and tokenizers leave it out.
  model["merges"] = merges_json(f, fn, v);
  json splits = json::array();
  for (std::string_view r : pre.regexes)
    splits.push_back({{"type", "Split"}, {"pattern", {{"Regex", r}}}, {"behavior", "Isolated"}, {"invert", false}});
  splits.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}});
  json root = {{"model", std::move(model)}, {"added_tokens", std::move(added)},
               {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", std::move(splits)}}},
               {"decoder", {{"type", "ByteLevel"}}}, {"post_processor", post_processor(f, fn, v, pre.add_bos)}};
  const auto [config, generation] = configs(f, fn, v);
  out = std::make_unique<HfTokenizer>(root, config, generation, fn);
}

// "gemma4": BPE over the text's characters (not its bytes) with each space written "▁", merged by
// rank within each line and each run of "\n" (a run that is a token is that token: llama.cpp's
// Gemma 4 rule); a character no token covers becomes its bytes' <0xNN> tokens. BOS always added
// (llama.cpp's override); <|tool_response>, one of llama.cpp's end-of-generation names, is a
// control token whatever its type says, as llama.cpp makes it one.
void gemma4(const detail::GgufFile& f, const std::string& fn, std::unique_ptr<HfTokenizer>& out) {
  Vocab v = read_vocab(f, fn, false);
  const size_t n = v.tokens.size();
  for (size_t id = 0; id < n; ++id)
    if (v.tokens[id] == "<|tool_response>") v.types[id] = kControl;
  // llama.cpp leaves out a byte whose <0xNN> token is missing, tokenizers the whole character:
  // the same only with all 256 there.
  std::unordered_set<std::string_view> known(v.tokens.begin(), v.tokens.end());
  for (int b = 0; b < 256; ++b) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    const std::string t = message("<0x", kHex[b >> 4], kHex[b & 15], ">");
    if (!known.contains(t))
      fail(fn, key_arg("tokenizer.ggml.tokens"), "the 256 byte tokens <0x00>..<0xFF> (a gemma4 vocabulary)",
           message("none for ", t));
  }
  json model = {{"type", "BPE"}, {"byte_fallback", true}, {"merges", merges_json(f, fn, v)}};
  json added = json::array();
  vocab_json(model, added, v, fn, false);
  json root = {
      {"model", std::move(model)},
      {"added_tokens", std::move(added)},
      {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}},
      {"pre_tokenizer",
       {{"type", "Split"}, {"pattern", {{"Regex", "[^\n]+|[\n]+"}}}, {"behavior", "Isolated"}, {"invert", false}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders", {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}}, {{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}},
      {"post_processor", post_processor(f, fn, v, true, true)}};
  const auto [config, generation] = configs(f, fn, v);
  out = std::make_unique<HfTokenizer>(root, config, generation, fn);
  out->whole_newline_runs();
}


}  // namespace

Tokenizer gguf_tokenizer(const detail::GgufFile& f, int64_t vocab_size) {
  const std::string fn = "gguf " + f.source();
  const std::string model = f.get_string("tokenizer.ggml.model").value_or("none");
  const std::string chat_template = f.get_string("tokenizer.chat_template").value_or("");
  if ((model == "none" || model == "no_vocab") && vocab_size == 256) {  // `mhsa train`'s
    Tokenizer t = Tokenizer::bytes();
    t.set_gguf_chat_template(chat_template);
    return t;
  }
  const std::string pre = f.get_string("tokenizer.ggml.pre").value_or("default");  // llama.cpp's default too
  std::unique_ptr<HfTokenizer> hf;
  if (model == "llama") {
    sentencepiece(f, fn, hf);
    return Tokenizer::from_hf(std::move(hf));
  }
  if (model == "gemma4") {
    gemma4(f, fn, hf);
    return Tokenizer::from_hf(std::move(hf));
  }
  if (model != "gpt2")
    fail(fn, key_arg("tokenizer.ggml.model"),
         "\"llama\" (SentencePiece), \"gpt2\" (byte-level BPE) or \"gemma4\" (BPE of characters): the GGUF tokenizers mhsa reads",
         quote(model));
  // "gpt-2" with special or added tokens beyond <|endoftext|> (a Hugging Face tokenizer.json that
  // mhsa quantize or a converter wrote) is the GPT-2 pattern with those tokens.
  const std::vector<int64_t> types = f.value("tokenizer.ggml.token_type") ? f.get_ints("tokenizer.ggml.token_type")
                                                                         : std::vector<int64_t>();
  const std::vector<std::string_view> names = f.get_strings("tokenizer.ggml.tokens");
  bool added = false;
  for (size_t id = 0; id < types.size() && id < names.size(); ++id)
    added = added || ((types[id] == kControl || types[id] == kUserDefined || types[id] == kUnknown) && names[id] != "<|endoftext|>");
  if (pre == "gpt-2" && added) {
    byte_level(f, fn, PreTokenizer{{"gpt-2"}, {kGpt2}}, hf);
    return Tokenizer::from_hf(std::move(hf));
  }
  if (pre != "gpt-2") {
    for (const PreTokenizer& p : pre_tokenizers())
      if (std::find(p.names.begin(), p.names.end(), pre) != p.names.end()) {
        byte_level(f, fn, p, hf);
        return Tokenizer::from_hf(std::move(hf));
      }
    fail(fn, key_arg("tokenizer.ggml.pre"), "a pre-tokenizer mhsa reads (" + supported_names() + ")", quote(pre));
  }
  nlohmann::json vocab = nlohmann::json::object();
  const std::vector<std::string_view> tokens = f.get_strings("tokenizer.ggml.tokens");
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string token(tokens[id]);
    if (invalid_utf8_at(token) != std::string_view::npos)  // byte-level BPE tokens are printable characters, never raw bytes
      detail::fail(fn, "metadata 'tokenizer.ggml.tokens'", "tokens of valid UTF-8",
                   "invalid UTF-8 in token " + std::to_string(id));
    if (vocab.contains(token))
      detail::fail(fn, "metadata 'tokenizer.ggml.tokens'", "each token once", detail::quote(token) + " twice");
    vocab[token] = id;
  }
  std::string merges = "#version: 0.2\n";
  for (std::string_view m : f.get_strings("tokenizer.ggml.merges")) merges.append(m).push_back('\n');
  Tokenizer t = Tokenizer::parse(vocab.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict), merges,
                                 fn + ": tokenizer.ggml.tokens", fn + ": tokenizer.ggml.merges");
  t.set_gguf_chat_template(chat_template);
  return t;
}

}  // namespace mhsa::text
