// model/families/gemma2.cpp — Gemma 2 (Gemma2ForCausalLM): GeGLU, norms multiplying by 1 + w,
// norms before and after attention and the MLP, embeddings × √C, score scale
// query_pre_attn_scalar^−½, attention and final soft-caps, windows on alternate layers.
#include <cmath>
#include <limits>

#include "model/config_keys.h"
#include "model/family.h"

namespace mhsa::detail {
namespace {

void extra(const Keys& k, ModelConfig& c) {
  if (k.flag("use_bidirectional_attention", false))
    fail(kParseFn, k.arg("use_bidirectional_attention"), "false or null (causal attention)", "true");
  const double scalar = k.number("query_pre_attn_scalar", 256);
  if (!(scalar > 0)) k.bad("query_pre_attn_scalar", "a number > 0");
  c.attention_scale = static_cast<float>(1.0 / std::sqrt(scalar));
  const auto softcap = [&](const char* key, double fallback) -> float {
    if (k.present(key) && k.at(key).is_null()) return 0;  // None: no capping
    const double v = k.number(key, fallback);
    if (!(v > 0) || v > std::numeric_limits<float>::max()) k.bad(key, "a number > 0, or null (no capping)");
    return static_cast<float>(v);
  };
  c.attn_logit_softcap = softcap("attn_logit_softcapping", 50.0);
  c.final_logit_softcap = softcap("final_logit_softcapping", 30.0);
  c.norm_weight_offset = 1.0f;
  c.embedding_scale = static_cast<float>(std::sqrt(static_cast<double>(c.hidden_size)));
}

constexpr RotaryRules kRules{.vocab = 256000, .hidden = 2304, .inter = 9216, .layers = 26, .heads = 8,
                             .kv_heads = 4, .head_dim = 256, .positions = 8192, .tie = true, .bos = 2, .eos = 1,
                             .pad = 0, .null_kv_heads_is_heads = false, .heads_divide_hidden = true, .geglu = true,
                             .windows = RotaryRules::Windows::alternate,
                             .default_window = 4096, .extra = extra};

void read(const Keys& k, ModelConfig& c) { read_rotary(k, c, kRules); }

}  // namespace

extern const FamilyInfo kGemma2Family{
    .family = Family::gemma2, .model_type = "gemma2", .architecture = "Gemma2ForCausalLM",
    .block = {.post_norms = true}, .read_config = read};

}  // namespace mhsa::detail
