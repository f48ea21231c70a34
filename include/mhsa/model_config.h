// mhsa/model_config.h — one description of every decoder-only transformer mhsa runs: GPT-2 and
// the Llama family (Llama 2/3.x, SmolLM2, TinyLlama), Mistral, Qwen2/2.5, Qwen3, Gemma 2, OLMo-2
// and Phi-3.
//
// A family is not a new forward pass: it is a set of named choices in this struct (which norm,
// where the norms sit, which MLP, learned or rotary positions, biases, a window and soft-cap per
// layer), read from a Hugging Face config.json by ModelConfig::parse through the family's
// registered descriptor (src/model/family.h), and one block implementation (nn/) composed from them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace mhsa {

enum class Family { gpt2, llama, mistral, qwen2, qwen3, gemma2, olmo2, phi3 };
enum class NormKind { layer_norm, rms_norm };      // LayerNorm with bias (GPT-2), RMSNorm (the rest)
enum class PositionKind { learned, rotary };       // wpe table (GPT-2), RoPE (the rest)
enum class MlpKind { gelu, swiglu, geglu };        // fc→GELU(tanh)→proj; down(silu(gate)·up); down(gelu_tanh(gate)·up)
enum class RopeScalingKind { none, linear, llama3, factors };

const char* family_name(Family f);  // "gpt2", "llama", ...

struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::none;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;      // llama3
  int64_t original_max_position_embeddings = 8192;           // llama3
  // factors: inverse frequency i is divided by factors[i] ([rotary_dim / 2]): a GGUF file's
  // rope_freqs tensor, as llama.cpp applies it (its converter's form of llama3 scaling)
  std::vector<float> factors;
};

struct ModelConfig {
  Family family = Family::gpt2;
  std::string architecture;        // the config's architectures[0], e.g. "LlamaForCausalLM"

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;         // C
  int64_t num_layers = 0;
  int64_t num_heads = 0;           // query heads
  int64_t num_kv_heads = 0;        // key/value heads (GQA when < num_heads)
  int64_t head_dim = 0;            // D (hidden_size / num_heads unless the config says)
  int64_t intermediate_size = 0;   // the MLP width F
  int64_t max_positions = 0;       // the context length

  NormKind norm = NormKind::layer_norm;
  double norm_eps = 1e-5;
  float norm_weight_offset = 0;    // Gemma: the norm multiplies by (1 + weight)

  PositionKind positions = PositionKind::learned;
  double rope_theta = 10000.0;
  int64_t rotary_dim = 0;          // rotated dimensions of each head (head_dim, less for partial rotary)
  RopeScaling rope_scaling;

  MlpKind mlp = MlpKind::gelu;
  bool qkv_bias = false;           // biases on q, k, v projections (GPT-2, Qwen2, attention_bias)
  bool o_bias = false;             // bias on the output projection (GPT-2, attention_bias)
  bool mlp_bias = false;           // biases in the MLP (GPT-2, mlp_bias)
  bool qk_norm = false;            // RMSNorm on q and k before RoPE: over each head (Qwen3), or
  bool qk_norm_full_width = false; //   over all heads of q, and of k, together (OLMo-2)
  bool pre_norms = true;           // norms before attention and before the MLP (all but OLMo-2)
  bool post_norms = false;         // norms after attention and after the MLP (Gemma 2's sandwich, OLMo-2)
  float embedding_scale = 1.0f;    // Gemma: embeddings multiplied by sqrt(hidden_size)
  float attention_scale = 0;       // score scale; 0 means 1/sqrt(head_dim)
  float attn_logit_softcap = 0;    // Gemma 2: s ← c·tanh(s/c) on attention scores; 0: none
  float final_logit_softcap = 0;   // Gemma 2: the same on the output logits; 0: none
  // Per layer: how many keys before the query's own a query may see (Hugging Face's sliding_window
  // W means window_left = W − 1); −1: unlimited. Size num_layers.
  std::vector<int64_t> window_left;
  bool tie_word_embeddings = true;

  int32_t bos_token_id = -1;       // −1: none
  // The embedding row nn.Embedding(padding_idx) keeps out of training (its lookups add no
  // gradient; a tied head's still do), as a negative pad_token_id counts from the end. −1: none
  // (GPT-2's embedding has no padding row).
  int32_t pad_token_id = -1;
  std::vector<int32_t> eos_token_ids;

  // Reads a Hugging Face config.json (any family above); throws mhsa::Error naming the key for a
  // missing, out-of-range or unsupported value (never a silently different model).
  static ModelConfig load(const std::filesystem::path& config_json);
  static ModelConfig parse(std::string_view json_text, const std::string& file = "config.json");
  // generation_config.json's eos_token_id (an integer or a list), when set, replaces eos_token_ids,
  // as transformers' generate reads it (Llama 3 Instruct stops at <|eot_id|> there, not in
  // config.json). Other keys are left to the caller's sampling options.
  void read_generation_config(std::string_view json_text, const std::string& file = "generation_config.json");
  // Shapes positive and consistent, products without overflow, weights fit in memory.
  void validate(std::string_view fn) const;
};

}  // namespace mhsa
