// apps/mhsa/speculation_options.h — the speculative-decoding options of generate, chat and serve
// (llama.cpp's names as aliases), and the draft model they may load.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "default_model.h"
#include "mhsa/model.h"

namespace mhsa::cli {

struct SpeculationArgs {
  int64_t draft = -1;         // --draft N (-1: kDefaultDraft when greedy, else 0)
  std::string model_draft;    // --model-draft M: a draft model instead of prompt lookup
  int64_t ngram = 4;          // --lookup-ngram N: prompt lookup's longest n-gram
  bool fixed = false;         // --draft-fixed: always --draft guesses (SpeculationOptions::adaptive off)
};

// Tokens guessed per step when --draft is not given and decoding is greedy: prompt lookup guesses
// only where the text repeats itself, and the adaptive count keeps it from costing elsewhere
// (docs/speculative.md).
constexpr int64_t kDefaultDraft = 6;

void add_speculation_options(CLI::App* cmd, SpeculationArgs& a);

// The options into o.speculation; a draft model is loaded (with `dtype` as the target's) into
// `draft`, which must outlive generation. Throws mhsa::Error naming the option.
void apply_speculation(const SpeculationArgs& a, const std::string& dtype, GenerationOptions& o,
                       std::unique_ptr<LoadedModel>& draft);

}  // namespace mhsa::cli
