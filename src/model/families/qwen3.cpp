// model/families/qwen3.cpp — Qwen3 (Qwen3ForCausalLM): Llama with an RMSNorm over each head of q and
// k before RoPE, a head_dim of its own, Qwen's windows.
#include "model/config_keys.h"
#include "model/family.h"

namespace mhsa::detail {
namespace {

constexpr RotaryRules kRules{.vocab = 151936, .hidden = 4096, .inter = 22016, .layers = 32, .heads = 32,
                             .kv_heads = 32, .head_dim = 128, .positions = 32768, .tie = false, .bos = -1, .eos = -1,
                             .windows = RotaryRules::Windows::qwen, .default_window = 4096};

void read(const Keys& k, ModelConfig& c) { read_rotary(k, c, kRules); }

}  // namespace

extern const FamilyInfo kQwen3Family{
    .family = Family::qwen3, .model_type = "qwen3", .architecture = "Qwen3ForCausalLM",
    .block = {.qk_norm = true}, .read_config = read};

}  // namespace mhsa::detail
