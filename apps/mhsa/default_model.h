// apps/mhsa/default_model.h — which model a command runs (--model: a path or a name of
// mhsa/models.h; without it the default model, SmolLM2-135M-Instruct), and the model and
// tokenizer they load, checked to belong together.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "mhsa/error.h"
#include "mhsa/model.h"
#include "mhsa/models.h"
#include "mhsa/tokenizer.h"

namespace mhsa::cli {

// resolve_model(given, "--model"): a path as given; a name ("smollm2", "kjv"); without one
// $MHSA_MODEL, else the default model. Throws mhsa::Error naming scripts/setup.sh and the places
// tried when a named model is not installed, or when its file's checksum differs.
ResolvedModel model_dir(const std::string& given);

// Runs load(), turning the library's "<fn>: dir: ..." about the directory it was given into
// "--model: ...", the option the user typed (fn: "Model::load", "Tokenizer::load_dir").
template <class F>
auto as_model_option(std::string_view fn, F load, std::string_view option = "--model") {
  try {
    return load();
  } catch (const Error& e) {
    const std::string what = e.what(), prefix = std::string(fn) + ": dir: ";
    if (what.starts_with(prefix)) throw Error(std::string(option) + ": " + what.substr(prefix.size()));
    throw;
  }
}
// The --dtype to load with: the one given, else the named model's own, else "f32".
std::string effective_dtype(const ResolvedModel& m, const std::string& dtype);

// A model directory's model (any family, mhsa::Model) and its tokenizer (vocab.json + merges.txt, or bytes for a model of
// 256 tokens). Throws mhsa::Error when their vocabularies differ in size: a token the model emits
// would have no text, or a token of the text no embedding, and the run would fail half-way.
struct LoadedModel {
  std::filesystem::path dir;
  Model model;
  Tokenizer tokenizer;
};
// dtype: the --dtype option's value ("f32", "bf16", "f16", "q8_0" or "q4_k"; "": effective_dtype's
// choice); kv_dtype: --kv-dtype's ("f32", "bf16", "f16", "q8_0" or KEY/VALUE), the model's kv_type(); both checked
// before anything is read.
// option: the option that named the model, for errors ("--model", "--model-draft").
LoadedModel load_model(const ResolvedModel& m, const std::string& dtype = "", const std::string& kv_dtype = "f32",
                       std::string_view option = "--model");

}  // namespace mhsa::cli
