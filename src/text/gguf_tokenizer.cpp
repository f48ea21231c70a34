// text/gguf_tokenizer.cpp — the tokenizer stored in a GGUF file's metadata, where mhsa has the
// same tokenizer: GPT-2's byte-level BPE (tokenizer.ggml.model "gpt2" with pre-tokenizer "gpt-2":
// tokens and merges, read as vocab.json and merges.txt). Other GGUF tokenizers (SentencePiece
// "llama", other pre-tokenizer regexes) are refused by name rather than approximated; a file with
// no vocabulary of a 256-token model is byte-level, as a model directory without files is. The chat
// template (tokenizer.chat_template) comes with it, for `mhsa chat` and `mhsa serve`.
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/gguf.h"
#include "io/json.h"
#include "mhsa/tokenizer.h"

namespace mhsa::text {

Tokenizer gguf_tokenizer(const std::filesystem::path& path, int64_t vocab_size) {
  const detail::GgufFile f = detail::GgufFile::open(path);
  const std::string fn = "gguf " + f.source();
  const std::string model = f.get_string("tokenizer.ggml.model").value_or("none");
  const std::string chat_template = f.get_string("tokenizer.chat_template").value_or("");
  if ((model == "none" || model == "no_vocab") && vocab_size == 256) {  // `mhsa train`'s
    Tokenizer t = Tokenizer::bytes();
    t.set_gguf_chat_template(chat_template);
    return t;
  }
  const std::string pre = f.get_string("tokenizer.ggml.pre").value_or("default");
  if (model != "gpt2" || pre != "gpt-2")
    detail::fail(fn, "metadata 'tokenizer.ggml.model'",
                 "GPT-2's byte-level BPE (\"gpt2\" with tokenizer.ggml.pre \"gpt-2\": the GGUF tokenizer mhsa reads)",
                 detail::message(detail::quote(model), " with pre-tokenizer ", detail::quote(pre)));
  nlohmann::json vocab = nlohmann::json::object();
  const std::vector<std::string_view> tokens = f.get_strings("tokenizer.ggml.tokens");
  for (size_t id = 0; id < tokens.size(); ++id) {
    const std::string token(tokens[id]);
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
