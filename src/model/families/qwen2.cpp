// model/families/qwen2.cpp — Qwen2 / 2.5 (Qwen2ForCausalLM): Llama with biases on q, k and v (never
// on o), windows from use_sliding_window / max_window_layers / layer_types.
#include "model/config_keys.h"
#include "model/family.h"

namespace mhsa::detail {
namespace {

constexpr RotaryRules kRules{.vocab = 151936, .hidden = 4096, .inter = 22016, .layers = 32, .heads = 32,
                             .kv_heads = 32, .head_dim = 0, .positions = 32768, .tie = false, .bos = -1, .eos = -1,
                             .attention_bias_key = false, .qkv_bias = true, .windows = RotaryRules::Windows::qwen,
                             .default_window = 4096};

void read(const Keys& k, ModelConfig& c) { read_rotary(k, c, kRules); }

}  // namespace

extern const FamilyInfo kQwen2Family{
    .family = Family::qwen2, .model_type = "qwen2", .architecture = "Qwen2ForCausalLM", .read_config = read};

}  // namespace mhsa::detail
