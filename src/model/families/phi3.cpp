// model/families/phi3.cpp — Phi-3 (Phi3ForCausalLM): Llama without biases whose files fuse q|k|v
// into qkv_proj and gate|up into gate_up_proj (split into Llama's parts at load, fused again when
// written), with sliding_window on every layer when set. LongRoPE (Phi-3's long-context scaling)
// and partial rotary (Phi-4-mini) are refused.
#include "model/config_keys.h"
#include "model/family.h"

namespace mhsa::detail {
namespace {

constexpr RotaryRules kRules{.vocab = 32064, .hidden = 3072, .inter = 8192, .layers = 32, .heads = 32,
                             .kv_heads = 0, .head_dim = 0, .positions = 4096, .tie = false, .bos = 1, .eos = 32000,
                             .norm_eps = 1e-5, .pad = 32000, .attention_bias_key = false,
                             .windows = RotaryRules::Windows::every_layer, .layer_types = false};

void read(const Keys& k, ModelConfig& c) {
  // transformers' Phi3Config takes RoPE types "default" and "longrope" only; mhsa runs the first.
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!k.has(key) || !k.at(key).is_object()) continue;
    const Keys r(k.at(key), kParseFn, k.arg(key));
    const char* type_key = r.has("rope_type") ? "rope_type" : "type";
    if (const std::string type = r.text(type_key, "default"); type != "default")
      fail(kParseFn, r.arg(type_key), "\"default\" (Phi-3's LongRoPE scaling is not supported)", shown(type));
  }
  read_rotary(k, c, kRules);
}

// q_proj, k_proj, v_proj: rows of qkv_proj; gate_proj, up_proj: the halves of gate_up_proj.
std::optional<FusedSlice> fused(const ModelConfig& c, std::string_view name) {
  const int64_t Nq = c.num_heads * c.head_dim, Nkv = c.num_kv_heads * c.head_dim, F = c.intermediate_size;
  struct Part {
    std::string_view module, fused;
    int64_t begin, rows, total;
  };
  const Part parts[] = {{"self_attn.q_proj.weight", "self_attn.qkv_proj.weight", 0, Nq, Nq + 2 * Nkv},
                        {"self_attn.k_proj.weight", "self_attn.qkv_proj.weight", Nq, Nkv, Nq + 2 * Nkv},
                        {"self_attn.v_proj.weight", "self_attn.qkv_proj.weight", Nq + Nkv, Nkv, Nq + 2 * Nkv},
                        {"mlp.gate_proj.weight", "mlp.gate_up_proj.weight", 0, F, 2 * F},
                        {"mlp.up_proj.weight", "mlp.gate_up_proj.weight", F, F, 2 * F}};
  for (const Part& p : parts)
    if (name.ends_with(p.module) && name.size() > p.module.size() && name[name.size() - p.module.size() - 1] == '.') {
      std::string fused_name(name.substr(0, name.size() - p.module.size()));  // "model.layers.N."
      fused_name.append(p.fused);
      return FusedSlice{std::move(fused_name), p.begin, p.rows, p.total};
    }
  return std::nullopt;
}

constexpr GgufRename kLayer[] = {{"input_layernorm", "attn_norm", GgufLayout::as_is},
                                 {"self_attn.qkv_proj", "attn_qkv", GgufLayout::as_is},
                                 {"self_attn.o_proj", "attn_output", GgufLayout::as_is},
                                 {"post_attention_layernorm", "ffn_norm", GgufLayout::as_is},
                                 {"mlp.gate_up_proj", "ffn_up", GgufLayout::as_is},
                                 {"mlp.down_proj", "ffn_down", GgufLayout::as_is}};

}  // namespace

extern const FamilyInfo kPhi3Family{.family = Family::phi3,
                                    .model_type = "phi3",
                                    .architecture = "Phi3ForCausalLM",
                                    .read_config = read,
                                    .fused = fused,
                                    .gguf_arch = "phi3",
                                    .gguf_global = kLlamaGgufGlobal,
                                    .gguf_layer = kLayer};

}  // namespace mhsa::detail
