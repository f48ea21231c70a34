// model/gguf_names.cpp — see model/gguf_names.h.
#include "model/gguf_names.h"

#include <cstring>

#include "core/check.h"
#include "io/json.h"

namespace mhsa::detail {
namespace {

struct Rename {
  const char* hf;    // a module, without ".weight" / ".bias"
  const char* gguf;
  GgufLayout weight_layout;
};

constexpr Rename kGpt2Global[] = {{"wte", "token_embd", GgufLayout::as_is},
                                  {"wpe", "position_embd", GgufLayout::as_is},
                                  {"ln_f", "output_norm", GgufLayout::as_is},
                                  {"lm_head", "output", GgufLayout::as_is}};
constexpr Rename kGpt2Layer[] = {{"ln_1", "attn_norm", GgufLayout::as_is},
                                 {"attn.c_attn", "attn_qkv", GgufLayout::transposed},
                                 {"attn.c_proj", "attn_output", GgufLayout::transposed},
                                 {"ln_2", "ffn_norm", GgufLayout::as_is},
                                 {"mlp.c_fc", "ffn_up", GgufLayout::transposed},
                                 {"mlp.c_proj", "ffn_down", GgufLayout::transposed}};
constexpr Rename kLlamaGlobal[] = {{"model.embed_tokens", "token_embd", GgufLayout::as_is},
                                   {"model.norm", "output_norm", GgufLayout::as_is},
                                   {"lm_head", "output", GgufLayout::as_is}};
constexpr Rename kLlamaLayer[] = {{"input_layernorm", "attn_norm", GgufLayout::as_is},
                                  {"self_attn.q_proj", "attn_q", GgufLayout::permuted},
                                  {"self_attn.k_proj", "attn_k", GgufLayout::permuted},
                                  {"self_attn.v_proj", "attn_v", GgufLayout::as_is},
                                  {"self_attn.o_proj", "attn_output", GgufLayout::as_is},
                                  {"post_attention_layernorm", "ffn_norm", GgufLayout::as_is},
                                  {"mlp.gate_proj", "ffn_gate", GgufLayout::as_is},
                                  {"mlp.up_proj", "ffn_up", GgufLayout::as_is},
                                  {"mlp.down_proj", "ffn_down", GgufLayout::as_is}};

}  // namespace

GgufName gguf_name(const ModelConfig& c, std::string_view hf_name) {
  const bool gpt2 = c.family == Family::gpt2;
  if (!gpt2 && c.family != Family::llama)
    fail("gguf", "model", "a llama or gpt2 model (the families mhsa maps to GGUF)", family_name(c.family));
  const auto bad = [&]() -> GgufName {
    fail("gguf", "parameter", message("a ", family_name(c.family), " parameter llama.cpp has a name for"), quote(hf_name));
  };
  std::string_view suffix;
  for (std::string_view s : {".weight", ".bias"})
    if (hf_name.ends_with(s)) suffix = s;
  if (suffix.empty()) return bad();
  std::string_view module = hf_name.substr(0, hf_name.size() - suffix.size());
  const std::string_view layers = gpt2 ? "h." : "model.layers.";
  std::string block;
  std::span<const Rename> table = gpt2 ? std::span<const Rename>(kGpt2Global) : std::span<const Rename>(kLlamaGlobal);
  if (module.starts_with(layers)) {
    module.remove_prefix(layers.size());
    const size_t dot = module.find('.');
    if (dot == 0 || dot == std::string_view::npos || module.substr(0, dot).find_first_not_of("0123456789") != std::string_view::npos)
      return bad();
    block = message("blk.", module.substr(0, dot), ".");
    module.remove_prefix(dot + 1);
    table = gpt2 ? std::span<const Rename>(kGpt2Layer) : std::span<const Rename>(kLlamaLayer);
  }
  for (const Rename& r : table) {
    if (module != r.hf) continue;
    GgufName g{message(block, r.gguf, suffix), r.weight_layout, 0};
    if (g.layout == GgufLayout::transposed && suffix == ".bias") g.layout = GgufLayout::as_is;
    if (g.layout == GgufLayout::permuted) g.heads = std::strcmp(r.gguf, "attn_q") == 0 ? c.num_heads : c.num_kv_heads;
    return g;
  }
  return bad();
}

Tensor permute_rows(const Tensor& x, int64_t heads, bool to_gguf) {
  const int64_t R = x.dim(0), W = x.numel() / (R ? R : 1), D = R / heads, half = D / 2;
  if (R % heads != 0 || D % 2 != 0)
    fail("gguf", "q/k rows", message("heads of an even number of rows (", heads, " heads)"), std::to_string(R));
  Tensor y(x.shape());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t s = 0; s < 2; ++s) {
        const int64_t hf = h * D + s * half + i, gg = h * D + 2 * i + s;
        const int64_t from = to_gguf ? hf : gg, to = to_gguf ? gg : hf;
        std::memcpy(y.data() + to * W, x.data() + from * W, static_cast<size_t>(W) * 4);
      }
  return y;
}

Tensor transpose_2d(const Tensor& x) {
  const int64_t a = x.dim(0), b = x.dim(1);
  Tensor y({b, a});
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j) y.data()[j * a + i] = x.data()[i * b + j];
  return y;
}

}  // namespace mhsa::detail
