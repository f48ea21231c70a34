// model/families/llama.cpp — Llama 2/3.x (LlamaForCausalLM; SmolLM2, TinyLlama): RMSNorm, RoPE
// (default, linear or llama3 scaling), SwiGLU, grouped heads, attention_bias and mlp_bias, a tied or
// untied head. The block every other rotary family is told against; training writes it.
#include <nlohmann/json.hpp>

#include "model/config_keys.h"
#include "model/family.h"

namespace mhsa::detail {
namespace {

constexpr RotaryRules kRules{.vocab = 32000, .hidden = 4096, .inter = 11008, .layers = 32, .heads = 32,
                             .kv_heads = 0, .head_dim = 0, .positions = 2048, .tie = false, .bos = 1, .eos = 2,
                             .heads_divide_hidden = true, .mlp_bias_key = true, .layer_types = false};

void read(const Keys& k, ModelConfig& c) { read_rotary(k, c, kRules); }

// config.json as transformers' LlamaConfig reads it (rope_theta in the classic form every version
// reads), with mhsa's tokenizer key as GPT-2's directories have it. What training writes: no
// biases, no RoPE scaling, every layer global.
std::string write(const ModelConfig& c) {
  const auto token = [](int32_t id) { return id >= 0 ? nlohmann::json(id) : nlohmann::json(); };
  const nlohmann::json j = {{"model_type", "llama"},
                            {"architectures", {"LlamaForCausalLM"}},
                            {"vocab_size", c.vocab_size},
                            {"hidden_size", c.hidden_size},
                            {"intermediate_size", c.intermediate_size},
                            {"num_hidden_layers", c.num_layers},
                            {"num_attention_heads", c.num_heads},
                            {"num_key_value_heads", c.num_kv_heads},
                            {"head_dim", c.head_dim},
                            {"hidden_act", "silu"},
                            {"max_position_embeddings", c.max_positions},
                            {"rms_norm_eps", c.norm_eps},
                            {"rope_theta", c.rope_theta},
                            {"rope_scaling", nullptr},
                            {"attention_bias", false},
                            {"attention_dropout", 0.0},
                            {"mlp_bias", false},
                            {"tie_word_embeddings", c.tie_word_embeddings},
                            {"initializer_range", 0.02},
                            {"pretraining_tp", 1},
                            {"use_cache", true},
                            {"bos_token_id", token(c.bos_token_id)},
                            {"eos_token_id", token(c.eos_token_ids.empty() ? -1 : c.eos_token_ids[0])},
                            {"mhsa_tokenizer", c.vocab_size == 256 ? "bytes" : "gpt2"}};
  return j.dump(2) + "\n";
}

constexpr GgufRename kLayer[] = {{"input_layernorm", "attn_norm", GgufLayout::as_is},
                                 {"self_attn.q_proj", "attn_q", GgufLayout::permuted},
                                 {"self_attn.k_proj", "attn_k", GgufLayout::permuted},
                                 {"self_attn.v_proj", "attn_v", GgufLayout::as_is},
                                 {"self_attn.o_proj", "attn_output", GgufLayout::as_is},
                                 {"post_attention_layernorm", "ffn_norm", GgufLayout::as_is},
                                 {"mlp.gate_proj", "ffn_gate", GgufLayout::as_is},
                                 {"mlp.up_proj", "ffn_up", GgufLayout::as_is},
                                 {"mlp.down_proj", "ffn_down", GgufLayout::as_is}};

}  // namespace

extern const GgufRename kLlamaGgufGlobal[3] = {{"model.embed_tokens", "token_embd", GgufLayout::as_is},
                                               {"model.norm", "output_norm", GgufLayout::as_is},
                                               {"lm_head", "output", GgufLayout::as_is}};

extern const FamilyInfo kLlamaFamily{.family = Family::llama,
                                     .model_type = "llama",
                                     .architecture = "LlamaForCausalLM",
                                     .read_config = read,
                                     .write_config = write,
                                     .gguf_arch = "llama",
                                     .gguf_global = kLlamaGgufGlobal,
                                     .gguf_layer = kLayer};

}  // namespace mhsa::detail
