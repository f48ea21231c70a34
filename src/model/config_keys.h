// model/config_keys.h — what a family's config.json reader is written with: typed access to the
// keys (transformers' defaults for absent ones, errors naming the key), the readers every family
// shares (RoPE, special tokens), and the reader of the rotary families, driven by named rules
// instead of family names. Not public; defined in model_config.cpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/json.h"
#include "mhsa/model_config.h"

namespace mhsa::detail {

inline constexpr std::string_view kParseFn = "ModelConfig::parse";

// s in quotes, as messages show a value from the file (appended: GCC 12 warns falsely of
// overlapping copies in "\"" + ... when inlined).
inline std::string shown(const std::string& s) {
  std::string out = "\"";
  out += printable(s);
  out += '"';
  return out;
}

// Typed access to one JSON object's keys. A key that is absent takes transformers' default; a
// null counts as absent only where transformers gives None a meaning (nullable = true).
class Keys {
 public:
  using json = nlohmann::json;
  Keys(const json& j, std::string_view fn, std::string where) : j_(j), fn_(fn), where_(std::move(where)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  bool present(const char* key) const { return j_.contains(key); }
  const json& at(const char* key) const { return j_[key]; }
  std::string arg(const char* key) const { return message(where_, ": ", key); }
  [[noreturn]] void bad(const char* key, const std::string& expected) const {
    fail(fn_, arg(key), expected, present(key) ? json_excerpt(j_[key]) : "none");
  }

  // An integer >= min (a positive one unless said); `fallback` when absent (or null, if
  // nullable), where a fallback below min means the key is required.
  int64_t count(const char* key, int64_t fallback, bool nullable = false, int64_t min = 1) const {
    const std::string expected = min == 1 ? "a positive integer" : message("an integer >= ", min);
    if (!present(key) || (nullable && j_[key].is_null())) {
      if (fallback < min) bad(key, expected);
      return fallback;
    }
    if (!j_[key].is_number_integer()) bad(key, expected);
    const int64_t n = json_integer<int64_t>(j_[key], fn_, arg(key));
    if (n < min) bad(key, expected);
    return n;
  }
  // A finite number; `fallback` when absent (or null, if nullable).
  double number(const char* key, double fallback, bool nullable = false) const {
    if (!present(key) || (nullable && j_[key].is_null())) return fallback;
    const json& v = j_[key];
    if (!v.is_number() || !std::isfinite(v.get<double>())) bad(key, "a finite number");
    return v.get<double>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_boolean()) bad(key, "true or false");
    return j_[key].get<bool>();
  }
  std::string text(const char* key, const char* fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_string()) bad(key, "a string");
    return j_[key].get<std::string>();
  }
  // Token ids: an integer, a list of at most 1024 of them, or null (none).
  std::vector<int32_t> ids(const char* key) const {
    std::vector<int32_t> out;
    const json& v = j_[key];
    if (v.is_array()) {
      if (v.size() > 1024) bad(key, "at most 1024 ids");
      for (const json& id : v) out.push_back(json_integer<int32_t>(id, fn_, arg(key)));
    } else if (!v.is_null()) {
      out.push_back(json_integer<int32_t>(v, fn_, arg(key)));
    }
    return out;
  }

 private:
  const json& j_;
  std::string_view fn_;
  std::string where_;
};

// The RoPE keys (transformers' rope_parameters standardisation) into c's rope fields.
void read_rope(const Keys& k, ModelConfig& c, int64_t max_positions);
// bos_token_id and eos_token_id, with the config class's defaults (-1 / empty: None).
void read_special_tokens(const Keys& k, ModelConfig& c, int32_t bos, std::vector<int32_t> eos);
// Every check of ModelConfig::validate() that does not look at the per-layer vectors.
void check_scalars(const ModelConfig& c, std::string_view fn);

// How a rotary family's config.json is read (RMSNorm, RoPE, a gated MLP): its config class's
// defaults and the named choices that tell the families apart.
struct RotaryRules {
  static constexpr int64_t kNoPad = std::numeric_limits<int64_t>::min();
  // configuration_<family>.py's defaults (kv_heads or head_dim 0: derived; ids -1: None).
  int64_t vocab, hidden, inter, layers, heads, kv_heads, head_dim, positions;
  bool tie;
  int32_t bos, eos;
  double norm_eps = 1e-6;                 // rms_norm_eps
  int64_t pad = kNoPad;                   // pad_token_id's default (kNoPad: None)
  bool null_kv_heads_is_heads = true;     // a null num_key_value_heads means num_attention_heads
  bool heads_divide_hidden = false;       // hidden_size % num_attention_heads refused even with head_dim
  bool geglu = false;                     // GeGLU read from hidden_activation; else SwiGLU from hidden_act
  bool attention_bias_key = true;         // attention_bias puts biases on q, k, v and o
  bool qkv_bias = false;                  // biases on q, k, v always
  bool mlp_bias_key = false;              // mlp_bias puts biases in the MLP
  // Which layers slide: none; every layer when sliding_window is set (default_window when absent,
  // 0: none); Qwen's use_sliding_window from max_window_layers on; every other layer from the first.
  enum class Windows { none, every_layer, qwen, alternate } windows = Windows::none;
  int64_t default_window = 0;
  bool layer_types = true;                // the layer_types key says which layers slide
  // The family's own keys, read after the shared ones and before the per-layer vectors are sized.
  void (*extra)(const Keys& k, ModelConfig& c) = nullptr;
};
void read_rotary(const Keys& k, ModelConfig& c, const RotaryRules& rules);

}  // namespace mhsa::detail
