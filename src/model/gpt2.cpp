// model/gpt2.cpp — GPT-2 (see mhsa/gpt2.h): loading a Hugging Face directory (its config.json in
// gpt2_config.cpp), its parameters by name, and its view as an nn::Stack: the forward, generation
// and training are the shared decoder's (model/decoder.h) over the one block (nn/block.h).
#include "mhsa/gpt2.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "core/check.h"
#include "io/checkpoint_dir.h"
#include "model/access.h"
#include "model/decoder.h"
#include "mhsa/safetensors.h"

namespace mhsa {
namespace {

using detail::fail;
using detail::message;
namespace fs = std::filesystem;

void shape_check(const SafeTensors& st, const std::string& file, const std::string& name,
                 const std::vector<int64_t>& want) {
  const SafeTensorInfo* info = st.find(name);
  if (info == nullptr) fail("Gpt2::load", file, message("a tensor '", name, "'"), "none");
  if (info->shape != want) {
    std::string w = "[", g = "[";
    for (size_t i = 0; i < want.size(); ++i) w += (i ? ", " : "") + std::to_string(want[i]);
    for (size_t i = 0; i < info->shape.size(); ++i) g += (i ? ", " : "") + std::to_string(info->shape[i]);
    fail("Gpt2::load", message(file, ": tensor '", name, "'"), "shape " + w + "]", g + "]");
  }
}

// ---- small helpers ---------------------------------------------------------------------------

Tensor filled(std::vector<int64_t> dims, float value) {
  Tensor t(std::move(dims));
  std::fill(t.data(), t.data() + t.numel(), value);
  return t;
}

}  // namespace

// ---- construction ----------------------------------------------------------------------------

Gpt2 Gpt2::load(const fs::path& dir) {
  constexpr std::string_view fn = "Gpt2::load";
  if (!fs::is_directory(dir)) fail(fn, "dir", "a model directory (config.json, model.safetensors)", "'" + dir.string() + "'");
  Gpt2 m;
  const fs::path weights = dir / "model.safetensors";
  const SafeTensors st = [&] {  // config.json and the weights of one checkpoint, while a trainer may swap them
    const detail::DirLock lock(dir, detail::DirLock::Mode::shared);
    m.config_ = Gpt2Config::load(dir / "config.json");
    if (!fs::exists(weights))
      fail(fn, dir.string(), "model.safetensors (PyTorch .bin checkpoints are not read: save with safe_serialization)",
           "no such file");
    return SafeTensors::open(weights.string());
  }();
  const std::string file = weights.string();
  const std::string prefix = st.find("transformer.wte.weight") != nullptr ? "transformer." : "";
  const Gpt2Config& c = m.config_;
  const int64_t C = c.n_embd, V = c.vocab_size, F = c.mlp_dim(), N = 3 * C;
  const auto get = [&](const std::string& name, const std::vector<int64_t>& shape) {
    shape_check(st, file, prefix + name, shape);
    return st.load(prefix + name);
  };
  m.wte_ = get("wte.weight", {V, C});
  m.wpe_ = get("wpe.weight", {c.n_positions, C});
  m.lnf_g_ = get("ln_f.weight", {C});
  m.lnf_b_ = get("ln_f.bias", {C});
  if (st.find("lm_head.weight") != nullptr) {
    shape_check(st, file, "lm_head.weight", {V, C});
    m.lm_head_ = st.load("lm_head.weight");
    // A tied head saved explicitly is the embedding again: keep one copy.
    if (std::equal(m.lm_head_.data(), m.lm_head_.data() + m.lm_head_.numel(), m.wte_.data())) m.lm_head_ = Tensor();
  }
  m.blocks_.reserve(static_cast<size_t>(c.n_layer));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = message("h.", l, ".");
    Block b{get(h + "ln_1.weight", {C}), get(h + "ln_1.bias", {C}), get(h + "ln_2.weight", {C}),
            get(h + "ln_2.bias", {C}), MultiHeadAttention(C, c.n_head), get(h + "mlp.c_fc.weight", {C, F}),
            get(h + "mlp.c_fc.bias", {F}), get(h + "mlp.c_proj.weight", {F, C}), get(h + "mlp.c_proj.bias", {C})};
    b.attn.set_parameter("w_qkv", get(h + "attn.c_attn.weight", {C, N}).view());
    b.attn.set_parameter("b_qkv", get(h + "attn.c_attn.bias", {N}).view());
    b.attn.set_parameter("w_o", get(h + "attn.c_proj.weight", {C, C}).view());
    b.attn.set_parameter("b_o", get(h + "attn.c_proj.bias", {C}).view());
    m.blocks_.push_back(std::move(b));
  }
  m.model_config_ = gpt2_model_config(m.config_);
  return m;
}

Gpt2 Gpt2::random(const Gpt2Config& config, uint64_t seed) {
  config.validate("Gpt2::random");
  Gpt2 m;
  m.config_ = config;
  const int64_t C = config.n_embd, V = config.vocab_size, F = config.mlp_dim();
  uint64_t s = seed;
  m.wte_ = detail::random_tensor({V, C}, 0.02f, s);
  m.wpe_ = detail::random_tensor({config.n_positions, C}, 0.01f, s);
  m.lnf_g_ = filled({C}, 1.0f);
  m.lnf_b_ = filled({C}, 0.0f);
  for (int64_t l = 0; l < config.n_layer; ++l) {
    Block b{filled({C}, 1.0f), filled({C}, 0.0f), filled({C}, 1.0f), filled({C}, 0.0f),
            MultiHeadAttention(C, config.n_head), detail::random_tensor({C, F}, 0.02f, s), filled({F}, 0.0f),
            detail::random_tensor({F, C}, 0.02f, s), filled({C}, 0.0f)};
    b.attn.set_parameter("w_qkv", detail::random_tensor({C, 3 * C}, 0.02f, s).view());
    b.attn.set_parameter("w_o", detail::random_tensor({C, C}, 0.02f, s).view());
    m.blocks_.push_back(std::move(b));
  }
  m.model_config_ = gpt2_model_config(config);
  return m;
}

// ---- the model as the block sees it ---------------------------------------------------------

ModelConfig gpt2_model_config(const Gpt2Config& g) {
  ModelConfig c;
  c.family = Family::gpt2;
  c.architecture = "GPT2LMHeadModel";
  c.vocab_size = g.vocab_size;
  c.hidden_size = g.n_embd;
  c.num_layers = g.n_layer;
  c.num_heads = c.num_kv_heads = g.n_head;
  c.head_dim = g.n_embd / g.n_head;
  c.intermediate_size = g.mlp_dim();
  c.max_positions = g.n_positions;
  c.norm = NormKind::layer_norm;
  c.norm_eps = g.layer_norm_epsilon;
  c.positions = PositionKind::learned;
  c.mlp = MlpKind::gelu;
  c.qkv_bias = c.o_bias = c.mlp_bias = true;
  c.window_left.assign(static_cast<size_t>(g.n_layer), -1);
  c.tie_word_embeddings = true;
  if (g.eos_token_id >= 0) c.eos_token_ids = {g.eos_token_id};
  return c;
}

// wte, wpe, per block (ln_1 w/b, c_attn w/b, attn.c_proj w/b, ln_2 w/b, c_fc w/b, mlp.c_proj w/b),
// ln_f w/b, lm_head when untied: the order of parameters().
std::vector<const Tensor*> Gpt2::parameter_list() const {
  std::vector<const Tensor*> p = {&wte_, &wpe_};
  for (const Block& b : blocks_)
    p.insert(p.end(), {&b.ln1_g, &b.ln1_b, &b.attn.parameter("w_qkv"), &b.attn.parameter("b_qkv"),
                       &b.attn.parameter("w_o"), &b.attn.parameter("b_o"), &b.ln2_g, &b.ln2_b, &b.fc_w, &b.fc_b,
                       &b.proj_w, &b.proj_b});
  p.insert(p.end(), {&lnf_g_, &lnf_b_});
  if (lm_head_.defined()) p.push_back(&lm_head_);
  return p;
}

nn::Stack ModelAccess::stack(const Gpt2& m) {
  nn::Stack s;
  s.config = &m.model_config_;
  s.params = m.parameter_list();
  s.embed = 0;
  s.pos = 1;
  for (size_t l = 0; l < m.blocks_.size(); ++l) {
    const int i = 2 + 12 * static_cast<int>(l);
    nn::LayerRefs r;
    r.norm1_w = i, r.norm1_b = i + 1;
    r.qkv = {i + 2, i + 3, nn::Layout::in_out};
    r.o = {i + 4, i + 5, nn::Layout::in_out};
    r.norm2_w = i + 6, r.norm2_b = i + 7;
    r.fc = {i + 8, i + 9, nn::Layout::in_out};
    r.proj = {i + 10, i + 11, nn::Layout::in_out};
    s.layers.push_back(r);
  }
  s.final_norm_w = 2 + 12 * static_cast<int>(m.blocks_.size());
  s.final_norm_b = s.final_norm_w + 1;
  s.head = m.lm_head_.defined() ? s.final_norm_b + 1 : -1;
  return s;
}

std::vector<std::pair<std::string, const Tensor*>> Gpt2::parameters() const {
  static constexpr const char* kBlock[] = {"ln_1.weight",      "ln_1.bias",        "attn.c_attn.weight",
                                           "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
                                           "ln_2.weight",      "ln_2.bias",        "mlp.c_fc.weight",
                                           "mlp.c_fc.bias",    "mlp.c_proj.weight", "mlp.c_proj.bias"};
  const std::vector<const Tensor*> list = parameter_list();
  std::vector<std::pair<std::string, const Tensor*>> p = {{"wte.weight", list[0]}, {"wpe.weight", list[1]}};
  size_t i = 2;
  for (size_t l = 0; l < blocks_.size(); ++l)
    for (const char* name : kBlock) p.emplace_back(message("h.", l, ".", name), list[i++]);
  p.emplace_back("ln_f.weight", list[i++]);
  p.emplace_back("ln_f.bias", list[i++]);
  if (lm_head_.defined()) p.emplace_back("lm_head.weight", list[i]);
  return p;
}

std::vector<std::pair<std::string, Tensor*>> Gpt2::parameters() {
  std::vector<std::pair<std::string, Tensor*>> p;
  for (const auto& [name, t] : static_cast<const Gpt2&>(*this).parameters())
    p.emplace_back(name, const_cast<Tensor*>(t));  // the object itself is not const
  return p;
}

std::vector<Tensor> Gpt2::zero_gradients() const {
  std::vector<Tensor> g;
  for (const Tensor* t : parameter_list()) g.emplace_back(t->shape());
  return g;
}

// ---- running it ------------------------------------------------------------------------------

namespace {

// The shared decoder over this model: the stack, names for messages, eos.
template <class F>
auto with_decoder(const Gpt2& m, bool names, F&& f) {
  const nn::Stack s = ModelAccess::stack(m);
  std::vector<std::string> n;
  if (names)
    for (auto& [name, t] : m.parameters()) n.push_back(std::move(name));
  const int32_t eos = m.config().eos_token_id;
  const detail::Decoder d{s, "Gpt2", "n_positions", eos >= 0 ? std::span<const int32_t>(&eos, 1) : std::span<const int32_t>(), n};
  return f(d);
}

}  // namespace

Gpt2Cache Gpt2::new_cache(int64_t batch, int64_t max_tokens) const {
  Gpt2Cache cache;
  ModelAccess::layers(cache) = with_decoder(*this, false, [&](const detail::Decoder& d) {
    return detail::new_caches(d, batch, max_tokens);
  });
  return cache;
}

Tensor Gpt2::forward(std::span<const int32_t> ids, int64_t B, int64_t T, std::vector<Tensor>* attention) const {
  return with_decoder(*this, false, [&](const detail::Decoder& d) { return detail::forward(d, ids, B, T, attention); });
}

Tensor Gpt2::extend(Gpt2Cache& cache, std::span<const int32_t> ids, int64_t B, int64_t n, bool last_only) const {
  return with_decoder(*this, false, [&](const detail::Decoder& d) {
    return detail::extend(d, ModelAccess::layers(cache), ids, B, n, last_only);
  });
}

std::vector<std::vector<int32_t>> Gpt2::generate(std::span<const int32_t> prompts, int64_t B, int64_t T,
                                                 const GenerationOptions& o, const TokenCallback& on_token,
                                                 GenerationStats* stats) const {
  return with_decoder(*this, false, [&](const detail::Decoder& d) {
    return detail::generate(d, prompts, B, T, o, on_token, stats);
  });
}

int32_t Gpt2::sample(std::span<float> logits, std::span<const int32_t> history, const GenerationOptions& o,
                     uint64_t& rng_state, size_t prompt_tokens) {
  return detail::sample(logits, history, o, rng_state, prompt_tokens);
}

double Gpt2::loss_and_gradients(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T,
                                std::vector<Tensor>& grads) const {
  return with_decoder(*this, true, [&](const detail::Decoder& d) {
    return detail::loss_and_gradients(d, ids, targets, B, T, &grads);
  });
}

double Gpt2::loss(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T) const {
  return with_decoder(*this, false, [&](const detail::Decoder& d) {
    return detail::loss_and_gradients(d, ids, targets, B, T, nullptr);
  });
}

}  // namespace mhsa
