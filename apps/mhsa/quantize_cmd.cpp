// apps/mhsa/quantize_cmd.cpp — `mhsa quantize`: a model directory (llama or gpt2 family) written as
// a GGUF file that llama.cpp loads, its matrices stored as f32, f16, bf16, q8_0 or q4_k (norms, biases
// and learned positions stay F32), with the tokenizer's vocabulary when it is byte-level BPE.
// The work is the library's (model/gguf_model.h); this parses, checks and reports.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "commands.h"
#include "core/check.h"
#include "io/file.h"
#include "io/gguf.h"
#include "mhsa/error.h"
#include "mhsa/model.h"
#include "model/gguf_model.h"
#include "options.h"

namespace mhsa::cli {
namespace {

struct QuantizeArgs {
  std::string model, to, out;
  bool force = false;
  int threads = 0;
};

void run(const QuantizeArgs& a) {
  namespace fs = std::filesystem;
  use_threads(a.threads);
  const detail::GgufType type = detail::parse_gguf_type(a.to, "mhsa quantize: --to");
  std::error_code ec;
  if (!fs::is_directory(a.model, ec))
    throw Error("mhsa quantize: --model: expected a model directory (config.json, model.safetensors), got '" + a.model + "'");
  if (!a.force && fs::exists(fs::symlink_status(a.out, ec)))
    throw Error("mhsa quantize: --out: expected a file that does not exist yet (or --force), got '" + a.out + "' (exists)");
  detail::check_replaceable(a.out, "mhsa quantize", "--out");  // before loading: the writer refuses a device too
  const Model model = Model::load(a.model);
  detail::save_gguf(model, a.out, type, a.force, a.model);
  std::fprintf(stderr, "mhsa quantize: wrote %s (%s, %s)\n", a.out.c_str(), family_name(model.family()),
               detail::gguf_type_name(static_cast<uint32_t>(type)).c_str());
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto a = std::make_shared<QuantizeArgs>();
  CLI::App* cmd = app.add_subcommand("quantize", "Write a model directory (llama or gpt2 family) as a GGUF file for llama.cpp");
  cmd->add_option("-m,--model", a->model, "model directory: config.json, model.safetensors (and its tokenizer)")->required();
  cmd->add_option("--to", a->to, "how the matrices are stored: f32, f16, bf16, q8_0 or q4_k (the output matrix q8_0)")->required();
  cmd->add_option("--out", a->out, "the GGUF file to write")->required();
  cmd->add_flag("--force", a->force, "replace --out if it exists");
  add_threads_option(cmd, a->threads);
  cmd->callback([a] { run(*a); });
}

}  // namespace mhsa::cli
