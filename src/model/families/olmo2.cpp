// model/families/olmo2.cpp — OLMo-2 (Olmo2ForCausalLM): Llama with its norms after attention and
// after the MLP instead of before them (x += post_attention_layernorm(attn(x)); x +=
// post_feedforward_layernorm(mlp(x))), and q and k each RMS-normalised over all their heads
// together (q_norm [Hq·D], k_norm [Hkv·D]) before RoPE.
#include "model/config_keys.h"
#include "model/family.h"

namespace mhsa::detail {
namespace {

constexpr RotaryRules kRules{.vocab = 50304, .hidden = 4096, .inter = 11008, .layers = 32, .heads = 32,
                             .kv_heads = 0, .head_dim = 0, .positions = 2048, .tie = false, .bos = -1, .eos = 50279,
                             .norm_eps = 1e-5, .pad = 1, .layer_types = false};

void read(const Keys& k, ModelConfig& c) { read_rotary(k, c, kRules); }

constexpr GgufRename kLayer[] = {{"self_attn.q_proj", "attn_q", GgufLayout::as_is},
                                 {"self_attn.k_proj", "attn_k", GgufLayout::as_is},
                                 {"self_attn.v_proj", "attn_v", GgufLayout::as_is},
                                 {"self_attn.q_norm", "attn_q_norm", GgufLayout::as_is},
                                 {"self_attn.k_norm", "attn_k_norm", GgufLayout::as_is},
                                 {"self_attn.o_proj", "attn_output", GgufLayout::as_is},
                                 {"post_attention_layernorm", "post_attention_norm", GgufLayout::as_is},
                                 {"mlp.gate_proj", "ffn_gate", GgufLayout::as_is},
                                 {"mlp.up_proj", "ffn_up", GgufLayout::as_is},
                                 {"mlp.down_proj", "ffn_down", GgufLayout::as_is},
                                 {"post_feedforward_layernorm", "post_ffw_norm", GgufLayout::as_is}};

}  // namespace

extern const FamilyInfo kOlmo2Family{.family = Family::olmo2,
                                     .model_type = "olmo2",
                                     .architecture = "Olmo2ForCausalLM",
                                     .block = {.qk_norm = true, .qk_norm_full_width = true, .pre_norms = false,
                                               .post_norms = true},
                                     .read_config = read,
                                     .gguf_arch = "olmo2",
                                     .gguf_global = kLlamaGgufGlobal,
                                     .gguf_layer = kLayer};

}  // namespace mhsa::detail
