// mhsa/tokenizer.h — the tokenizers of today's models: Hugging Face `tokenizer.json` (BPE,
// byte-level as GPT-2/Llama 3/Qwen2 or SentencePiece-style as Llama 2/Mistral/Gemma, with its
// normalizers, pre-tokenizers, added tokens, post-processor and decoders; ids and text equal
// to the `tokenizers` library's), and GPT-2's vocab.json + merges.txt (or OpenAI's identical
// encoder.json + vocab.bpe; ids equal to tiktoken's "gpt2"). Loading validates the files and
// throws mhsa::Error naming the file, key or line, and names any tokenizer.json component that is
// not supported (WordPiece, Unigram, an unknown normalizer, ...) rather than tokenising
// differently. A loaded tokenizer is immutable apart from an internal, locked cache: encode may
// run on many threads at once. Not a general tokenizer library: no offsets, no batching, no
// training.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mhsa {

class Tokenizer;
namespace detail {
class GgufFile;
}  // namespace detail
namespace text {
class HfTokenizer;
Tokenizer gguf_tokenizer(const detail::GgufFile& file, int64_t vocab_size);  // text/gguf_tokenizer.cpp
}  // namespace text

struct EncodeOptions {
  // Add the post-processor's special tokens (tokenizer.json's TemplateProcessing: BOS, ...).
  bool add_special_tokens = false;
  // Special tokens written in the text become their ids; otherwise their text is ordinary text.
  // (Added tokens that are not special always match, as in Hugging Face tokenizers.)
  bool allow_special = false;
};

// transformers' apply_chat_template arguments beyond the messages.
struct ChatTemplateOptions {
  bool add_generation_prompt = false;
  // A JSON object of template variables (tools, documents, ...), over the config's special tokens.
  std::string_view variables_json = "{}";
  // "" or the final message's field to leave open for the model to continue ("content"; a
  // reasoning field): see ChatTemplate::render. transformers' continue_final_message=True is "content".
  std::string_view continue_final_message;
  // The name of one of the tokenizer's named templates, or else a Jinja template used instead of
  // the tokenizer's; "" for the tokenizer's own (transformers' chat_template=).
  std::string_view chat_template;
};

class Tokenizer {
 public:
  // vocab: token → id JSON (vocab.json / encoder.json); merges: one merge per line after the
  // "#version" line (merges.txt / vocab.bpe). Throws mhsa::Error naming the file and the problem.
  static Tokenizer load(const std::filesystem::path& vocab, const std::filesystem::path& merges);
  // The same from the files' contents; the names stand for the files in errors.
  static Tokenizer parse(std::string_view vocab_json, std::string_view merges_txt,
                         const std::string& vocab_name = "vocab.json", const std::string& merges_name = "merges.txt");
  // A directory with tokenizer.json (with tokenizer_config.json and generation_config.json when
  // present: BOS/EOS, chat template), else vocab.json + merges.txt (Hugging Face GPT-2) or
  // encoder.json + vocab.bpe (OpenAI). A path to a file is a GGUF file: the tokenizer its
  // metadata holds (see for_model).
  static Tokenizer load_dir(const std::filesystem::path& dir);
  // tokenizer.json's text (and tokenizer_config.json's, generation_config.json's, or empty);
  // `dir` stands for their directory in errors.
  static Tokenizer parse_json(std::string_view tokenizer_json, std::string_view config_json = {},
                              std::string_view generation_json = {}, const std::string& dir = ".");
  // The byte-level tokenizer of models trained by `mhsa train`: 256 tokens, id = byte, no merges
  // and no special token.
  static Tokenizer bytes();
  // The tokenizer of a model directory: its vocabulary files when it has them, else bytes() for
  // a model of 256 tokens; an error naming the directory otherwise. A path to a file is a GGUF
  // file: the tokenizer its metadata holds, encoding as llama.cpp does — SentencePiece
  // (tokenizer.ggml.model "llama": Llama 2, Mistral, Phi-3) or byte-level BPE ("gpt2") with one of
  // llama.cpp's pre-tokenizers ("gpt-2", "llama-bpe", "qwen2", "smollm", "starcoder", "default",
  // ...); these but "gpt-2" behave as a tokenizer.json (is_tokenizer_json()). Any other GGUF
  // tokenizer is refused by name.
  static Tokenizer for_model(const std::filesystem::path& dir, int64_t vocab_size);

  // Any bytes (invalid UTF-8 included) → ids; decode(encode(s)) == s byte for byte. With
  // allow_special, the literal text of a special token ("<|endoftext|>") becomes its id;
  // otherwise it is ordinary text.
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const;
  // Hugging Face's encode(text, add_special_tokens) is encode(text, {add_special_tokens, true}).
  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options) const;
  // The pre-tokens of `text`: the pieces GPT-2's regex cuts it into before BPE (each is encoded
  // on its own). Views into `text`; together they are all of it.
  static std::vector<std::string_view> pretokenize(std::string_view text);
  // ids → text. GPT-2's files: the exact bytes (possibly invalid UTF-8 at a cut); tokenizer.json:
  // the decoder chain's text, equal to Hugging Face's decode (valid UTF-8). skip_special_tokens
  // leaves out special tokens. Ids past the vocabulary are left out too, as Hugging Face's decode
  // does; a negative id throws.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  // The bytes one token adds in the middle of a text; throws for an id out of range.
  std::string token_bytes(int32_t id) const;
  // The token as the vocab file spells it (GPT-2's printable byte alphabet, "Ġworld" for
  // " world"; "▁world" in SentencePiece style): valid UTF-8 unless the file's own spelling is
  // not, so fit for printing and JSON.
  std::string token_string(int32_t id) const;
  // The id of the token with exactly these bytes (GPT-2's files) or this spelling
  // (tokenizer.json: added tokens first, then the vocab as the file writes it), if any.
  std::optional<int32_t> token_id(std::string_view bytes) const;
  int32_t vocab_size() const;  // one more than the largest id
  int32_t eos_id() const;      // the first of eos_ids(), -1 if none
  std::vector<int32_t> eos_ids() const;  // <|endoftext|>; tokenizer.json: the configs' EOS tokens
  std::optional<int32_t> bos_id() const;
  bool is_special(int32_t id) const;
  std::vector<std::pair<std::string, int32_t>> special_tokens() const;
  // tokenizer_config.json's chat_template (a GGUF file's tokenizer.chat_template), bos_token and
  // eos_token ("" when absent).
  std::string chat_template() const;
  std::string bos_token() const;
  std::string eos_token() const;
  // A tokenizer.json, or a GGUF tokenizer built as one: BOS from the post-processor, special
  // tokens as Hugging Face matches them.
  bool is_tokenizer_json() const;
  // transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt, **variables):
  // the chat template rendered (mhsa/chat_template.h) with tokenizer_config.json's special tokens
  // (bos_token, eos_token, unk_token, pad_token, any other "*_token") as variables, the caller's
  // variables_json (a JSON object: tools, documents, anything the template reads) overriding them.
  // A list of named templates gives "tool_use" when tools are given (not null) and it exists, else
  // "default". A GGUF file's tokenizer renders its tokenizer.chat_template with <|endoftext|> as
  // bos_token and eos_token. The ids transformers' tokenize=True gives are
  // encode(text, {.add_special_tokens = false, .allow_special = true}). Each template is compiled
  // once, on first use; any number of threads may call this at once. Throws mhsa::Error when the
  // tokenizer has no chat template, and ChatTemplate's errors.
  std::string apply_chat_template(std::string_view messages_json, bool add_generation_prompt = false,
                                  std::string_view variables_json = "{}") const;
  // The same with transformers' further arguments (ChatTemplateOptions). Throws mhsa::Error for
  // continue_final_message with add_generation_prompt, as transformers does.
  std::string apply_chat_template(std::string_view messages_json, const ChatTemplateOptions& options) const;

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  friend Tokenizer text::gguf_tokenizer(const detail::GgufFile& file, int64_t vocab_size);
  void set_gguf_chat_template(std::string source);  // for a GPT-2 files or bytes tokenizer
  static Tokenizer from_hf(std::unique_ptr<text::HfTokenizer> hf);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mhsa
