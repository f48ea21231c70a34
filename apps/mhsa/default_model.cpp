// apps/mhsa/default_model.cpp — see default_model.h.
#include "default_model.h"

#include <cstdlib>
#include <system_error>
#include <vector>

#include "mhsa/error.h"
#include "model/access.h"

#ifndef MHSA_SOURCE_MODELS_DIR
#define MHSA_SOURCE_MODELS_DIR ""
#endif

namespace mhsa::cli {

std::filesystem::path model_dir(const std::string& given) {
  namespace fs = std::filesystem;
  if (!given.empty()) return given;
  if (const char* env = std::getenv("MHSA_MODEL"); env && *env) return env;
  std::error_code ec;
  std::vector<fs::path> tried;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) tried.push_back(exe.parent_path().parent_path() / "share" / "mhsa" / "models" / "default");
  if (*MHSA_SOURCE_MODELS_DIR) tried.push_back(fs::path(MHSA_SOURCE_MODELS_DIR) / "default");
  for (const fs::path& p : tried)
    if (fs::exists(p / "config.json", ec) && fs::exists(p / "model.safetensors", ec)) return p;
  std::string places;
  for (const fs::path& p : tried) places += (places.empty() ? "" : ", ") + p.string();
  throw Error("--model: expected a model directory, or the default model in one of: " + places + ", got none");
}

LoadedModel load_model(const std::filesystem::path& dir, const std::string& dtype, const std::string& kv_dtype) {
  const WeightType weights = parse_weight_type(dtype, "--dtype");
  const KVType kv = parse_kv_type(kv_dtype, "--kv-dtype");
  Model model = Model::load(dir, weights);
  ModelAccess::block_weights(model);  // GPT-2's projections as decode steps read them fastest (same results)
  model.set_kv_type(kv);
  const int64_t n_vocab = model.config().vocab_size;
  Tokenizer tokenizer = Tokenizer::for_model(dir, n_vocab);  // BPE, or bytes
  // The embedding may have more rows than the tokenizer has tokens (Qwen2.5: 151936 for 151665):
  // ids past the tokenizer's decode to no text, as in transformers.
  if (tokenizer.vocab_size() > n_vocab)
    throw Error(detail::message("--model: expected a tokenizer of at most the model's ", n_vocab,
                                " tokens (vocab_size in config.json), got one of ", tokenizer.vocab_size(),
                                " tokens in '", dir.string(), "'"));
  return {dir, std::move(model), std::move(tokenizer)};
}

}  // namespace mhsa::cli
