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

}  // namespace

extern const FamilyInfo kOlmo2Family{.family = Family::olmo2,
                                     .model_type = "olmo2",
                                     .architecture = "Olmo2ForCausalLM",
                                     .block = {.qk_norm = true, .qk_norm_full_width = true, .pre_norms = false,
                                               .post_norms = true},
                                     .read_config = read};

}  // namespace mhsa::detail
