// apps/mhsa/perplexity_cmd.cpp — `mhsa perplexity`: a model's perplexity on a text file, computed
// as llama.cpp's llama-perplexity computes it (mhsa::perplexity, mhsa/evaluate.h), so the two
// numbers compare: the text tokenized once (one trailing newline dropped, BOS first where the model's tokenizer adds one), cut
// into chunks of -c tokens, the second half of each chunk scored. Progress on stderr; the result
// on stdout as one line, or one JSON object with --json.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "default_model.h"
#include "io/file.h"
#include "mhsa/error.h"
#include "mhsa/evaluate.h"
#include "options.h"
#include "output.h"

namespace mhsa::cli {
namespace {

constexpr uint64_t kMaxTextBytes = uint64_t{256} << 20;

struct PerplexityArgs {
  std::string model, dtype, file, kv_dtype;
  int64_t context = 512, chunks = 0;
  bool json = false;
  int threads = 0;
};

// Whether encoding with the tokenizer's special tokens puts BOS first (llama.cpp's add_bos).
bool adds_bos(const Tokenizer& tok) {
  const std::optional<int32_t> bos = tok.bos_id();
  if (!bos) return false;
  const std::vector<int32_t> ids = tok.encode("a", EncodeOptions{true, false});
  return !ids.empty() && ids.front() == *bos;
}

void run(const PerplexityArgs& a) {
  use_threads(a.threads);
  detail::InputFile f(a.file, "mhsa perplexity", "--file");
  if (f.size() > kMaxTextBytes)
    throw Error(detail::message("mhsa perplexity: --file: expected a text of at most ", kMaxTextBytes >> 20,
                                " MiB, got ", f.size(), " bytes"));
  std::string text = f.read_all();
  if (!text.empty() && text.back() == '\n') text.pop_back();  // as llama-perplexity reads -f
  const ResolvedModel resolved = model_dir(a.model);
  const std::string dtype = effective_dtype(resolved, a.dtype);
  const LoadedModel loaded = load_model(resolved, dtype, a.kv_dtype);
  const std::string kv = kv_type_name(loaded.model.kv_type());
  const bool bos = adds_bos(loaded.tokenizer);
  std::vector<int32_t> ids;
  if (bos) ids.push_back(*loaded.tokenizer.bos_id());
  const std::vector<int32_t> body = loaded.tokenizer.encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  if (static_cast<int64_t>(ids.size()) < 2 * a.context)
    throw Error(detail::message("mhsa perplexity: --file: expected a text of at least ", 2 * a.context,
                                " tokens (twice --context), got ", ids.size(), " tokens in '", a.file, "'"));
  PerplexityOptions o;
  o.context = a.context;
  o.max_chunks = a.chunks;
  o.bos = bos ? *loaded.tokenizer.bos_id() : -1;
  const auto start = std::chrono::steady_clock::now();
  std::fprintf(stderr, "mhsa perplexity: %zu tokens, %lld chunks of %lld (%s weights, %s KV%s)\n", ids.size(),
               static_cast<long long>(a.chunks > 0 ? std::min<int64_t>(a.chunks, static_cast<int64_t>(ids.size()) / a.context)
                                                   : static_cast<int64_t>(ids.size()) / a.context),
               static_cast<long long>(a.context), dtype.c_str(), kv.c_str(), bos ? ", BOS first" : "");
  const PerplexityResult r = perplexity(loaded.model, ids, o, [&](int64_t done, int64_t total, double ppl) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "[%lld/%lld] %.4f  (%.1f s, ETA %.0f s)\n", static_cast<long long>(done),
                 static_cast<long long>(total), ppl, s, s / static_cast<double>(done) * static_cast<double>(total - done));
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (a.json) {
    const nlohmann::json j = {{"ppl", r.ppl}, {"ppl_error", r.ppl_error}, {"nll_mean", r.nll_mean},
                              {"chunks", r.chunks}, {"context", r.context}, {"scored_tokens", r.scored_tokens},
                              {"text_tokens", ids.size()}, {"bos", bos}, {"dtype", dtype}, {"kv_dtype", kv},
                              {"running", r.running}, {"seconds", seconds}};
    write_stdout(j.dump() + "\n");
  } else {
    char line[256];
    std::snprintf(line, sizeof line, "PPL = %.4f +/- %.5f (%lld chunks of %lld tokens, %lld scored, %s weights, %s KV)\n",
                  r.ppl, r.ppl_error, static_cast<long long>(r.chunks), static_cast<long long>(r.context),
                  static_cast<long long>(r.scored_tokens), dtype.c_str(), kv.c_str());
    write_stdout(line);
  }
}

}  // namespace

void add_perplexity_command(CLI::App& app) {
  auto a = std::make_shared<PerplexityArgs>();
  CLI::App* cmd = app.add_subcommand("perplexity", "A model's perplexity on a text file, as llama.cpp's llama-perplexity measures it");
  cmd->add_option("-m,--model", a->model, "a model directory, a GGUF file, or a name: smollm2 (the default), kjv");
  cmd->add_option("-f,--file", a->file, "the text file")->required();
  cmd->add_option("-c,--context", a->context, "tokens per chunk; the second half of each is scored")
      ->default_val(512)
      ->check(integer_in(4, 1 << 20));
  cmd->add_option("--chunks", a->chunks, "score at most this many chunks (0: all)")
      ->default_val(0)
      ->check(integer_at_least(0));
  add_dtype_option(cmd, a->dtype);
  add_kv_dtype_option(cmd, a->kv_dtype);
  cmd->add_flag("--json", a->json, "print one JSON object (ppl, ppl_error, nll_mean, chunks, running, ...)");
  add_threads_option(cmd, a->threads);
  cmd->callback([a] { run(*a); });
}

}  // namespace mhsa::cli
