// apps/mhsa/options.cpp — see options.h.
#include "options.h"

#include <omp.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <random>
#include <system_error>

#include "core/cpu.h"
#include "io/json.h"
#include "mhsa/error.h"
#include "mhsa/kv_cache.h"

namespace mhsa::cli {
namespace {

using detail::message;

// "an integer ≥ 1", "an integer in [0, 32]" or "an integer": the range in words. A bound that is
// only the type's limit is left out unless the value went past it.
std::string integer_range(int64_t lo, int64_t hi, bool above_hi) {
  const bool has_lo = lo != std::numeric_limits<int64_t>::min();
  const bool has_hi = hi != std::numeric_limits<int64_t>::max() && (hi != INT32_MAX || above_hi);
  if (has_lo && has_hi) return message("an integer in [", lo, ", ", hi, "]");
  if (has_lo) return message("an integer \u2265 ", lo);
  if (has_hi) return message("an integer \u2264 ", hi);
  return "an integer";
}

std::string number_text(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// What --help shows after the type: "INT:>= 1" for "an integer ≥ 1". ASCII: CLI11 pads the option
// column by bytes, and a 3-byte "≥" there would shift that row's description.
std::string range_only(const std::string& range, std::string_view kind) {
  std::string out = range.size() > kind.size() ? range.substr(kind.size() + 1) : "";
  for (const auto& [from, to] : {std::pair{"\u2265", ">="}, std::pair{"\u2264", "<="}})
    for (size_t at; (at = out.find(from)) != std::string::npos;) out.replace(at, std::string_view(from).size(), to);
  return out;
}

// The whole of `text` as a T in decimal, or nothing.
template <class T>
bool parse(const std::string& text, T& value) {
  const char* end = text.data() + text.size();
  const auto r = std::from_chars(text.data(), end, value);
  return r.ec == std::errc() && r.ptr == end;
}

}  // namespace

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) {
        int64_t v = 0;
        const bool ok = parse(text, v);
        if (ok && v >= lo && v <= hi) {
          text = std::to_string(v);  // CLI11 would read "010" as octal
          return std::string();
        }
        const bool above_hi = !ok || v > hi;
        return message("expected ", integer_range(lo, hi, above_hi), ", got ", text);
      },
      range_only(integer_range(lo, hi, false), "an integer"));
}

CLI::Validator integer_at_least(int64_t lo) { return integer_in(lo, std::numeric_limits<int64_t>::max()); }

CLI::Validator any_integer() {
  return integer_in(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
}

CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& text) {
        uint64_t v = 0;
        if (!parse(text, v)) return message("expected an integer in [0, 2^64), got ", text);
        text = std::to_string(v);
        return std::string();
      },
      "in [0, 2^64)");
}

namespace {

CLI::Validator number_check(double lo, double hi, bool lo_open) {
  std::string range;
  if (hi != INFINITY)
    range = message("a number in ", lo_open ? "(" : "[", number_text(lo), ", ", number_text(hi), "]");
  else
    range = message("a number ", lo_open ? ">" : "\u2265", " ", number_text(lo));
  return CLI::Validator(
      [lo, hi, lo_open, range](std::string& text) {
        double v = 0;
        const bool ok = parse(text, v) && std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi;
        return ok ? std::string() : message("expected ", range, ", got ", text);
      },
      range_only(range, "a number"));
}

}  // namespace

CLI::Validator number_in(double lo, double hi) { return number_check(lo, hi, false); }
CLI::Validator number_at_least(double lo) { return number_check(lo, INFINITY, false); }
CLI::Validator number_above(double lo) { return number_check(lo, INFINITY, true); }

CLI::Validator one_of(std::vector<std::string> words) {
  std::string list;
  for (size_t i = 0; i < words.size(); ++i)
    list += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + words[i];
  return CLI::Validator(
      [words, list](std::string& text) {
        for (const std::string& w : words)
          if (text == w) return std::string();
        return message("expected ", list, ", got '", text, "'");
      },
      list);
}

CLI::Option* add_threads_option(CLI::App* cmd, int& threads) {
  const int most = cpu::max_threads();
  return cmd
      ->add_option("-t,--threads", threads,
                   "threads (0, the default: OMP_NUM_THREADS or all cores)")
      ->check(integer_in(0, most));
}

CLI::Option* add_dtype_option(CLI::App* cmd, std::string& dtype) {
  return cmd
      ->add_option("--dtype", dtype,
                   "weights in memory: f32, bf16 or f16 (16-bit weight matrices: about half the bytes per "
                   "decoded token; f16 keeps an F16 checkpoint exactly, bf16 float32's range), q8_0 (8-bit Q8_0 "
                   "blocks: about a quarter) or q4_k (4-bit Q4_K blocks, the output matrix Q8_0: about an "
                   "eighth); all but f32 are for inference only. Default: the named model's own type "
                   "(the default model's: see docs/default-model.md), else f32");
}

CLI::Option* add_kv_dtype_option(CLI::App* cmd, std::string& kv_dtype) {
  CLI::Option* both =
      cmd->add_option("--kv-dtype", kv_dtype,
                      "KV cache elements: f32, bf16, f16 (16-bit: half the cache's memory and of the bytes a decode "
                      "step reads from it, rounded once as they are cached) or q8_0 (GGUF Q8_0 blocks of 32 along "
                      "the head dimension: 17/64 of f32's bytes; head sizes a multiple of 32); KEY/VALUE "
                      "(q8_0/f16) sets keys and values apart. Attention still computes in float32")
          ->default_val("f32");
  // Keys or values alone (llama.cpp's -ctk / -ctv), over --kv-dtype: CLI11 runs option callbacks in
  // the order the options are added, so --kv-dtype's value is in kv_dtype when these run.
  const auto one_side = [&kv_dtype](bool keys) {
    return [&kv_dtype, keys](const std::string& name) {
      KVTypes t = parse_kv_types(kv_dtype, "--kv-dtype");
      (keys ? t.key : t.value) = parse_kv_type(name, keys ? "--kv-dtype-k" : "--kv-dtype-v");
      kv_dtype = kv_type_name(t);
    };
  };
  cmd->add_option_function<std::string>("--kv-dtype-k", one_side(true),
                                        "the keys' KV cache elements (f32, bf16, f16 or q8_0), over --kv-dtype");
  cmd->add_option_function<std::string>("--kv-dtype-v", one_side(false),
                                        "the values' KV cache elements (f32, bf16, f16 or q8_0), over --kv-dtype");
  return both;
}

void use_threads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
}

void add_sampling_options(CLI::App* cmd, GenerationOptions& g, SamplingArgs& s, int64_t max_new_tokens,
                          const std::string& max_new_tokens_help) {
  cmd->add_option("-n,--max-new-tokens", g.max_new_tokens, max_new_tokens_help)
      ->default_val(max_new_tokens)
      ->check(integer_at_least(0));
  cmd->add_option("--temperature,--temp", g.temperature, "0 is greedy; higher samples more freely")
      ->default_val(0.0f)
      ->check(number_at_least(0));
  cmd->add_option("--top-k", g.top_k, "sample among the k most likely tokens (0: all)")
      ->default_val(0)
      ->check(integer_at_least(0));
  cmd->add_option("--top-p", g.top_p, "sample among the most likely tokens holding this probability")
      ->default_val(1.0f)
      ->check(number_in(0, 1));
  cmd->add_option("--repetition-penalty", g.repetition_penalty, "> 1 discourages repeating tokens")
      ->default_val(1.0f)
      ->check(number_above(0));
  cmd->add_option("--presence-penalty", g.presence_penalty,
                  "subtracted from a token's logit once it has been generated (OpenAI's presence_penalty)")
      ->default_val(0.0f)
      ->check(number_in(-2, 2));
  cmd->add_option("--frequency-penalty", g.frequency_penalty,
                  "subtracted from a token's logit for each time it has been generated (OpenAI's frequency_penalty)")
      ->default_val(0.0f)
      ->check(number_in(-2, 2));
  cmd->add_option("--logit-bias", s.logit_bias,
                  "TOKEN_ID=BIAS added to that token's logit before sampling (repeatable; -100 bans it)");
  s.seed = cmd->add_option("-s,--seed", g.seed,
                           "the sampler's seed (default: a random one when --temperature > 0, reported on stderr "
                           "and in --json)")
               ->check(seed_value());
  cmd->add_option("--stop", s.stop, "stop when this text appears (repeatable); it is not printed");
}

void finish_sampling_options(SamplingArgs& s, GenerationOptions& g) {
  for (const std::string& entry : s.logit_bias) {  // ID=BIAS, the id checked against the model later
    const size_t eq = entry.find('=');
    int32_t id = -1;
    float bias = 0;
    const char* end = entry.data() + entry.size();
    const auto at_id = std::from_chars(entry.data(), entry.data() + std::min(eq, entry.size()), id);
    const auto at_bias = eq == std::string::npos ? at_id : std::from_chars(entry.data() + eq + 1, end, bias);
    if (eq == std::string::npos || eq == 0 || at_id.ec != std::errc() || at_id.ptr != entry.data() + eq ||
        at_bias.ec != std::errc() || at_bias.ptr != end || !std::isfinite(bias))
      throw Error(message("--logit-bias: expected TOKEN_ID=BIAS (an integer id, a finite number), got ",
                          detail::quote(entry)));
    g.logit_bias.emplace_back(id, bias);
  }
  s.seed_drawn = s.seed->count() == 0 && g.temperature > 0;
  if (s.seed_drawn) {
    std::random_device device;
    g.seed = (uint64_t{device()} << 32 | device()) >> 1;  // below 2^63: any JSON reader keeps it exact
  }
}

}  // namespace mhsa::cli
