// model/gpt2_config.cpp — Gpt2Config (see mhsa/gpt2.h): reading and validating a Hugging Face
// config.json. Apart from the model so that the config fuzzer (tests/fuzz/config_fuzz.cpp) builds
// it with nothing else of the library.
#include "mhsa/gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/file.h"
#include "io/json.h"

namespace mhsa {
namespace {

using detail::fail;
using detail::message;
namespace fs = std::filesystem;

int64_t json_count(const nlohmann::json& j, std::string_view fn, const std::string& file, const char* key,
                   int64_t fallback) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback < 0) fail(fn, file, message("a key \"", key, "\""), "none");
    return fallback;
  }
  const auto& v = j[key];
  const std::string arg = message(file, ": ", key);
  const int64_t n = v.is_number_integer() ? detail::json_integer<int64_t>(v, fn, arg) : 0;
  if (n <= 0) fail(fn, arg, "a positive integer", detail::json_excerpt(v));
  return n;
}

}  // namespace

void Gpt2Config::validate(std::string_view fn) const {
  if (vocab_size <= 0 || n_positions <= 0 || n_embd <= 0 || n_layer <= 0 || n_head <= 0 || n_inner < 0)
    fail(fn, "config", "positive vocab_size, n_positions, n_embd, n_layer, n_head",
         message(vocab_size, ", ", n_positions, ", ", n_embd, ", ", n_layer, ", ", n_head));
  if (n_embd % n_head != 0)
    fail(fn, "config.n_head", message("a divisor of n_embd = ", n_embd), std::to_string(n_head));
  if (!(layer_norm_epsilon > 0.0f) || !std::isfinite(layer_norm_epsilon))
    fail(fn, "config.layer_norm_epsilon", "a finite value > 0", std::to_string(layer_norm_epsilon));
  if (vocab_size > INT32_MAX)
    fail(fn, "config.vocab_size", message("at most ", INT32_MAX, " (token ids are int32)"), std::to_string(vocab_size));
  // Every weight's size in one sum (long double: exact to 2^64, no wrap-around): a config whose
  // weights cannot be addressed, or outgrow the machine's memory, fails here, not half-way
  // through allocating them.
  const long double C = static_cast<long double>(n_embd), F = n_inner > 0 ? n_inner : 4.0L * C;
  const long double per_layer = 4 * C + 3 * C * C + 3 * C + C * C + C + C * F + F + F * C + C;
  const long double weights = 4.0L * ((static_cast<long double>(vocab_size) + n_positions) * C + 2 * C +
                                      static_cast<long double>(n_layer) * per_layer);  // bytes, float32
  const long double limit = std::min<long double>(PTRDIFF_MAX, detail::physical_memory_bytes());
  if (weights > limit)
    fail(fn, "config", message("weights that fit in memory (at most ", detail::bytes_string(limit), ")"),
         message(detail::bytes_string(weights), " of weights for vocab_size ", vocab_size, ", n_positions ",
                 n_positions, ", n_embd ", n_embd, ", n_layer ", n_layer));
  if (eos_token_id < -1 || eos_token_id >= vocab_size)
    fail(fn, "config.eos_token_id", message("an id in [0, ", vocab_size, ") or -1 (none)"), std::to_string(eos_token_id));
}

Gpt2Config Gpt2Config::load(const fs::path& config_json) {
  const std::string file = config_json.string();
  if (!fs::exists(config_json)) fail("Gpt2Config::load", file, "a readable config.json", "no such file");
  return parse(detail::read_file(config_json, "Gpt2Config::load", "config_json"), file);
}

Gpt2Config Gpt2Config::parse(std::string_view json_text, const std::string& file) {
  constexpr std::string_view fn = "Gpt2Config::parse";
  nlohmann::json j = detail::parse_json(json_text, fn, file, "a JSON object");
  if (!j.is_object()) fail(fn, file, "a JSON object", detail::json_excerpt(j));
  const auto text = [&](const char* key, const char* fallback) -> std::string {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_string()) fail(fn, message(file, ": ", key), "a string", detail::json_excerpt(j[key]));
    return j[key].get<std::string>();
  };
  const auto flag = [&](const char* key, bool fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean()) fail(fn, message(file, ": ", key), "true or false", detail::json_excerpt(j[key]));
    return j[key].get<bool>();
  };
  if (const std::string type = text("model_type", "gpt2"); type != "gpt2")
    fail(fn, message(file, ": model_type"), "\"gpt2\"", "\"" + detail::printable(type) + "\"");
  if (const std::string act = text("activation_function", "gelu_new");
      act != "gelu_new" && act != "gelu_pytorch_tanh")
    fail(fn, message(file, ": activation_function"), "\"gelu_new\" (GELU, tanh approximation)",
         "\"" + detail::printable(act) + "\"");
  if (!flag("scale_attn_weights", true))
    fail(fn, message(file, ": scale_attn_weights"), "true (scores scaled by 1/sqrt(head_dim))", "false");
  if (flag("scale_attn_by_inverse_layer_idx", false))
    fail(fn, message(file, ": scale_attn_by_inverse_layer_idx"), "false (not supported)", "true");
  Gpt2Config c;
  c.vocab_size = json_count(j, fn, file, "vocab_size", -1);
  c.n_embd = json_count(j, fn, file, "n_embd", -1);
  c.n_layer = json_count(j, fn, file, "n_layer", -1);
  c.n_head = json_count(j, fn, file, "n_head", -1);
  c.n_positions = j.contains("n_positions") ? json_count(j, fn, file, "n_positions", -1) : json_count(j, fn, file, "n_ctx", -1);
  c.n_inner = json_count(j, fn, file, "n_inner", 0);
  if (const auto& v = j["layer_norm_epsilon"]; !v.is_null()) {
    // Checked as a double: converting one beyond float's range to float is undefined.
    if (!v.is_number() || !(v.get<double>() > 0 && v.get<double>() <= std::numeric_limits<float>::max()))
      fail(fn, message(file, ": layer_norm_epsilon"), "a finite number > 0", detail::json_excerpt(v));
    c.layer_norm_epsilon = v.get<float>();
  }
  if (const auto& v = j["eos_token_id"]; !v.is_null())
    c.eos_token_id = detail::json_integer<int32_t>(v, fn, message(file, ": eos_token_id"));
  // Tiny test configs keep GPT-2's 50256 with a smaller vocabulary: no token can end a sequence.
  if (c.eos_token_id >= c.vocab_size || c.eos_token_id < 0) c.eos_token_id = -1;
  c.validate(fn);
  return c;
}

}  // namespace mhsa
