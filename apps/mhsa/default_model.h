// apps/mhsa/default_model.h — which model `mhsa generate` and `mhsa explain` run without --model,
// and the model and tokenizer they load, checked to belong together.
#pragma once

#include <filesystem>
#include <string>

#include "mhsa/model.h"
#include "mhsa/tokenizer.h"

namespace mhsa::cli {

// --model when given; else $MHSA_MODEL; else the embedded default model (models/default, a
// byte-level GPT trained by `mhsa train`, see docs/default-model.md): installed beside the
// executable (<prefix>/share/mhsa/models/default) or, for a build tree, in the sources.
// Throws mhsa::Error listing the places tried when none holds a model.
std::filesystem::path model_dir(const std::string& given);

// A model directory's model (any family, mhsa::Model) and its tokenizer (vocab.json + merges.txt, or bytes for a model of
// 256 tokens). Throws mhsa::Error when their vocabularies differ in size: a token the model emits
// would have no text, or a token of the text no embedding, and the run would fail half-way.
struct LoadedModel {
  std::filesystem::path dir;
  Model model;
  Tokenizer tokenizer;
};
// dtype: the --dtype option's value ("f32", "bf16", "f16", "q8_0" or "q4_k"); kv_dtype: --kv-dtype's
// ("f32", "bf16" or "f16"), the model's kv_type(); both checked before anything is read.
LoadedModel load_model(const std::filesystem::path& dir, const std::string& dtype = "f32",
                       const std::string& kv_dtype = "f32");

}  // namespace mhsa::cli
