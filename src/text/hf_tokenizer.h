// text/hf_tokenizer.h — Hugging Face `tokenizer.json` (the `tokenizers` library's format): a BPE
// model, byte-level (GPT-2, Llama 3, Qwen2) or SentencePiece-style (Llama 2, Mistral, Gemma), with
// its normalizer, pre-tokenizer, added tokens, post-processor and decoder, encoding and decoding
// exactly as `tokenizers` does. Components outside the supported set (see docs) are refused by
// name at load, never approximated. tokenizer_config.json and generation_config.json add the
// BOS/EOS tokens and the chat template. A GGUF file's tokenizer (gguf_tokenizer.cpp) is built as
// such a file; its SentencePiece model then merges by the pieces' scores (use_scores) instead of
// by a list of merges. Private to the library: mhsa::Tokenizer is the API.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "text/bpe.h"
#include "text/normalize.h"
#include "text/regex.h"
#include "text/word_cache.h"

namespace mhsa::text {

struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class T>
using StrMap = std::unordered_map<std::string, T, StrHash, std::equal_to<>>;

class HfTokenizer {
 public:
  // The files' contents (config and generation may be empty: absent); `dir` names them in errors.
  HfTokenizer(std::string_view tokenizer_json, std::string_view config_json, std::string_view generation_json,
              const std::string& dir);
  // The same from tokenizer.json already parsed (gguf_tokenizer.cpp builds one).
  HfTokenizer(const nlohmann::json& tokenizer, std::string_view config_json, std::string_view generation_json,
              const std::string& dir);
  ~HfTokenizer();

  // SentencePiece BPE as llama.cpp runs a GGUF "llama" vocabulary (and as sentencepiece does):
  // the model ignores the merges and, starting from the characters of a piece, repeatedly joins
  // the adjacent pair whose concatenation is a token with the highest score (the leftmost of
  // equals); a character that ends up in no token becomes its bytes' <0xNN> tokens, else the
  // unknown token. scores[id] for every id; `mergeable[id]` false for tokens text never forms
  // (control, unknown, unused). Not for a byte-level model.
  void use_scores(std::vector<float> scores, std::vector<bool> mergeable);
  // llama.cpp's Gemma 4 rule: a piece made only of "\n" that is a token is that token, without the
  // merges (ignore_merges for those pieces alone). Not for a byte-level model.
  void whole_newline_runs() { newline_runs_ = true; }

  // As tokenizers' Tokenizer.encode(text, add_special_tokens): added tokens are matched first
  // (special ones only with allow_special; otherwise their text is ordinary text).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens, bool allow_special) const;
  // As tokenizers' decode: valid UTF-8. Ids must be in [0, vocab_size()); ids no token has are skipped.
  std::string decode(std::span<const int32_t> ids, bool skip_special) const;
  // The bytes the token adds in the middle of a text (its exact bytes, before any U+FFFD).
  std::string token_bytes(int32_t id) const;
  const std::string& token_string(int32_t id) const;  // as the file writes it
  std::optional<int32_t> token_id(std::string_view content) const;
  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  bool is_special(int32_t id) const;
  bool has_token(int32_t id) const;

  std::optional<int32_t> bos_id;
  std::vector<int32_t> eos_ids;
  std::string bos_token, eos_token, chat_template;  // chat_template: the only or the "default" one
  // tokenizer_config.json's chat_template as a list: name → source ("default", "tool_use", ...).
  std::vector<std::pair<std::string, std::string>> chat_templates;
  // The special tokens transformers passes to a chat template: name ("bos_token", "pad_token",
  // ...) → text.
  std::vector<std::pair<std::string, std::string>> template_tokens;
  std::vector<std::pair<std::string, int32_t>> special_tokens;  // every added token with special: true

  enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };
  struct Normalizer;
  struct PreTokenizer;
  struct Decoder;

 private:
  struct AddedToken {
    std::string content;
    int32_t id;
    bool special, lstrip, rstrip, normalized, single_word;
  };
  enum class Kind : uint8_t { none, model, added, special };

  // tokens
  std::vector<std::string> tokens_;  // id → the file's spelling ("" for an id no token has)
  std::vector<Kind> kinds_;
  StrMap<int32_t> model_ids_;        // model token → id; byte-level: keyed by the bytes it stands for
  StrMap<int32_t> content_ids_;      // the file's spelling (added tokens first) → id
  std::vector<AddedToken> added_;
  std::vector<std::vector<int32_t>> added_by_byte_[2];  // [normalized][first byte] → added_ indices, longest first
  std::array<bool, 256> added_starts_[2]{};             // [normalized][byte]: some added token starts with it
  int added_first_[2] = {-2, -2};  // [normalized]: the one byte every added token starts with; -1:
                                   // several bytes; -2: no added token
  // model
  BpeMerges merges_;
  bool byte_level_ = false, byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  bool by_score_ = false;         // use_scores: SentencePiece merging by score
  bool newline_runs_ = false;     // whole_newline_runs
  std::vector<float> scores_;     // by_score_: id → score
  std::vector<bool> mergeable_;   // by_score_: id → text may form it
  std::optional<int32_t> unk_;
  std::array<int32_t, 256> byte_ids_{};   // byte-level: the token of each byte's character; -1: none
  std::array<int32_t, 256> fallback_ids_{};  // <0xNN>; -1: none
  std::array<int32_t, 128> ascii_ids_{};     // not byte-level: the token of each ASCII character; -1: none
  // Where model() may cut a long piece (not byte-level): the pairs (x, s) of characters such that
  // a merge joins a token ending in x to one starting with s; ASCII pairs as bits [x][s].
  bool cut_words_ = false;
  std::array<uint64_t, 256> ascii_joins_{};
  std::unordered_set<uint64_t> joins_;  // x << 32 | s
  // pipeline
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  Regex::Scanner scan_ = nullptr;  // the pre-tokenizer's PreTokenizer::scanner()
  std::unique_ptr<Decoder> decoder_;
  std::vector<int32_t> prefix_, suffix_;  // the post-processor's tokens around a single sequence

  static constexpr size_t kBatch = 32;  // pre-tokens looked up together (model_words)
  mutable std::mutex cache_mutex_;
  mutable WordCache cache_;  // pre-token (or word, see model()) → its ids

  struct Span {
    size_t begin, end;
    int32_t token;  // -1: text
  };
  void split_added(std::string_view text, bool normalized, bool allow_special, std::vector<Span>& out) const;
  void add_join(std::string_view left, std::string_view right);
  void model(std::string_view piece, std::vector<int32_t>& out) const;
  void model_word(std::string_view piece, std::vector<int32_t>& out) const;
  void model_words(std::span<const std::string_view> words, std::vector<int32_t>& out) const;
  void cached(std::string_view word, uint64_t h, std::vector<int32_t>& out) const;
  void model_uncached(std::string_view piece, std::vector<int32_t>& out) const;
  void model_by_score(std::string_view piece, std::vector<int32_t>& out) const;
  void init(const nlohmann::json& root, std::string_view config_json, std::string_view generation_json,
            const std::string& dir);
  std::vector<std::string> decode_tokens(std::vector<std::string> tokens, bool exact) const;
};

// Rust's String::from_utf8_lossy: each maximal invalid subpart becomes one U+FFFD (as Python's
// bytes.decode("utf-8", "replace")).
std::string lossy_utf8(std::string_view bytes);

}  // namespace mhsa::text
