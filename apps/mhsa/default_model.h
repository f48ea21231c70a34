// apps/mhsa/default_model.h — which model `mhsa generate` and `mhsa explain` run without --model.
#pragma once

#include <filesystem>
#include <string>

namespace mhsa::cli {

// --model when given; else $MHSA_MODEL; else the embedded default model (models/default, a
// byte-level GPT trained by `mhsa train`, see docs/default-model.md): installed beside the
// executable (<prefix>/share/mhsa/models/default) or, for a build tree, in the sources.
// Throws mhsa::Error listing the places tried when none holds a model.
std::filesystem::path model_dir(const std::string& given);

}  // namespace mhsa::cli
