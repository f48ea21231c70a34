// apps/mhsa/generate_cmd.cpp — `mhsa generate`: continue a prompt with a model directory (any family),
// streaming the text to stdout as it is made (or one JSON object at the end with --json). On a
// terminal the prompt is printed first, so that the text reads from its start (--no-echo: only
// the continuation); into a pipe or file only the continuation is (--echo: the prompt too).
//
// Streaming holds back only what could still change: the tail of an unfinished UTF-8 character
// and any tail that may be the start of a --stop string. A stop string ends generation and is
// not printed; neither is the end-of-text token.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/check.h"
#include "default_model.h"
#include "io/json.h"
#include "mhsa/error.h"
#include "mhsa/model.h"
#include "mhsa/tokenizer.h"
#include "options.h"
#include "output.h"
#include "constraint_options.h"
#include "speculation_options.h"
#include "text/text_stream.h"

namespace mhsa::cli {
namespace {

struct GenerateArgs {
  std::string model, dtype, kv_dtype;
  std::string prompt;
  GenerationOptions options;
  std::vector<std::string> stop;
  std::vector<std::string> logit_bias;  // ID=BIAS
  bool json = false;
  bool ignore_eos = false;
  bool echo = false, echo_given = false;  // --echo / --no-echo; default: whether stdout is a terminal
  bool verbose = false;
  SpeculationArgs speculation;
  ConstraintArgs constraint;
  int threads = 0;
};

void run(const GenerateArgs& a) {
  use_threads(a.threads);
  const LoadedModel loaded = load_model(model_dir(a.model), a.dtype, a.kv_dtype);
  const Model& model = loaded.model;
  GenerationOptions o = a.options;
  o.stop_at_eos = !a.ignore_eos;
  std::unique_ptr<LoadedModel> draft;
  apply_speculation(a.speculation, effective_dtype(model_dir(a.model), a.dtype), o, draft);
  for (const std::string& entry : a.logit_bias) {  // ID=BIAS, the id checked against the model by generate()
    const size_t eq = entry.find('=');
    int32_t id = -1;
    float bias = 0;
    const char* end = entry.data() + entry.size();
    const auto at_id = std::from_chars(entry.data(), entry.data() + std::min(eq, entry.size()), id);
    const auto at_bias = eq == std::string::npos ? at_id : std::from_chars(entry.data() + eq + 1, end, bias);
    if (eq == std::string::npos || eq == 0 || at_id.ec != std::errc() || at_id.ptr != entry.data() + eq ||
        at_bias.ec != std::errc() || at_bias.ptr != end || !std::isfinite(bias))
      throw Error(detail::message("--logit-bias: expected TOKEN_ID=BIAS (an integer id, a finite number), got ",
                                  detail::quote(entry)));
    o.logit_bias.emplace_back(id, bias);
  }
  const Tokenizer& tok = loaded.tokenizer;
  o.constraint = load_constraint(a.constraint, tok, model.config().vocab_size, model.config().eos_token_ids, "mhsa generate");
  const bool bytes = tok.eos_id() < 0 && tok.vocab_size() == 256;
  std::string prompt = a.prompt;
  if (prompt == "-") prompt.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  // As transformers' tokenizer(prompt) for tokenizer.json (BOS added, special tokens' text matched);
  // GPT-2's files as tiktoken's encode_ordinary.
  std::vector<int32_t> ids = tok.encode(prompt, EncodeOptions{tok.is_tokenizer_json(), tok.is_tokenizer_json()});
  const std::vector<int32_t>& eos_ids = model.config().eos_token_ids;
  const int32_t eos = eos_ids.empty() ? -1 : eos_ids[0];
  if (ids.empty()) {  // unconditional generation starts from end-of-text (GPT-2) or a newline (bytes)
    if (eos < 0 && !bytes)
      throw Error("mhsa generate: --prompt: expected some text (this model has no end-of-text token), got none");
    ids.push_back(bytes ? int32_t{'\n'} : eos);
  }
  const int64_t context = model.config().max_positions, room = a.options.max_new_tokens > 0 ? 1 : 0;
  if (static_cast<int64_t>(ids.size()) + room > context)  // else Model::generate would blame max_new_tokens
    throw Error(detail::message("mhsa generate: --prompt: expected at most ", context - room,
                                " tokens (the model's context is ", context, " tokens", room ? ", less one for a new token" : "",
                                "), got ", ids.size(), " tokens"));
  if (!a.json && (a.echo_given ? a.echo : isatty(fileno(stdout)) == 1)) {
    write_stdout(prompt);
    flush_stdout();
  }
  text::TextStream stream(a.stop);
  std::vector<int32_t> tokens;
  GenerationStats stats;
  model.generate(
      ids, 1, static_cast<int64_t>(ids.size()), o,
      [&](int64_t, std::span<const int32_t> step) {
        tokens.push_back(step[0]);
        if (!a.ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), step[0]) != eos_ids.end()) return false;
        // An id past the tokenizer's (a padded embedding's row) has no text, as in transformers' decode.
        const bool stop = stream.add(step[0] < tok.vocab_size() ? tok.token_bytes(step[0]) : std::string());
        if (!a.json) {
          write_stdout(stream.take(stop));
          flush_stdout();  // stops generating when the text cannot be written
        }
        return !stop;
      },
      &stats);
  const double prefill = stats.prefill_seconds > 0 ? stats.prefill_tokens / stats.prefill_seconds : 0.0;
  const double decode = stats.decode_seconds > 0 ? stats.decode_tokens / stats.decode_seconds : 0.0;
  if (a.json) {
    nlohmann::json j;
    j["prompt_tokens"] = ids.size();
    j["prompt_ids"] = ids;
    j["tokens"] = tokens;
    j["text"] = stream.text();  // invalid UTF-8 (a cut character) is written as U+FFFD
    j["prefill_tokens_per_s"] = prefill;
    j["decode_tokens_per_s"] = decode;
    j["speculation"] = {{"draft_tokens", o.speculation.draft_tokens},
                        {"drafter", o.speculation.draft_tokens == 0 ? "none" : draft ? "model" : "lookup"},
                        {"forwards", stats.speculation.forwards},
                        {"drafted", stats.speculation.drafted},
                        {"accepted", stats.speculation.accepted}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  write_stdout(stream.take(true) + "\n");
  flush_stdout();  // the text first, then the summary, when both go to one terminal or file
  std::fprintf(stderr, "mhsa generate: %zu prompt tokens at %.1f tokens/s, %zu generated at %.1f tokens/s (%d threads)\n",
               ids.size(), prefill, tokens.size(), decode, omp_get_max_threads());
  if (a.verbose && o.speculation.draft_tokens > 0) {
    const SpeculationStats& sp = stats.speculation;
    std::fprintf(stderr,
                 "mhsa generate: speculation (%s, up to %lld a step): %lld of %lld guesses kept (%.0f%%), %.2f tokens "
                 "per forward\n",
                 draft ? "draft model" : "prompt lookup", static_cast<long long>(o.speculation.draft_tokens),
                 static_cast<long long>(sp.accepted), static_cast<long long>(sp.drafted),
                 sp.drafted ? 100.0 * static_cast<double>(sp.accepted) / static_cast<double>(sp.drafted) : 0.0,
                 sp.forwards ? static_cast<double>(stats.decode_tokens) / static_cast<double>(sp.forwards) : 0.0);
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Continue a prompt with a model directory (Hugging Face layout: GPT-2, Llama, Qwen, Mistral, Gemma 2)");
  cmd->add_option("--model", a->model,
                  "model directory: config.json, model.safetensors (+ vocab.json, merges.txt for GPT-2's tokens); "
                  "default: the embedded byte-level model");
  add_dtype_option(cmd, a->dtype);
  add_kv_dtype_option(cmd, a->kv_dtype);
  cmd->add_option("--prompt", a->prompt, "the text to continue ('-' reads stdin; empty starts from end-of-text)");
  cmd->add_option("-n,--max-new-tokens", a->options.max_new_tokens, "tokens to generate at most")
      ->default_val(64)
      ->check(integer_at_least(0));
  cmd->add_option("--temperature", a->options.temperature, "0 is greedy; higher samples more freely")
      ->default_val(0.0f)
      ->check(number_at_least(0));
  cmd->add_option("--top-k", a->options.top_k, "sample among the k most likely tokens (0: all)")
      ->default_val(0)
      ->check(integer_at_least(0));
  cmd->add_option("--top-p", a->options.top_p, "sample among the most likely tokens holding this probability")
      ->default_val(1.0f)
      ->check(number_in(0, 1));
  cmd->add_option("--repetition-penalty", a->options.repetition_penalty, "> 1 discourages repeating tokens")
      ->default_val(1.0f)
      ->check(number_above(0));
  cmd->add_option("--presence-penalty", a->options.presence_penalty,
                  "subtracted from a token's logit once it has been generated (OpenAI's presence_penalty)")
      ->default_val(0.0f)
      ->check(number_in(-2, 2));
  cmd->add_option("--frequency-penalty", a->options.frequency_penalty,
                  "subtracted from a token's logit for each time it has been generated (OpenAI's frequency_penalty)")
      ->default_val(0.0f)
      ->check(number_in(-2, 2));
  cmd->add_option("--logit-bias", a->logit_bias,
                  "TOKEN_ID=BIAS added to that token's logit before sampling (repeatable; -100 bans it)");
  cmd->add_option("--seed", a->options.seed, "the sampler's seed")->default_val(0)->check(seed_value());
  cmd->add_option("--stop", a->stop, "stop when this text appears (repeatable); it is not printed");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "keep generating after the end-of-text token");
  CLI::Option* echo = cmd->add_flag("--echo,!--no-echo", a->echo,
                                    "print the prompt before its continuation (default: when stdout is a terminal)");
  cmd->add_flag("--json", a->json,
                "print one JSON object: prompt_tokens, prompt_ids, tokens, text, prefill/decode tokens per second");
  add_speculation_options(cmd, a->speculation);
  add_constraint_options(cmd, a->constraint);
  cmd->add_flag("-v,--verbose", a->verbose, "also report speculative decoding's guesses kept and tokens per forward");
  add_threads_option(cmd, a->threads);
  cmd->callback([a, echo] {
    a->echo_given = echo->count() > 0;
    run(*a);
  });
}

}  // namespace mhsa::cli
