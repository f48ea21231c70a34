// mhsa/tokenizer.h — GPT-2's byte-level BPE tokenizer (vocab.json + merges.txt, or OpenAI's
// identical encoder.json + vocab.bpe), with GPT-2's exact pre-tokenisation: its ids equal
// tiktoken's "gpt2" and Hugging Face's GPT-2 tokenizer's for any text. Loading validates both
// files (malformed JSON, bad or duplicate ids, merges of unknown tokens) and throws mhsa::Error
// naming the file, key or line. A loaded tokenizer is immutable apart from an internal,
// locked cache: encode may run on many threads at once. Not a general tokenizer library: one
// special token (<|endoftext|>), no normalisation, no added tokens, no offsets.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mhsa {

class Tokenizer {
 public:
  // vocab: token → id JSON (vocab.json / encoder.json); merges: one merge per line after the
  // "#version" line (merges.txt / vocab.bpe). Throws mhsa::Error naming the file and the problem.
  static Tokenizer load(const std::filesystem::path& vocab, const std::filesystem::path& merges);
  // The same from the files' contents; the names stand for the files in errors.
  static Tokenizer parse(std::string_view vocab_json, std::string_view merges_txt,
                         const std::string& vocab_name = "vocab.json", const std::string& merges_name = "merges.txt");
  // A directory with vocab.json + merges.txt (Hugging Face) or encoder.json + vocab.bpe (OpenAI).
  static Tokenizer load_dir(const std::filesystem::path& dir);
  // The byte-level tokenizer of models trained by `mhsa train`: 256 tokens, id = byte, no merges
  // and no special token.
  static Tokenizer bytes();
  // The tokenizer of a model directory: its vocabulary files when it has them, else bytes() for
  // a model of 256 tokens; an error naming the directory otherwise.
  static Tokenizer for_model(const std::filesystem::path& dir, int64_t vocab_size);

  // Any bytes (invalid UTF-8 included) → ids; decode(encode(s)) == s byte for byte. With
  // allow_special, the literal text of a special token ("<|endoftext|>") becomes its id;
  // otherwise it is ordinary text.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const;
  // The pre-tokens of `text`: the pieces GPT-2's regex cuts it into before BPE (each is encoded
  // on its own). Views into `text`; together they are all of it.
  static std::vector<std::string_view> pretokenize(std::string_view text);
  // ids → the bytes they stand for (possibly invalid UTF-8 at a cut). Throws for an id out of range.
  std::string decode(std::span<const int32_t> ids) const;
  // The bytes of one token; throws for an id out of range.
  std::string_view token_bytes(int32_t id) const;
  // The token as the vocab file spells it, in GPT-2's printable byte alphabet ("Ġworld" for
  // " world"): always valid UTF-8, unlike token_bytes, so fit for printing and JSON.
  std::string token_string(int32_t id) const;
  // The id of the token with exactly these bytes, if the vocab has one.
  std::optional<int32_t> token_id(std::string_view bytes) const;
  int32_t vocab_size() const;
  int32_t eos_id() const;  // <|endoftext|>

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mhsa
