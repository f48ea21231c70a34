// tests/cpp/test_model_config.cpp — ModelConfig::parse against transformers' reading of
// config.json for each family: random shapes (odd sizes, grouped heads) written the way
// save_pretrained writes them and the way older hub files do (rope_scaling, rope_theta at the top),
// transformers' defaults for absent keys, each family's window, bias, norm and soft-cap rules,
// and a short mhsa::Error naming the key for every value that would make another model.
#include <cmath>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "mhsa/model_config.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

using json = nlohmann::json;

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected mhsa::Error, nothing was thrown";
  return "";
}

ModelConfig parse(const json& j) { return ModelConfig::parse(j.dump(), "cfg.json"); }

// The error parsing `j` gives: short, naming the file and `key`, saying `expected`.
void expect_refused(const json& j, const std::string& key, const std::string& expected) {
  const std::string msg = error_of([&] { parse(j); });
  EXPECT_LT(msg.size(), 400u) << msg;
  EXPECT_NE(msg.find("ModelConfig::parse"), std::string::npos) << msg;
  EXPECT_NE(msg.find(key), std::string::npos) << "key " << key << ": " << msg;
  EXPECT_NE(msg.find(expected), std::string::npos) << "expected " << expected << ": " << msg;
}

// A random small shape: heads, a divisor of them for key/value heads, an odd hidden size where
// the family allows one.
struct Shape {
  int64_t heads, kv_heads, head_dim, hidden, inter, layers, vocab;
};
Shape random_shape(std::mt19937_64& gen) {
  std::uniform_int_distribution<int64_t> pick(1, 7);
  Shape s;
  s.kv_heads = pick(gen);
  s.heads = s.kv_heads * pick(gen);
  s.head_dim = 2 * pick(gen);
  s.hidden = s.heads * s.head_dim;
  s.inter = 3 + 2 * pick(gen) * pick(gen);
  s.layers = pick(gen);
  s.vocab = 50 + pick(gen) * 37;
  return s;
}

json base(const std::string& type, const Shape& s) {
  return {{"model_type", type},
          {"vocab_size", s.vocab},
          {"hidden_size", s.hidden},
          {"intermediate_size", s.inter},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.heads},
          {"num_key_value_heads", s.kv_heads}};
}

void expect_shape(const ModelConfig& c, const Shape& s) {
  EXPECT_EQ(c.vocab_size, s.vocab);
  EXPECT_EQ(c.hidden_size, s.hidden);
  EXPECT_EQ(c.intermediate_size, s.inter);
  EXPECT_EQ(c.num_layers, s.layers);
  EXPECT_EQ(c.num_heads, s.heads);
  EXPECT_EQ(c.num_kv_heads, s.kv_heads);
  EXPECT_EQ(c.head_dim, s.head_dim);
  EXPECT_EQ(c.rotary_dim, s.head_dim);
  EXPECT_EQ(c.window_left.size(), static_cast<size_t>(s.layers));
}

TEST(ModelConfig, LlamaAsSavePretrainedWritesIt) {
  auto gen = test_rng();
  const Shape s = random_shape(gen);
  const bool tie = gen() % 2, attention_bias = gen() % 2, mlp_bias = gen() % 2;
  json j = base("llama", s);
  j["architectures"] = {"LlamaForCausalLM"};
  j["head_dim"] = s.head_dim;
  j["max_position_embeddings"] = 77;
  j["rms_norm_eps"] = 1e-5;
  j["tie_word_embeddings"] = tie;
  j["attention_bias"] = attention_bias;
  j["mlp_bias"] = mlp_bias;
  j["bos_token_id"] = 1;
  j["eos_token_id"] = json::array({2, 3, 2, 100000});  // a repeat and one outside the vocabulary
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 32.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 8192}};
  const ModelConfig c = parse(j);
  expect_shape(c, s);
  EXPECT_EQ(c.family, Family::llama);
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_STREQ(family_name(c.family), "llama");
  EXPECT_EQ(c.max_positions, 77);
  EXPECT_EQ(c.norm, NormKind::rms_norm);
  EXPECT_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.norm_weight_offset, 0.0f);
  EXPECT_EQ(c.positions, PositionKind::rotary);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::llama3);
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c.mlp, MlpKind::swiglu);
  EXPECT_EQ(c.qkv_bias, attention_bias);
  EXPECT_EQ(c.o_bias, attention_bias);
  EXPECT_EQ(c.mlp_bias, mlp_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.post_norms);
  EXPECT_EQ(c.tie_word_embeddings, tie);
  EXPECT_EQ(c.embedding_scale, 1.0f);
  EXPECT_EQ(c.attention_scale, 0.0f);
  EXPECT_EQ(c.attn_logit_softcap, 0.0f);
  EXPECT_EQ(c.final_logit_softcap, 0.0f);
  for (int64_t w : c.window_left) EXPECT_EQ(w, -1);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{2, 3}));
}

TEST(ModelConfig, LlamaDefaultsAreTransformers) {
  const json j = {{"model_type", "llama"}, {"hidden_size", 12}, {"num_attention_heads", 3}, {"vocab_size", 10},
                  {"intermediate_size", 5}, {"num_hidden_layers", 2}, {"num_key_value_heads", nullptr}};
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.num_kv_heads, 3);  // None: as many as query heads
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.max_positions, 2048);
  EXPECT_EQ(c.norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::none);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{2}));
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  // Without model_type, the architecture names the family.
  json k = j;
  k.erase("model_type");
  k["architectures"] = {"LlamaForCausalLM"};
  EXPECT_EQ(parse(k).family, Family::llama);
}

TEST(ModelConfig, OlderRopeKeys) {
  auto gen = test_rng();
  const Shape s = random_shape(gen);
  const double factor = 1.5 + static_cast<double>(gen() % 7);
  json j = base("llama", s);
  j["rope_theta"] = 123456.0;  // top level, as transformers 4 wrote it
  j["rope_scaling"] = {{"type", "linear"}, {"factor", factor}};
  ModelConfig c = parse(j);
  EXPECT_EQ(c.rope_theta, 123456.0);
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::linear);
  EXPECT_EQ(c.rope_scaling.factor, factor);
  // rope_scaling wins over rope_parameters; a rope_theta inside wins over the top-level one.
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 99.0}};
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8}, {"low_freq_factor", 1},
                       {"high_freq_factor", 4}, {"rope_theta", 7.0}};
  j["max_position_embeddings"] = 333;
  c = parse(j);
  EXPECT_EQ(c.rope_scaling.kind, RopeScalingKind::llama3);
  EXPECT_EQ(c.rope_theta, 7.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 333);  // defaults to max_position_embeddings
  j["original_max_position_embeddings"] = 111;  // a top-level one wins (transformers' Phi-3 rule)
  EXPECT_EQ(parse(j).rope_scaling.original_max_position_embeddings, 111);
  // An empty or null rope_scaling leaves rope_parameters in charge.
  j["rope_scaling"] = json::object();
  EXPECT_EQ(parse(j).rope_scaling.kind, RopeScalingKind::none);
  EXPECT_EQ(parse(j).rope_theta, 99.0);
  j["rope_scaling"] = nullptr;
  EXPECT_EQ(parse(j).rope_theta, 99.0);
  j["partial_rotary_factor"] = 1.0;
  EXPECT_EQ(parse(j).rotary_dim, s.head_dim);
}

TEST(ModelConfig, MistralWindowsEveryLayer) {
  auto gen = test_rng();
  const Shape s = random_shape(gen);
  json j = base("mistral", s);
  const int64_t w = 1 + static_cast<int64_t>(gen() % 9);
  j["sliding_window"] = w;
  j["layer_types"] = json::array();  // transformers' Mistral ignores layer_types
  ModelConfig c = parse(j);
  expect_shape(c, s);
  EXPECT_EQ(c.family, Family::mistral);
  for (int64_t v : c.window_left) EXPECT_EQ(v, w - 1);
  EXPECT_FALSE(c.qkv_bias || c.o_bias || c.mlp_bias);
  j["sliding_window"] = nullptr;
  c = parse(j);
  for (int64_t v : c.window_left) EXPECT_EQ(v, -1);
  j.erase("sliding_window");  // MistralConfig's default: 4096
  c = parse(j);
  for (int64_t v : c.window_left) EXPECT_EQ(v, 4095);
  j.erase("num_key_value_heads");
  j["num_attention_heads"] = 8;
  j["hidden_size"] = 8 * s.head_dim;
  EXPECT_EQ(parse(j).num_kv_heads, 8);  // MistralConfig's default
}

TEST(ModelConfig, Qwen2BiasesAndWindows) {
  auto gen = test_rng();
  Shape s = random_shape(gen);
  s.layers = 5;
  json j = base("qwen2", s);
  j["sliding_window"] = 4;
  j["use_sliding_window"] = false;
  j["max_window_layers"] = 2;
  ModelConfig c = parse(j);
  expect_shape(c, s);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_TRUE(c.eos_token_ids.empty());
  for (int64_t v : c.window_left) EXPECT_EQ(v, -1);
  j["use_sliding_window"] = true;  // layers from max_window_layers on slide
  EXPECT_EQ(parse(j).window_left, (std::vector<int64_t>{-1, -1, 3, 3, 3}));
  j["layer_types"] = {"sliding_attention", "full_attention", "attention", "sliding_attention", "full_attention"};
  EXPECT_EQ(parse(j).window_left, (std::vector<int64_t>{3, -1, -1, 3, -1}));
  j["use_sliding_window"] = false;  // the window is then None: a sliding layer cannot be built
  expect_refused(j, "sliding_window", "a window for layer 0");
  j.erase("num_key_value_heads");
  j.erase("layer_types");
  j["num_attention_heads"] = 32;
  j["hidden_size"] = 32 * s.head_dim;
  EXPECT_EQ(parse(j).num_kv_heads, 32);  // Qwen2Config's default
  j["attention_bias"] = true;  // not a Qwen2 key: o stays without bias
  EXPECT_FALSE(parse(j).o_bias);
}

TEST(ModelConfig, Qwen3HeadNorms) {
  auto gen = test_rng();
  Shape s = random_shape(gen);
  s.head_dim = 128;  // Qwen3Config's default; hidden need not be heads · head_dim
  json j = base("qwen3", s);
  j["hidden_size"] = s.hidden = 2 * s.heads + 1;
  const bool bias = gen() % 2;
  j["attention_bias"] = bias;
  const ModelConfig c = parse(j);
  expect_shape(c, s);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.qkv_bias, bias);
  EXPECT_EQ(c.o_bias, bias);
  EXPECT_FALSE(c.tie_word_embeddings);
  j["head_dim"] = nullptr;
  expect_refused(j, "head_dim", "a positive integer");
}

TEST(ModelConfig, Gemma2) {
  auto gen = test_rng();
  Shape s = random_shape(gen);
  s.layers = 4;
  json j = base("gemma2", s);
  j["head_dim"] = s.head_dim;
  j["sliding_window"] = 6;
  const ModelConfig c = parse(j);
  expect_shape(c, s);
  EXPECT_EQ(c.family, Family::gemma2);
  EXPECT_EQ(c.mlp, MlpKind::geglu);
  EXPECT_EQ(c.norm_weight_offset, 1.0f);
  EXPECT_TRUE(c.post_norms);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.embedding_scale, static_cast<float>(std::sqrt(static_cast<double>(s.hidden))));
  EXPECT_EQ(c.attention_scale, 1.0f / 16.0f);  // query_pre_attn_scalar 256
  EXPECT_EQ(c.attn_logit_softcap, 50.0f);
  EXPECT_EQ(c.final_logit_softcap, 30.0f);
  EXPECT_EQ(c.window_left, (std::vector<int64_t>{5, -1, 5, -1}));  // the first layer slides
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{1}));
  json k = j;
  k["attn_logit_softcapping"] = nullptr;
  k["final_logit_softcapping"] = 7.5;
  k["query_pre_attn_scalar"] = 9;
  const ModelConfig d = parse(k);
  EXPECT_EQ(d.attn_logit_softcap, 0.0f);
  EXPECT_EQ(d.final_logit_softcap, 7.5f);
  EXPECT_EQ(d.attention_scale, 1.0f / 3.0f);
  k["use_bidirectional_attention"] = true;
  expect_refused(k, "use_bidirectional_attention", "causal");
  k = j;
  k["hidden_activation"] = "gelu";
  expect_refused(k, "hidden_activation", "gelu_pytorch_tanh");
  k = j;
  k["attn_logit_softcapping"] = 0;
  expect_refused(k, "attn_logit_softcapping", "a number > 0");
  k = j;
  k["sliding_window"] = nullptr;
  expect_refused(k, "sliding_window", "a window for layer 0");
}

TEST(ModelConfig, Gpt2) {
  const json j = {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", 257},
                  {"n_embd", 12},         {"n_layer", 3},                         {"n_head", 3},
                  {"n_positions", 9},     {"n_inner", nullptr},                   {"eos_token_id", 50256}};
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.family, Family::gpt2);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.intermediate_size, 48);
  EXPECT_EQ(c.max_positions, 9);
  EXPECT_EQ(c.norm, NormKind::layer_norm);
  EXPECT_EQ(c.positions, PositionKind::learned);
  EXPECT_EQ(c.mlp, MlpKind::gelu);
  EXPECT_TRUE(c.qkv_bias && c.o_bias && c.mlp_bias && c.tie_word_embeddings);
  EXPECT_TRUE(c.eos_token_ids.empty());  // 50256 is outside a 257-token vocabulary
  EXPECT_EQ(c.window_left, (std::vector<int64_t>{-1, -1, -1}));
  json k = j;
  k["n_head"] = 5;
  expect_refused(k, "n_head", "a divisor of n_embd = 12");
  k = j;
  k["activation_function"] = "relu";
  expect_refused(k, "activation_function", "gelu_new");
}

TEST(ModelConfig, RefusesWhatWouldBeAnotherModel) {
  const Shape s{4, 2, 4, 16, 7, 2, 30};
  const json llama = base("llama", s);
  const auto with = [&](const char* key, json v, json j) {
    j[key] = std::move(v);
    return j;
  };
  expect_refused(with("model_type", "falcon", llama), "model_type", "\"llama\"");
  expect_refused(with("architectures", {"LlamaForSequenceClassification"}, llama), "architectures[0]",
                 "LlamaForCausalLM");
  expect_refused(with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4}}, llama), "rope_type",
                 "\"default\", \"linear\" or \"llama3\"");
  expect_refused(with("rope_scaling", {{"type", "dynamic"}, {"factor", 4}}, llama), "type", "\"llama3\"");
  expect_refused(with("rope_parameters", {{"rope_type", "llama3"}, {"factor", 4}}, llama), "low_freq_factor",
                 "required");
  expect_refused(with("rope_parameters", {{"rope_type", "linear"}}, llama), "factor", "required");
  expect_refused(with("rope_parameters", {{"full_attention", {{"rope_type", "default"}}}}, llama), "full_attention",
                 "one set of RoPE parameters");
  expect_refused(with("rope_parameters", {{"rope_type", "llama3"}, {"factor", 8}, {"low_freq_factor", 4},
                                          {"high_freq_factor", 4}}, llama),
                 "rope_scaling", "low_freq_factor < high_freq_factor");
  expect_refused(with("partial_rotary_factor", 0.5, llama), "partial_rotary_factor", "partial rotary");
  expect_refused(with("hidden_act", "gelu", llama), "hidden_act", "\"silu\"");
  expect_refused(with("num_key_value_heads", 3, llama), "num_key_value_heads", "a divisor of num_attention_heads = 4");
  expect_refused(with("num_attention_heads", 3, with("num_key_value_heads", 1, llama)), "num_attention_heads",
                 "a divisor of hidden_size = 16");
  expect_refused(with("num_hidden_layers", 1e18, llama), "num_hidden_layers", "a positive integer");
  expect_refused(with("num_hidden_layers", 1000000000000000000, llama), "config", "weights that fit in memory");
  expect_refused(with("vocab_size", int64_t{1} << 33, llama), "vocab_size", "at most 2147483647");
  expect_refused(with("hidden_size", json::parse("18446744073709551615"), llama), "hidden_size", "an integer in");
  expect_refused(with("hidden_size", -16, llama), "hidden_size", "a positive integer");
  expect_refused(with("intermediate_size", "7", llama), "intermediate_size", "a positive integer");
  expect_refused(with("eos_token_id", {1, "2"}, llama), "eos_token_id", "an integer in");
  expect_refused(with("eos_token_id", int64_t{1} << 40, llama), "eos_token_id", "an integer in");
  expect_refused(with("rms_norm_eps", 0, llama), "norm_eps", "a finite number > 0");
  expect_refused(with("rope_theta", "big", llama), "rope_theta", "a finite number");
  expect_refused(with("tie_word_embeddings", 1, llama), "tie_word_embeddings", "true or false");
  const json qwen = base("qwen2", s);
  expect_refused(with("layer_types", {"full_attention"}, qwen), "layer_types", "an array of num_hidden_layers = 2");
  expect_refused(with("layer_types", {"full_attention", "chunked_attention"}, qwen), "layer_types",
                 "\"full_attention\" or \"sliding_attention\"");
  json sliding = with("use_sliding_window", true, qwen);
  sliding["max_window_layers"] = 0;
  expect_refused(with("sliding_window", 0, sliding), "sliding_window", "a positive integer");
  expect_refused(with("max_window_layers", -1, sliding), "max_window_layers", "an integer >= 0");
  EXPECT_EQ(parse(sliding).window_left, (std::vector<int64_t>{4095, 4095}));
  // Neither a model_type nor a known architecture; not an object; not JSON.
  expect_refused(json{{"hidden_size", 4}}, "model_type", "\"gpt2\"");
  expect_refused(json::array({1}), "cfg.json", "a JSON object");
  EXPECT_NE(error_of([] { ModelConfig::parse("{\"model_type\": ", "cfg.json"); }).find("cfg.json"), std::string::npos);
  EXPECT_NE(error_of([] { ModelConfig::load("/nonexistent/config.json"); }).find("no such file"), std::string::npos);
}

TEST(ModelConfig, ValidateChecksConsistency) {
  const Shape s{4, 2, 4, 16, 7, 2, 30};
  ModelConfig c = parse(base("llama", s));
  c.validate("test");
  ModelConfig bad = c;
  bad.window_left.pop_back();
  EXPECT_NE(error_of([&] { bad.validate("test"); }).find("window_left"), std::string::npos);
  bad = c;
  bad.rotary_dim = 3;
  EXPECT_NE(error_of([&] { bad.validate("test"); }).find("rotary_dim"), std::string::npos);
  bad = c;
  bad.eos_token_ids = {30};
  EXPECT_NE(error_of([&] { bad.validate("test"); }).find("eos_token_ids"), std::string::npos);
  bad = c;
  bad.num_heads = INT64_MAX / 2;
  bad.num_kv_heads = 1;
  EXPECT_NE(error_of([&] { bad.validate("test"); }).find("test: config"), std::string::npos);
  bad = c;
  bad.attn_logit_softcap = NAN;
  EXPECT_NE(error_of([&] { bad.validate("test"); }).find("attn_logit_softcap"), std::string::npos);
}

}  // namespace
}  // namespace mhsa::test
