// model/families/gpt2.cpp — GPT-2 (GPT2LMHeadModel): LayerNorm with bias, learned positions, a GELU
// MLP, biases everywhere, q|k|v fused in c_attn, Conv1D weights [in, out].
#include <algorithm>
#include <cstdint>

#include "model/config_keys.h"
#include "model/family.h"

namespace mhsa::detail {
namespace {

void read(const Keys& k, ModelConfig& c) {
  constexpr std::string_view fn = kParseFn;
  if (const std::string act = k.text("activation_function", "gelu_new"); act != "gelu_new" && act != "gelu_pytorch_tanh")
    fail(fn, k.arg("activation_function"), "\"gelu_new\" or \"gelu_pytorch_tanh\" (GELU, tanh approximation)", shown(act));
  if (!k.flag("scale_attn_weights", true))
    fail(fn, k.arg("scale_attn_weights"), "true (scores scaled by 1/sqrt(head_dim))", "false");
  if (k.flag("scale_attn_by_inverse_layer_idx", false))
    fail(fn, k.arg("scale_attn_by_inverse_layer_idx"), "false (not supported)", "true");
  c.vocab_size = k.count("vocab_size", 50257);
  c.hidden_size = k.count("n_embd", 768);
  c.num_layers = k.count("n_layer", 12);
  c.num_heads = c.num_kv_heads = k.count("n_head", 12);
  if (c.hidden_size % c.num_heads != 0) k.bad("n_head", message("a divisor of n_embd = ", c.hidden_size));
  c.head_dim = c.hidden_size / c.num_heads;
  c.intermediate_size = k.has("n_inner") ? k.count("n_inner", 0) : 4 * std::min<int64_t>(c.hidden_size, INT64_MAX / 4);
  c.max_positions = k.count("n_positions", 1024);
  c.norm = NormKind::layer_norm;
  c.norm_eps = k.number("layer_norm_epsilon", 1e-5);
  c.positions = PositionKind::learned;
  c.mlp = MlpKind::gelu;
  c.qkv_bias = c.o_bias = c.mlp_bias = true;
  c.tie_word_embeddings = k.flag("tie_word_embeddings", true);
  read_special_tokens(k, c, 50256, {50256});
  // Per-layer vectors are sized by n_layer: bound it first.
  check_scalars(c, fn);
  c.window_left.assign(static_cast<size_t>(c.num_layers), -1);
}

constexpr GgufRename kGlobal[] = {{"wte", "token_embd", GgufLayout::as_is},
                                  {"wpe", "position_embd", GgufLayout::as_is},
                                  {"ln_f", "output_norm", GgufLayout::as_is},
                                  {"lm_head", "output", GgufLayout::as_is}};
constexpr GgufRename kLayer[] = {{"ln_1", "attn_norm", GgufLayout::as_is},
                                 {"attn.c_attn", "attn_qkv", GgufLayout::transposed},
                                 {"attn.c_proj", "attn_output", GgufLayout::transposed},
                                 {"ln_2", "ffn_norm", GgufLayout::as_is},
                                 {"mlp.c_fc", "ffn_up", GgufLayout::transposed},
                                 {"mlp.c_proj", "ffn_down", GgufLayout::transposed}};

}  // namespace

extern const FamilyInfo kGpt2Family{.family = Family::gpt2,
                                    .model_type = "gpt2",
                                    .architecture = "GPT2LMHeadModel",
                                    .read_config = read,
                                    .hf_names = HfNames::gpt2,
                                    .gguf_arch = "gpt2",
                                    .gguf_global = kGlobal,
                                    .gguf_layer = kLayer};

}  // namespace mhsa::detail
