// apps/mhsa/tokenize_cmd.cpp — `mhsa tokenize`: the token ids of a text, or with --decode the
// text of token ids, using the tokenizer files of a model directory (tokenizer.json, encoded as
// transformers' tokenizer(text) encodes it, BOS included unless --no-special-tokens; or GPT-2's
// vocab.json + merges.txt / encoder.json + vocab.bpe; or a GGUF file's tokenizer, encoded as llama.cpp
// encodes it, BOS as its metadata says; or, for a model directory with neither, as a byte-level
// model of 256 tokens is read: its bytes). Without --model, the model `mhsa generate` runs (the
// embedded default model). TEXT "-" reads standard input. A quick look at how text splits; not a
// batch tool: one text per call.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "default_model.h"
#include "mhsa/error.h"
#include "mhsa/model_config.h"
#include "mhsa/tokenizer.h"
#include "options.h"

namespace mhsa::cli {
namespace {

struct TokenizeArgs {
  std::string model, text;
  bool json = false, decode = false, allow_special = false, no_special_tokens = false;
  int threads = 0;  // taken as every command takes it; tokenizing runs on one
};

std::string read_stdin() {
  std::cin >> std::noskipws;
  return {std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
}

// The ids of --decode: integers separated by spaces, newlines or commas (so the output of
// `mhsa tokenize`, or a JSON list, can be pasted back).
std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (true) {
    pos = text.find_first_not_of(" \t\r\n,[]", pos);
    if (pos == std::string::npos) return ids;
    const size_t end = std::min(text.find_first_of(" \t\r\n,[]", pos), text.size());
    const std::string item = text.substr(pos, end - pos);
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || id < 0 || id > INT32_MAX)
      throw Error(detail::message("TEXT: expected token ids separated by spaces or commas, got '",
                                  item.substr(0, 40), "'"));
    ids.push_back(static_cast<int32_t>(id));
    pos = end;
  }
}

// A JSON string literal of valid UTF-8 (what token_string gives).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// The tokenizer generate would use with the model at dir: its files, a GGUF file's metadata, or
// bytes for a byte-level model's directory (config.json of 256 tokens, no tokenizer files).
Tokenizer model_tokenizer(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool files = fs::exists(dir / "tokenizer.json", ec) || fs::exists(dir / "vocab.json", ec) ||
                     fs::exists(dir / "encoder.json", ec);
  if (fs::is_directory(dir, ec) && !files && fs::exists(dir / "config.json", ec))
    return Tokenizer::for_model(dir, ModelConfig::load(dir / "config.json").vocab_size);
  return Tokenizer::load_dir(dir);
}

void run(const TokenizeArgs& a) {
  const Tokenizer tok = as_model_option("Tokenizer::load_dir", [&] { return model_tokenizer(model_dir(a.model).path); });
  const std::string text = a.text == "-" ? read_stdin() : a.text;
  if (a.decode) {
    const std::vector<int32_t> ids = parse_ids(text);
    for (const int32_t id : ids)
      if (id >= tok.vocab_size())
        throw Error(detail::message("TEXT: expected token ids below the vocabulary's size of ", tok.vocab_size(),
                                    ", got ", id));
    const std::string bytes = tok.decode(ids);
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    if (isatty(fileno(stdout))) std::fputc('\n', stdout);  // exact bytes into a pipe or file
    return;
  }
  const bool hf = tok.is_tokenizer_json();
  const std::vector<int32_t> ids =
      tok.encode(text, EncodeOptions{hf && !a.no_special_tokens, a.allow_special || hf});
  std::string out;
  if (a.json) {
    out = "{\"ids\": [";
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
    out += "], \"tokens\": [";
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + json_string(tok.token_string(ids[i]));
    out += "]}";
  } else {
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
  }
  std::printf("%s\n", out.c_str());
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "token ids of a text (or, with --decode, the text of ids)");
  cmd->add_option("-m,--model", args->model,
                  "directory with tokenizer.json, or vocab.json + merges.txt (or encoder.json + vocab.bpe), or a "
                  "byte-level model's; or a .gguf file (default: the embedded byte-level model)");
  cmd->add_option("TEXT", args->text, "the text, or token ids with --decode; '-' reads standard input")->required();
  CLI::Option* json = cmd->add_flag(
      "--json", args->json, "print {\"ids\": [...], \"tokens\": [...]}, tokens as vocab.json spells them (\"Ġworld\")");
  cmd->add_flag("--decode", args->decode, "TEXT is token ids; print the bytes they stand for")->excludes(json);
  cmd->add_flag("--allow-special", args->allow_special,
                "GPT-2's files: encode the text <|endoftext|> as its special id (tokenizer.json always does)");
  cmd->add_flag("--no-special-tokens", args->no_special_tokens,
                "tokenizer.json: add no BOS (nor any post-processor token), as add_special_tokens=False");
  add_threads_option(cmd, args->threads);
  cmd->callback([args] { run(*args); });
}

}  // namespace mhsa::cli
