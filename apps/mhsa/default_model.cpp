// apps/mhsa/default_model.cpp — see default_model.h.
#include "default_model.h"

#include <cstdlib>
#include <system_error>
#include <vector>

#include "mhsa/error.h"

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

}  // namespace mhsa::cli
