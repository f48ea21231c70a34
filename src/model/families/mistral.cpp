// model/families/mistral.cpp — Mistral (MistralForCausalLM): Llama with sliding_window on every
// layer (4096 when absent) and no biases.
#include "model/config_keys.h"
#include "model/family.h"

namespace mhsa::detail {
namespace {

constexpr RotaryRules kRules{.vocab = 32000, .hidden = 4096, .inter = 14336, .layers = 32, .heads = 32,
                             .kv_heads = 8, .head_dim = 0, .positions = 4096 * 32, .tie = false, .bos = 1, .eos = 2,
                             .attention_bias_key = false, .windows = RotaryRules::Windows::every_layer,
                             .default_window = 4096, .layer_types = false};

void read(const Keys& k, ModelConfig& c) { read_rotary(k, c, kRules); }

}  // namespace

extern const FamilyInfo kMistralFamily{
    .family = Family::mistral, .model_type = "mistral", .architecture = "MistralForCausalLM", .read_config = read};

}  // namespace mhsa::detail
