// model/model_config.cpp — ModelConfig (see mhsa/model_config.h): reading a Hugging Face
// config.json of any supported family and validating it. Each family is read the way
// transformers 5.x reads it (its configuration_*.py defaults, its rope_parameters standardisation,
// its layer_types rules), so that a directory gives the model transformers would build from it;
// a value transformers would read differently from what mhsa can run (another activation, another
// RoPE type, a bidirectional Gemma) is refused naming the key. Apart from the model so that the
// config fuzzer (tests/fuzz/config_fuzz.cpp) builds it with nothing else of the library.
#include "mhsa/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/file.h"
#include "io/json.h"
#include "model/config_keys.h"
#include "model/family.h"

namespace mhsa {
namespace detail {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// "layer_types" (transformers' own list, with its legacy "attention" for "full_attention"), or
// the family's rule when absent: whether each layer attends through a sliding window.
std::vector<bool> sliding_layers(const Keys& k, RotaryRules::Windows rule, int64_t layers, bool qwen_sliding,
                                 int64_t max_window_layers) {
  std::vector<bool> sliding;
  if (k.has("layer_types")) {
    const json& types = k.at("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != layers)
      k.bad("layer_types", message("an array of num_hidden_layers = ", layers, " strings"));
    for (const json& t : types) {
      const std::string s = t.is_string() ? t.get<std::string>() : "";
      if (s != "full_attention" && s != "attention" && s != "sliding_attention")
        fail("ModelConfig::parse", k.arg("layer_types"), "entries \"full_attention\" or \"sliding_attention\"",
             json_excerpt(t));
      sliding.push_back(s == "sliding_attention");
    }
    return sliding;
  }
  for (int64_t i = 0; i < layers; ++i) {
    if (rule == RotaryRules::Windows::alternate) sliding.push_back(i % 2 == 0);  // transformers: (i + 1) % 2 != 0
    else sliding.push_back(qwen_sliding && i >= max_window_layers);
  }
  return sliding;
}

// The end-of-sequence ids in the vocabulary, once each, in order.
void set_eos(ModelConfig& c, const std::vector<int32_t>& eos) {
  c.eos_token_ids.clear();
  for (int32_t id : eos)
    if (id >= 0 && id < c.vocab_size &&
        std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
      c.eos_token_ids.push_back(id);
}

}  // namespace

// transformers' rope_parameters standardisation: "rope_scaling" (the older key) wins over
// "rope_parameters" when it is a non-empty object; "rope_type" (or the older "type") names the
// kind; "rope_theta" inside wins over the top-level key, which wins over 10000.
void read_rope(const Keys& k, ModelConfig& c, int64_t max_positions) {
  constexpr std::string_view fn = "ModelConfig::parse";
  const char* key = "rope_parameters";
  if (k.has("rope_scaling") && !(k.at("rope_scaling").is_object() && k.at("rope_scaling").empty())) key = "rope_scaling";
  c.rope_theta = k.number("rope_theta", 10000.0, true);
  double partial = k.number("partial_rotary_factor", 1.0, true);
  if (k.has(key)) {
    if (!k.at(key).is_object()) k.bad(key, "an object");
    const Keys r(k.at(key), fn, k.arg(key));
    for (const char* nested : {"full_attention", "sliding_attention"})
      if (r.present(nested)) r.bad(nested, "one set of RoPE parameters for every layer (not one per layer type)");
    std::string type = r.has("rope_type") ? r.text("rope_type", "default") : r.text("type", "default");
    c.rope_theta = r.number("rope_theta", c.rope_theta, true);
    partial = r.number("partial_rotary_factor", partial, true);
    const auto factor = [&](const char* name) {
      if (!r.has(name)) r.bad(name, message("a number (required for rope_type \"", type, "\")"));
      return r.number(name, 0);
    };
    if (type == "linear") {
      c.rope_scaling.kind = RopeScalingKind::linear;
      c.rope_scaling.factor = factor("factor");
    } else if (type == "llama3") {
      c.rope_scaling.kind = RopeScalingKind::llama3;
      c.rope_scaling.factor = factor("factor");
      c.rope_scaling.low_freq_factor = factor("low_freq_factor");
      c.rope_scaling.high_freq_factor = factor("high_freq_factor");
      // transformers: a top-level original_max_position_embeddings wins, then the one inside, then
      // max_position_embeddings.
      c.rope_scaling.original_max_position_embeddings =
          k.present("original_max_position_embeddings")
              ? k.count("original_max_position_embeddings", 0)
              : r.count("original_max_position_embeddings", max_positions);
    } else if (type != "default") {
      fail(fn, message(r.arg(r.has("rope_type") ? "rope_type" : "type")),
           "\"default\", \"linear\" or \"llama3\" (other RoPE scalings are not supported)", shown(type));
    }
  }
  // None of these families' modeling code in transformers rotates part of a head: the default
  // RoPE ignores the factor, the scaled ones fail on it. Refused rather than guessed.
  if (partial != 1.0)
    fail(fn, k.arg("partial_rotary_factor"), "1 (whole heads rotated; partial rotary is not supported for this family)",
         message(partial));
}

// bos_token_id (an integer or null) and eos_token_id (an integer, a list of them, or null). Ids
// outside the vocabulary are dropped: no token can be them (tiny test configs keep the real ids).
void read_special_tokens(const Keys& k, ModelConfig& c, int32_t bos, std::vector<int32_t> eos) {
  constexpr std::string_view fn = "ModelConfig::parse";
  const auto in_vocab = [&](int64_t id) { return id >= 0 && id < c.vocab_size; };
  if (k.present("bos_token_id"))
    bos = k.at("bos_token_id").is_null() ? -1 : detail::json_integer<int32_t>(k.at("bos_token_id"), fn, k.arg("bos_token_id"));
  c.bos_token_id = in_vocab(bos) ? bos : -1;
  if (k.present("eos_token_id")) eos = k.ids("eos_token_id");
  set_eos(c, eos);
}

// The rotary families (RMSNorm, RoPE, a gated MLP), as their rules say.
void read_rotary(const Keys& k, ModelConfig& c, const RotaryRules& d) {
  constexpr std::string_view fn = kParseFn;
  c.vocab_size = k.count("vocab_size", d.vocab);
  c.hidden_size = k.count("hidden_size", d.hidden);
  c.intermediate_size = k.count("intermediate_size", d.inter);
  c.num_layers = k.count("num_hidden_layers", d.layers);
  c.num_heads = k.count("num_attention_heads", d.heads);
  if (d.null_kv_heads_is_heads && k.present("num_key_value_heads") && k.at("num_key_value_heads").is_null())
    c.num_kv_heads = c.num_heads;
  else
    c.num_kv_heads = k.count("num_key_value_heads", d.kv_heads > 0 ? d.kv_heads : c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0)
    k.bad("num_key_value_heads", message("a divisor of num_attention_heads = ", c.num_heads));
  // head_dim: declared by some config classes (null is an error there); the others derive it when
  // absent or null (Qwen2 reads a head_dim key the same way although its config does not declare it).
  const bool derived_head_dim = d.head_dim == 0;
  c.head_dim = k.count("head_dim", derived_head_dim ? c.hidden_size / c.num_heads : d.head_dim, derived_head_dim);
  if (c.head_dim <= 0) k.bad("hidden_size", message("at least num_attention_heads = ", c.num_heads, " (head_dim 0)"));
  if (d.heads_divide_hidden && c.hidden_size % c.num_heads != 0)
    k.bad("num_attention_heads", message("a divisor of hidden_size = ", c.hidden_size));
  c.max_positions = k.count("max_position_embeddings", d.positions);
  c.norm = NormKind::rms_norm;
  c.norm_eps = k.number("rms_norm_eps", d.norm_eps);
  c.positions = PositionKind::rotary;
  read_rope(k, c, c.max_positions);
  c.rotary_dim = c.head_dim;
  c.tie_word_embeddings = k.flag("tie_word_embeddings", d.tie);
  read_special_tokens(k, c, d.bos, d.eos >= 0 ? std::vector<int32_t>{d.eos} : std::vector<int32_t>{});
  // These families' embedding is nn.Embedding(padding_idx = pad_token_id): PyTorch's reading of a
  // negative index (from the end), and the error it gives for one outside the vocabulary.
  {
    constexpr int64_t none = RotaryRules::kNoPad;
    int64_t pad = d.pad;  // the config class's default
    if (k.present("pad_token_id"))
      pad = k.has("pad_token_id") ? json_integer<int64_t>(k.at("pad_token_id"), fn, k.arg("pad_token_id")) : none;
    if (pad != none && (pad < -c.vocab_size || pad >= c.vocab_size))
      k.bad("pad_token_id", message("null or an id in [-vocab_size, vocab_size) = [", -c.vocab_size, ", ", c.vocab_size, ")"));
    if (pad != none) c.pad_token_id = static_cast<int32_t>(pad < 0 ? pad + c.vocab_size : pad);
  }

  // The MLP's activation: SiLU (SwiGLU), or GELU with the tanh approximation (GeGLU).
  if (d.geglu) {
    if (const std::string act = k.text("hidden_activation", "gelu_pytorch_tanh"); act != "gelu_pytorch_tanh" && act != "gelu_new")
      fail(fn, k.arg("hidden_activation"), "\"gelu_pytorch_tanh\" (GELU, tanh approximation)", shown(act));
    c.mlp = MlpKind::geglu;
  } else {
    if (const std::string act = k.text("hidden_act", "silu"); act != "silu" && act != "swish")
      fail(fn, k.arg("hidden_act"), "\"silu\"", shown(act));
    c.mlp = MlpKind::swiglu;
  }
  const bool attention_bias = d.attention_bias_key && k.flag("attention_bias", false);
  c.qkv_bias = d.qkv_bias || attention_bias;
  c.o_bias = attention_bias;
  c.mlp_bias = d.mlp_bias_key && k.flag("mlp_bias", false);

  // The window, where the rules read one: sliding_window (null: none), or the rules' default when
  // absent; Qwen's only with use_sliding_window.
  using W = RotaryRules::Windows;
  std::optional<int64_t> window;
  if (d.windows != W::none && (d.windows != W::qwen || k.flag("use_sliding_window", false))) {
    if (k.has("sliding_window"))
      window = k.count("sliding_window", 0);
    else if (!k.present("sliding_window") && d.default_window > 0)
      window = d.default_window;
  }
  c.attention_scale = 0;
  if (d.extra) d.extra(k, c);
  // Per-layer vectors are sized by num_hidden_layers: bound it first (a huge count fails the
  // weight check before any vector of that size exists).
  check_scalars(c, fn);
  if (!d.layer_types) {  // every layer alike (Mistral's transformers warns of layer_types and ignores it)
    c.window_left.assign(static_cast<size_t>(c.num_layers), window ? *window - 1 : -1);
    return;
  }
  const int64_t max_window_layers = d.windows == W::qwen ? k.count("max_window_layers", 28, false, 0) : 0;
  const std::vector<bool> sliding = sliding_layers(k, d.windows, c.num_layers, window.has_value(), max_window_layers);
  c.window_left.clear();
  for (size_t i = 0; i < sliding.size(); ++i) {
    if (sliding[i] && !window)
      fail(fn, k.arg("sliding_window"),
           message("a window for layer ", i, " (a \"sliding_attention\" layer)",
                   d.windows == W::qwen ? " with use_sliding_window true" : ""),
           k.present("sliding_window") ? json_excerpt(k.at("sliding_window")) : "none");
    c.window_left.push_back(sliding[i] ? *window - 1 : -1);
  }
}

// Every check of validate() that does not look at the per-layer vectors: parse() runs it before
// it sizes them from num_layers.
void check_scalars(const ModelConfig& c, std::string_view fn) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", c.vocab_size},       {"hidden_size", c.hidden_size},   {"num_layers", c.num_layers},
      {"num_heads", c.num_heads},         {"num_kv_heads", c.num_kv_heads}, {"head_dim", c.head_dim},
      {"intermediate_size", c.intermediate_size}, {"max_positions", c.max_positions}};
  for (const auto& [name, v] : sizes)
    if (v <= 0) fail(fn, message("config.", name), "a positive size", std::to_string(v));
  if (c.vocab_size > INT32_MAX)
    fail(fn, "config.vocab_size", message("at most ", INT32_MAX, " (token ids are int32)"), std::to_string(c.vocab_size));
  if (c.num_heads % c.num_kv_heads != 0)
    fail(fn, "config.num_kv_heads", message("a divisor of num_heads = ", c.num_heads), std::to_string(c.num_kv_heads));
  if (c.positions == PositionKind::learned && c.head_dim * c.num_heads != c.hidden_size)
    fail(fn, "config.num_heads", message("a divisor of hidden_size = ", c.hidden_size, " (head_dim · num_heads)"),
         message(c.num_heads, " heads of ", c.head_dim));
  if (!std::isfinite(c.norm_eps) || !(c.norm_eps > 0))
    fail(fn, "config.norm_eps", "a finite number > 0", message(c.norm_eps));
  if (c.positions == PositionKind::rotary) {
    if (c.rotary_dim <= 0 || c.rotary_dim > c.head_dim || c.rotary_dim % 2 != 0)
      fail(fn, "config.rotary_dim", message("an even count in [2, head_dim = ", c.head_dim, "]"), std::to_string(c.rotary_dim));
    if (!std::isfinite(c.rope_theta) || !(c.rope_theta > 0))
      fail(fn, "config.rope_theta", "a finite number > 0", message(c.rope_theta));
    const RopeScaling& s = c.rope_scaling;
    if (s.kind != RopeScalingKind::none && !(std::isfinite(s.factor) && s.factor > 0))
      fail(fn, "config.rope_scaling.factor", "a finite number > 0", message(s.factor));
    if (s.kind == RopeScalingKind::llama3) {
      if (!(std::isfinite(s.low_freq_factor) && std::isfinite(s.high_freq_factor) && s.low_freq_factor > 0 &&
            s.high_freq_factor > s.low_freq_factor))
        fail(fn, "config.rope_scaling", "0 < low_freq_factor < high_freq_factor, finite",
             message(s.low_freq_factor, ", ", s.high_freq_factor));
      if (s.original_max_position_embeddings <= 0)
        fail(fn, "config.rope_scaling.original_max_position_embeddings", "a positive integer",
             std::to_string(s.original_max_position_embeddings));
    }
    if (s.kind == RopeScalingKind::factors) {
      if (static_cast<int64_t>(s.factors.size()) != c.rotary_dim / 2)
        fail(fn, "config.rope_scaling.factors", message(c.rotary_dim / 2, " values (rotary_dim / 2)"),
             message(s.factors.size(), " values"));
      for (const float f : s.factors)
        if (!(std::isfinite(f) && f > 0)) fail(fn, "config.rope_scaling.factors", "finite numbers > 0", message(f));
    }
  }
  const std::pair<const char*, float> scales[] = {{"attention_scale", c.attention_scale},
                                                  {"attn_logit_softcap", c.attn_logit_softcap},
                                                  {"final_logit_softcap", c.final_logit_softcap},
                                                  {"norm_weight_offset", c.norm_weight_offset}};
  for (const auto& [name, v] : scales)
    if (!std::isfinite(v) || v < 0) fail(fn, message("config.", name), "a finite number >= 0", message(v));
  if (!std::isfinite(c.embedding_scale) || !(c.embedding_scale > 0))
    fail(fn, "config.embedding_scale", "a finite number > 0", message(c.embedding_scale));
  // Every matrix's element count, then all weights' bytes in one sum (long double: exact to 2^64,
  // no wrap-around): a config whose weights cannot be addressed, or outgrow the machine's
  // memory, fails here, not half-way through allocating them.
  const std::string what = message(fn, ": config");
  const int64_t C = c.hidden_size, F = c.intermediate_size, D = c.head_dim;
  detail::checked_count(what, {c.vocab_size, C}, 4);
  detail::checked_count(what, {c.max_positions, C}, 4);
  detail::checked_count(what, {c.num_heads, D, C}, 4);
  detail::checked_count(what, {c.num_kv_heads, D, C}, 4);
  detail::checked_count(what, {F, C}, 4);
  const long double Cl = C, Fl = F, Q = static_cast<long double>(c.num_heads) * D,
                    KV = static_cast<long double>(c.num_kv_heads) * D;
  const long double norm = c.norm == NormKind::layer_norm ? 2 * Cl : Cl;
  long double layer = ((c.pre_norms ? 2 : 0) + (c.post_norms ? 2 : 0)) * norm + Cl * (Q + 2 * KV) + Q * Cl;
  if (c.qkv_bias) layer += Q + 2 * KV;
  if (c.o_bias) layer += Cl;
  if (c.qk_norm) layer += c.qk_norm_full_width ? Q + KV : 2.0L * D;
  layer += (c.mlp == MlpKind::gelu ? 2 : 3) * Cl * Fl;
  if (c.mlp_bias) layer += (c.mlp == MlpKind::gelu ? 1 : 2) * Fl + Cl;
  long double weights = static_cast<long double>(c.vocab_size) * Cl * (c.tie_word_embeddings ? 1 : 2) + norm +
                        static_cast<long double>(c.num_layers) * layer;
  if (c.positions == PositionKind::learned) weights += static_cast<long double>(c.max_positions) * Cl;
  weights *= 4;  // bytes, float32
  const long double limit = std::min<long double>(PTRDIFF_MAX, detail::physical_memory_bytes());
  if (weights > limit)
    fail(fn, "config", message("weights that fit in memory (at most ", detail::bytes_string(limit), ")"),
         message(detail::bytes_string(weights), " of weights for vocab_size ", c.vocab_size, ", hidden_size ", C,
                 ", intermediate_size ", F, ", num_layers ", c.num_layers, ", heads ", c.num_heads, "/",
                 c.num_kv_heads, " of ", D));
  if (c.bos_token_id < -1 || c.bos_token_id >= c.vocab_size)
    fail(fn, "config.bos_token_id", message("an id in [0, ", c.vocab_size, ") or -1 (none)"), std::to_string(c.bos_token_id));
  for (int32_t id : c.eos_token_ids)
    if (id < 0 || id >= c.vocab_size)
      fail(fn, "config.eos_token_ids", message("ids in [0, ", c.vocab_size, ")"), std::to_string(id));
  if (c.pad_token_id < -1 || c.pad_token_id >= c.vocab_size)
    fail(fn, "config.pad_token_id", message("an id in [0, ", c.vocab_size, ") or -1 (none)"), std::to_string(c.pad_token_id));
}

}  // namespace detail

using detail::fail;
using detail::json_excerpt;
using detail::message;
using json = nlohmann::json;
namespace fs = std::filesystem;

const char* family_name(Family f) {
  for (const detail::FamilyInfo* i : detail::families())
    if (i->family == f) return i->model_type;
  return "unknown";
}

void ModelConfig::validate(std::string_view fn) const {
  detail::check_scalars(*this, fn);
  if (static_cast<int64_t>(window_left.size()) != num_layers)
    fail(fn, "config.window_left", message(num_layers, " entries (one per layer)"), std::to_string(window_left.size()));
  for (size_t i = 0; i < window_left.size(); ++i)
    if (window_left[i] < -1)
      fail(fn, message("config.window_left[", i, "]"), "-1 (unlimited) or a count >= 0", std::to_string(window_left[i]));
}

ModelConfig ModelConfig::load(const fs::path& config_json) {
  const std::string file = config_json.string();
  if (!fs::exists(config_json)) fail("ModelConfig::load", file, "a readable config.json", "no such file");
  return parse(detail::read_file(config_json, "ModelConfig::load", "config_json"), file);
}

void ModelConfig::read_generation_config(std::string_view json_text, const std::string& file) {
  constexpr std::string_view fn = "ModelConfig::read_generation_config";
  const json j = detail::parse_json(json_text, fn, file, "a JSON object");
  if (!j.is_object()) fail(fn, file, "a JSON object", json_excerpt(j));
  const detail::Keys k(j, fn, file);
  if (k.has("eos_token_id")) detail::set_eos(*this, k.ids("eos_token_id"));
}

ModelConfig ModelConfig::parse(std::string_view json_text, const std::string& file) {
  constexpr std::string_view fn = "ModelConfig::parse";
  const json j = detail::parse_json(json_text, fn, file, "a JSON object");
  if (!j.is_object()) fail(fn, file, "a JSON object", json_excerpt(j));
  const detail::Keys k(j, fn, file);
  // The family: model_type, as transformers' AutoConfig reads it (else the architecture's).
  std::string architecture;
  if (k.has("architectures")) {
    const json& a = k.at("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string()) k.bad("architectures", "an array of class names");
    architecture = a[0].get<std::string>();
  }
  const detail::FamilyInfo* info = nullptr;
  if (k.has("model_type")) {
    const std::string type = k.text("model_type", "");
    info = detail::family_by_type(type);
    if (!info) fail(fn, k.arg("model_type"), detail::family_list(), detail::shown(type));
  } else {
    info = detail::family_by_architecture(architecture);
    if (!info)
      fail(fn, k.arg("model_type"), detail::family_list(),
           architecture.empty() ? "none" : "none (architectures " + detail::shown(architecture) + ")");
  }
  // Another head on the same body (…ForSequenceClassification) is another model.
  if (!architecture.empty() && architecture != info->architecture)
    fail(fn, message(file, ": architectures[0]"), message("\"", info->architecture, "\" (model_type \"", info->model_type, "\")"),
         detail::shown(architecture));
  ModelConfig c;
  c.family = info->family;
  c.architecture = info->architecture;
  info->block.apply(c);
  info->read_config(k, c);
  c.validate(fn);
  return c;
}

}  // namespace mhsa
