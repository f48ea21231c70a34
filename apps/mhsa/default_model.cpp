// apps/mhsa/default_model.cpp — see default_model.h.
#include "default_model.h"

#include "mhsa/error.h"
#include "model/access.h"

namespace mhsa::cli {

ResolvedModel model_dir(const std::string& given) { return resolve_model(given, "--model"); }

std::string effective_dtype(const ResolvedModel& m, const std::string& dtype) {
  if (!dtype.empty()) return dtype;
  return m.dtype.empty() ? "f32" : m.dtype;
}

LoadedModel load_model(const ResolvedModel& m, const std::string& dtype, const std::string& kv_dtype,
                       std::string_view option) {
  const std::filesystem::path& dir = m.path;
  const WeightType weights = parse_weight_type(effective_dtype(m, dtype), "--dtype");
  const KVTypes kv = parse_kv_types(kv_dtype, "--kv-dtype");
  Model model = as_model_option("Model::load", [&] { return Model::load(dir, weights); }, option);
  ModelAccess::block_weights(model);  // GPT-2's projections as decode steps read them fastest (same results)
  for (const KVType t : {kv.key, kv.value})  // (named here, not at the first cache the command makes)
    if (t == KVType::q8_0 && model.config().head_dim % 32 != 0)
      throw Error(detail::message("--kv-dtype: q8_0 expects a head size that is a multiple of 32 (blocks of 32 "
                                  "values), got a model with head_dim ", model.config().head_dim,
                                  "; use f32, bf16 or f16"));
  model.set_kv_type(kv);
  const int64_t n_vocab = model.config().vocab_size;
  Tokenizer tokenizer = Tokenizer::for_model(dir, n_vocab);  // BPE, or bytes
  // The embedding may have more rows than the tokenizer has tokens (Qwen2.5: 151936 for 151665):
  // ids past the tokenizer's decode to no text, as in transformers.
  if (tokenizer.vocab_size() > n_vocab)
    throw Error(detail::message(option, ": expected a tokenizer of at most the model's ", n_vocab,
                                " tokens (vocab_size in config.json), got one of ", tokenizer.vocab_size(),
                                " tokens in '", dir.string(), "'"));
  return {dir, std::move(model), std::move(tokenizer)};
}

}  // namespace mhsa::cli
