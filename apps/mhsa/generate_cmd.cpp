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
  SamplingArgs sampling;  // --stop, --logit-bias, --seed
  bool json = false;
  bool ignore_eos = false;
  bool echo = false, echo_given = false;  // --echo / --no-echo; default: whether stdout is a terminal
  bool verbose = false;
  SpeculationArgs speculation;
  ConstraintArgs constraint;
  int threads = 0;
};

void run(GenerateArgs& a) {
  use_threads(a.threads);
  finish_sampling_options(a.sampling, a.options);
  const LoadedModel loaded = load_model(model_dir(a.model), a.dtype, a.kv_dtype);
  const Model& model = loaded.model;
  GenerationOptions o = a.options;
  o.stop_at_eos = !a.ignore_eos;
  std::unique_ptr<LoadedModel> draft;
  apply_speculation(a.speculation, effective_dtype(model_dir(a.model), a.dtype), o, draft);
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
  // -n past the context generates up to it (a notice says so), as llama.cpp's -n does.
  const int64_t asked = o.max_new_tokens, fits = context - static_cast<int64_t>(ids.size());
  o.max_new_tokens = std::min(asked, fits);
  if (a.sampling.seed_drawn && !a.json)
    std::fprintf(stderr, "mhsa generate: seed %llu (-s %llu repeats this run)\n",
                 static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(o.seed));
  if (!a.json && (a.echo_given ? a.echo : isatty(fileno(stdout)) == 1)) {
    write_stdout(prompt);
    flush_stdout();
  }
  text::TextStream stream(a.sampling.stop);
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
    j["seed"] = o.seed;
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
  if (asked > fits && static_cast<int64_t>(tokens.size()) == fits)
    std::fprintf(stderr, "mhsa generate: stopped at the model's context of %lld tokens (%zu prompt + %lld new; "
                 "-n asked for %lld)\n", static_cast<long long>(context), ids.size(), static_cast<long long>(fits),
                 static_cast<long long>(asked));
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
  cmd->add_option("-m,--model", a->model,
                  "a model directory (config.json, model.safetensors; + vocab.json, merges.txt for GPT-2's tokens), "
                  "a GGUF file, or a name: smollm2 (the default), kjv");
  add_dtype_option(cmd, a->dtype);
  add_kv_dtype_option(cmd, a->kv_dtype);
  cmd->add_option("-p,--prompt", a->prompt, "the text to continue ('-' reads stdin; empty starts from end-of-text)");
  add_sampling_options(cmd, a->options, a->sampling, 64, "tokens to generate at most (stopping at the model's context)");
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
