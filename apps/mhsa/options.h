// apps/mhsa/options.h — the checks every subcommand's options share, with messages that read like
// the library's ("--tokens: expected an integer ≥ 1, got 0"), and the -t/--threads option.
//
// CLI11's own range checks print their bounds with %f (a 309-digit "0 to 1.79e308") and fail
// with exit statuses 105–109; these validators say what was expected in words, and main.cpp turns
// every CLI11 parse error into "mhsa: error: <message>" and exit status 2. Not a general
// validation library: integers and finite numbers in a range, a word from a list, nothing else.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "mhsa/model.h"

namespace mhsa::cli {

// An integer in [lo, hi] that fits T, written in decimal: "expected an integer ≥ 1, got 0".
// Leading zeros are decimal ("010" is 10, not CLI11's octal 8).
CLI::Validator integer_in(int64_t lo, int64_t hi);
CLI::Validator integer_at_least(int64_t lo);  // [lo, INT64_MAX]
CLI::Validator any_integer();                 // an int64_t (its range checked later)
CLI::Validator seed_value();                  // [0, UINT64_MAX]: a uint64_t, never a wrapped -1

// A finite number in [lo, hi] ("expected a number in [0, 1], got 1.5"); above(lo) is (lo, +∞).
CLI::Validator number_in(double lo, double hi);
CLI::Validator number_at_least(double lo);
CLI::Validator number_above(double lo);

// One of `words`: "expected html or text, got 'pdf'".
CLI::Validator one_of(std::vector<std::string> words);

// -t,--threads N: 0 (the default: OMP_NUM_THREADS or all cores) up to cpu::max_threads().
CLI::Option* add_threads_option(CLI::App* cmd, int& threads);
// --dtype f32|bf16|f16|q8_0|q4_k: how the model keeps its weights (mhsa::WeightType, checked when the model loads).
CLI::Option* add_dtype_option(CLI::App* cmd, std::string& dtype);
// --kv-dtype f32|bf16|f16|q8_0 (or KEY/VALUE), --kv-dtype-k and --kv-dtype-v: the KV cache's element
// types (mhsa::KVTypes), left in kv_dtype as parse_kv_types reads it ("q8_0", "q8_0/f16"), checked
// before the model loads.
CLI::Option* add_kv_dtype_option(CLI::App* cmd, std::string& kv_dtype);
// Applies a -t value (0 leaves OpenMP's choice as it is).
void use_threads(int threads);

// The sampling and stop options generate and chat share, registered by one function so that the
// two take the same spellings: -n/--max-new-tokens, --temp/--temperature, --top-k, --top-p, the
// three penalties, --logit-bias, -s/--seed and --stop.
struct SamplingArgs {
  std::vector<std::string> stop;
  std::vector<std::string> logit_bias;  // ID=BIAS, parsed by finish_sampling_options
  CLI::Option* seed = nullptr;
  bool seed_drawn = false;  // no --seed and a temperature above 0: a random seed, reported
};
void add_sampling_options(CLI::App* cmd, GenerationOptions& g, SamplingArgs& s, int64_t max_new_tokens,
                          const std::string& max_new_tokens_help);
// After parsing: --logit-bias into g.logit_bias, and a random g.seed when sampling without --seed
// (as llama.cpp does; the seed is reported so that -s repeats the run). Greedy runs keep seed 0.
void finish_sampling_options(SamplingArgs& s, GenerationOptions& g);

}  // namespace mhsa::cli
