// model/model.cpp — mhsa::Model (see mhsa/model.h): each family's parameters (Hugging Face names,
// shapes, layouts and the part each plays in the block) from its ModelConfig, loading them from a
// directory (config.json by ModelConfig::load, the weights by ShardedSafeTensors), random
// weights, and the shared decoder (model/decoder.h) over the result.
#include <algorithm>
#include <optional>

#include "core/check.h"
#include "io/checkpoint_dir.h"
#include "io/file.h"
#include "io/json.h"
#include "kernels/gemm.h"
#include "mhsa/evaluate.h"
#include "mhsa/safetensors.h"
#include "model/access.h"
#include "model/decoder.h"
#include "model/family.h"
#include "model/gguf_model.h"

namespace mhsa {

using detail::fail;
using detail::message;
namespace fs = std::filesystem;

// The model's nn::Stack but for its config and parameter pointers (set per call: a Model moves),
// and a bf16 model's 16-bit, a q8_0 model's 8-bit or a q4_k model's 4-bit (and 8-bit) weights
// (indexed like the parameters; empty matrices elsewhere).
struct Model::Layout : nn::Stack {
  bool blocked = false;  // GPT-2's projections blocked for decoding (ModelAccess::block_weights)
  std::vector<nn::HalfMatrix> half16;
  std::vector<nn::Q8Matrix> quant8;
  std::vector<nn::Q4Matrix> quant4;
  std::vector<nn::BlockedMatrix> blocked_out;  // the output matrix, blocked (block_weights)
};

namespace {

enum class Init { weight, zero, one };
enum class Half { no, as_is, transposed };  // kept as bfloat16 / Q8_0 in a bf16 / q8_0 model ([out, in]), or not

struct Spec {
  std::string name;
  std::vector<int64_t> shape;
  Init init;
  Half half = Half::no;
  bool output = false;  // the output matrix (lm_head, or the tied embedding): Q8_0 in a q4_k model
};

// The parameters of a family and the part each plays: GPT-2's names (Conv1D weights [in, out]),
// or the Llama-style names every other family shares (nn.Linear weights [out, in]), with the
// norms and q/k norms the config's block options ask for.
std::vector<Spec> plan(const ModelConfig& c, bool untied_head, Model::Layout& L) {
  std::vector<Spec> specs;
  const int64_t C = c.hidden_size, V = c.vocab_size, D = c.head_dim, F = c.intermediate_size;
  const int64_t Nq = c.num_heads * D, Nkv = c.num_kv_heads * D;
  const auto add = [&](std::string name, std::vector<int64_t> shape, Init init) {
    specs.push_back({std::move(name), std::move(shape), init});
    return static_cast<int>(specs.size() - 1);
  };
  const bool gpt2 = detail::family_info(c.family).hf_names == detail::HfNames::gpt2;
  const nn::Layout layout = gpt2 ? nn::Layout::in_out : nn::Layout::out_in;
  const auto linear = [&](const std::string& name, int64_t in, int64_t out, bool bias) {
    nn::LinearRef r;
    r.layout = layout;
    r.w = add(name + ".weight", gpt2 ? std::vector<int64_t>{in, out} : std::vector<int64_t>{out, in}, Init::weight);
    specs.back().half = gpt2 ? Half::transposed : Half::as_is;
    if (bias) r.b = add(name + ".bias", {out}, Init::zero);
    return r;
  };
  const Init gain = c.norm_weight_offset != 0 ? Init::zero : Init::one;  // (offset + w) = 1 at identity
  const auto norm = [&](const std::string& name, int64_t width, int* w, int* b) {
    *w = add(name + ".weight", {width}, gain);
    if (b && c.norm == NormKind::layer_norm) *b = add(name + ".bias", {width}, Init::zero);
  };
  L.layers.assign(static_cast<size_t>(c.num_layers), nn::LayerRefs());
  if (gpt2) {
    L.embed = add("wte.weight", {V, C}, Init::weight);
    specs.back().half = Half::as_is;
    L.pos = add("wpe.weight", {c.max_positions, C}, Init::weight);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      nn::LayerRefs& r = L.layers[static_cast<size_t>(l)];
      const std::string h = message("h.", l, ".");
      norm(h + "ln_1", C, &r.norm1_w, &r.norm1_b);
      r.qkv = linear(h + "attn.c_attn", C, Nq + 2 * Nkv, true);
      r.o = linear(h + "attn.c_proj", Nq, C, true);
      norm(h + "ln_2", C, &r.norm2_w, &r.norm2_b);
      r.fc = linear(h + "mlp.c_fc", C, F, true);
      r.proj = linear(h + "mlp.c_proj", F, C, true);
    }
    norm("ln_f", C, &L.final_norm_w, &L.final_norm_b);
  } else {
    L.embed = add("model.embed_tokens.weight", {V, C}, Init::weight);
    specs.back().half = Half::as_is;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      nn::LayerRefs& r = L.layers[static_cast<size_t>(l)];
      const std::string h = message("model.layers.", l, ".");
      if (c.pre_norms) norm(h + "input_layernorm", C, &r.norm1_w, &r.norm1_b);
      r.q = linear(h + "self_attn.q_proj", C, Nq, c.qkv_bias);
      r.k = linear(h + "self_attn.k_proj", C, Nkv, c.qkv_bias);
      r.v = linear(h + "self_attn.v_proj", C, Nkv, c.qkv_bias);
      if (c.qk_norm) {
        r.q_norm = add(h + "self_attn.q_norm.weight", {c.qk_norm_full_width ? Nq : D}, gain);
        r.k_norm = add(h + "self_attn.k_norm.weight", {c.qk_norm_full_width ? Nkv : D}, gain);
      }
      r.o = linear(h + "self_attn.o_proj", Nq, C, c.o_bias);
      // Hugging Face's post_attention_layernorm: after attention where the family has post
      // norms (then the MLP's pre-norm, if any, is pre_feedforward_layernorm), else before the MLP.
      if (c.post_norms) {
        norm(h + "post_attention_layernorm", C, &r.post_norm1_w, nullptr);
        if (c.pre_norms) norm(h + "pre_feedforward_layernorm", C, &r.norm2_w, &r.norm2_b);
      } else {
        norm(h + "post_attention_layernorm", C, &r.norm2_w, &r.norm2_b);
      }
      if (c.mlp == MlpKind::gelu) {
        r.fc = linear(h + "mlp.fc", C, F, c.mlp_bias);
        r.proj = linear(h + "mlp.proj", F, C, c.mlp_bias);
      } else {
        r.gate = linear(h + "mlp.gate_proj", C, F, c.mlp_bias);
        r.up = linear(h + "mlp.up_proj", C, F, c.mlp_bias);
        r.down = linear(h + "mlp.down_proj", F, C, c.mlp_bias);
      }
      if (c.post_norms) norm(h + "post_feedforward_layernorm", C, &r.post_norm2_w, nullptr);
    }
    norm("model.norm", C, &L.final_norm_w, &L.final_norm_b);
  }
  if (untied_head) {
    L.head = add("lm_head.weight", {V, C}, Init::weight);
    specs.back().half = Half::as_is;
  }
  if (c.positions == PositionKind::rotary) L.rope = nn::make_rope(c);
  specs[static_cast<size_t>(untied_head ? L.head : L.embed)].output = true;
  return specs;
}

std::string shape_text(const std::vector<int64_t>& s) { return shape_string(ConstTensorView(nullptr, s)); }

// Adds parameter `spec` with value t: as it is, or in a bf16 model rounded into L.half16, in a
// q8_0 model quantised into L.quant8, in a q4_k model quantised into L.quant4 (and an empty tensor
// in its place), or into L.quant8 when it is the output matrix or its rows are not whole 256-weight
// blocks (where llama.cpp's Q4_K mixes store Q6_K and Q5_0). A q8_0 or q4_k model keeps a matrix
// whose rows are not whole 32-weight blocks in float32 (llama.cpp's fallback too). `stored`: the
// matrix as a GGUF file stores it in Q4_K (t then unused).
void keep(std::vector<std::pair<std::string, Tensor>>& params, Model::Layout& L, WeightType dtype, const Spec& spec,
          Tensor t, std::optional<nn::Q4Matrix> stored = std::nullopt) {
  const bool transposed = spec.half == Half::transposed;
  if (dtype == WeightType::q4_k) {
    L.quant4.resize(params.size() + 1);
    L.quant8.resize(params.size() + 1);
    if (stored) {
      L.quant4.back() = std::move(*stored);
      t = Tensor();
    } else if (spec.half != Half::no) {
      const int64_t cols = t.dim(transposed ? 0 : 1);
      if (!spec.output && nn::Q4Matrix::fits(cols)) {
        L.quant4.back() = nn::Q4Matrix::quantized(t, transposed, spec.name);
        t = Tensor();
      } else if (nn::Q8Matrix::fits(cols)) {
        L.quant8.back() = nn::Q8Matrix::quantized(t, transposed, spec.name);
        t = Tensor();
      }
    }
  } else if (dtype == WeightType::bf16 || dtype == WeightType::f16) {
    L.half16.resize(params.size() + 1);
    if (spec.half != Half::no) {
      L.half16.back() = nn::HalfMatrix::rounded(
          t, transposed, dtype == WeightType::f16 ? nn::HalfFormat::f16 : nn::HalfFormat::bf16, spec.name);
      t = Tensor();
    }
  } else if (dtype == WeightType::q8_0) {
    L.quant8.resize(params.size() + 1);
    if (spec.half != Half::no && nn::Q8Matrix::fits(t.dim(transposed ? 0 : 1))) {
      L.quant8.back() = nn::Q8Matrix::quantized(t, transposed, spec.name);
      t = Tensor();
    }
  }
  params.emplace_back(spec.name, std::move(t));
}

}  // namespace

WeightType parse_weight_type(std::string_view name, std::string_view what) {
  if (name == "f32") return WeightType::f32;
  if (name == "bf16") return WeightType::bf16;
  if (name == "f16") return WeightType::f16;
  if (name == "q8_0") return WeightType::q8_0;
  if (name == "q4_k") return WeightType::q4_k;
  throw Error(message(what, ": expected \"f32\", \"bf16\", \"f16\", \"q8_0\" or \"q4_k\", got ", detail::quote(name)));
}

std::string_view weight_type_name(WeightType dtype) {
  switch (dtype) {
    case WeightType::bf16: return "bf16";
    case WeightType::f16: return "f16";
    case WeightType::q8_0: return "q8_0";
    case WeightType::q4_k: return "q4_k";
    default: return "f32";
  }
}

WeightType Model::weight_type() const {
  if (layout_ && !layout_->half16.empty()) {
    for (const nn::HalfMatrix& h : layout_->half16)
      if (!h.data.empty()) return h.format == nn::HalfFormat::f16 ? WeightType::f16 : WeightType::bf16;
    return WeightType::bf16;
  }
  if (layout_ && !layout_->quant4.empty()) return WeightType::q4_k;
  if (layout_ && !layout_->quant8.empty()) return WeightType::q8_0;
  return WeightType::f32;
}

Model::Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

Model Model::load(const fs::path& dir, WeightType dtype) {
  constexpr std::string_view fn = "Model::load";
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) return load_gguf(dir, dtype);
  if (!fs::is_directory(dir))
    fail(fn, "dir", "a model directory (config.json, model.safetensors) or a GGUF file", "'" + dir.string() + "'");
  Model m;
  const ShardedSafeTensors st = [&] {  // config.json and the weights of one checkpoint, while a trainer may swap them
    const detail::DirLock lock(dir, detail::DirLock::Mode::shared);
    m.config_ = ModelConfig::load(dir / "config.json");
    if (const fs::path gen = dir / "generation_config.json"; fs::exists(gen))
      m.config_.read_generation_config(detail::read_file(gen, fn, "generation_config.json"), gen.string());
    return ShardedSafeTensors::open_dir(dir);
  }();
  const ModelConfig& c = m.config_;
  // Sizes against the file before anything is allocated for them: the config's memory bound is an
  // estimate against physical memory, and 300,000 layers over a 100 KB file built ~600 MB of
  // per-layer names and indices before the first missing tensor was found. Every family's layer
  // has at least 6 tensors (GPT-2's ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj).
  constexpr int64_t kMinTensorsPerLayer = 6;
  if (const int64_t tensors = static_cast<int64_t>(st.names().size()); c.num_layers > tensors / kMinTensorsPerLayer)
    fail(fn, message(dir.string(), ": config.num_layers"),
         message("at most the ", tensors, " tensors' worth of layers in the weights (", kMinTensorsPerLayer,
                 " or more a layer)"),
         std::to_string(c.num_layers));
  // GPT-2 files may prefix "transformer."; the others' names are saved whole.
  const detail::FamilyInfo& family = detail::family_info(c.family);
  const std::string prefix =
      family.hf_names == detail::HfNames::gpt2 && st.find("transformer.wte.weight") != nullptr ? "transformer." : "";
  const std::string source = dir.string();
  const auto read = [&](const std::string& name, const std::vector<int64_t>& shape) {
    const SafeTensorInfo* info = st.find(prefix + name);
    if (info == nullptr) fail(fn, source, message("a tensor '", prefix + name, "'"), "none");
    if (info->shape != shape)
      fail(fn, message(source, ": tensor '", prefix + name, "'"), "shape " + shape_text(shape), shape_text(info->shape));
    return st.load(prefix + name);
  };
  // A parameter the family's files fuse with others: its rows of the fused tensor, which is read
  // once for all its parts (they come one after another in the plan).
  std::string fused_name;
  Tensor fused;
  const auto get = [&](const std::string& name, const std::vector<int64_t>& shape) {
    const std::optional<detail::FusedSlice> slice = family.fused ? family.fused(c, name) : std::nullopt;
    if (!slice) return read(name, shape);
    std::vector<int64_t> whole = shape;
    whole[0] = slice->total_rows;
    if (fused_name != slice->tensor) {
      fused = read(slice->tensor, whole);
      fused_name = slice->tensor;
    }
    const int64_t row = fused.numel() / slice->total_rows;
    Tensor part(shape);
    std::copy_n(fused.data() + slice->row_begin * row, slice->rows * row, part.data());
    return part;
  };
  bool untied = !c.tie_word_embeddings;
  Tensor head;
  if (c.family == Family::gpt2 && st.find("lm_head.weight") != nullptr) {
    // GPT-2 checkpoints often save the tied head explicitly: it is untied only if it differs.
    head = get("lm_head.weight", {c.vocab_size, c.hidden_size});
    const Tensor wte = get("wte.weight", {c.vocab_size, c.hidden_size});
    untied = !std::equal(head.data(), head.data() + head.numel(), wte.data());
  }
  m.assemble(untied, dtype, [&](const std::string& name, const std::vector<int64_t>& shape) {
    return name == "lm_head.weight" && head.defined() ? std::move(head) : get(name, shape);
  });
  return m;
}

Model Model::load_gguf(const fs::path& file, WeightType dtype) {
  const detail::GgufModelFile g = detail::GgufModelFile::open(file);
  Model m;
  m.config_ = g.config();
  m.assemble(g.untied_head(), dtype, [&](const std::string& name, const std::vector<int64_t>& shape) { return g.load(name, shape); },
             &g);
  return m;
}

void Model::assemble(bool untied, WeightType dtype,
                     const std::function<Tensor(const std::string&, const std::vector<int64_t>&)>& get,
                     const detail::GgufModelFile* gguf) {
  auto layout = std::make_unique<Layout>();
  const std::vector<Spec> specs = plan(config_, untied, *layout);
  params_.reserve(specs.size());
  for (const Spec& s : specs) {
    std::optional<nn::Q4Matrix> stored;
    if (gguf && dtype == WeightType::q4_k && s.half != Half::no && !s.output) stored = gguf->load_q4_k(s.name, s.shape);
    if (stored)
      keep(params_, *layout, dtype, s, Tensor(), std::move(stored));
    else
      keep(params_, *layout, dtype, s, get(s.name, s.shape));
  }
  layout_ = std::move(layout);
}

Model Model::random(const ModelConfig& config, uint64_t seed, WeightType dtype) {
  config.validate("Model::random");
  Model m;
  m.config_ = config;
  auto layout = std::make_unique<Layout>();
  const std::vector<Spec> specs = plan(config, !config.tie_word_embeddings, *layout);
  uint64_t state = seed;
  for (const Spec& s : specs) {
    Tensor t = s.init == Init::weight ? detail::random_tensor(s.shape, 0.02f, state) : Tensor(s.shape);
    if (s.init == Init::one) std::fill(t.data(), t.data() + t.numel(), 1.0f);
    keep(m.params_, *layout, dtype, s, std::move(t));
  }
  m.layout_ = std::move(layout);
  return m;
}

nn::Stack ModelAccess::stack(const Model& m) {
  nn::Stack s = *m.layout_;
  s.config = &m.config_;
  for (const auto& [name, t] : m.params_) s.params.push_back(&t);
  for (const nn::HalfMatrix& h : m.layout_->half16) s.half.push_back(h.data.empty() ? nullptr : &h);
  for (const nn::Q8Matrix& q : m.layout_->quant8) s.q8.push_back(q.data.empty() ? nullptr : &q);
  for (const nn::Q4Matrix& q : m.layout_->quant4) s.q4.push_back(q.data.empty() ? nullptr : &q);
  for (const nn::BlockedMatrix& b : m.layout_->blocked_out) s.blocked.push_back(b.rows == 0 ? nullptr : &b);
  return s;
}

bool ModelAccess::blocked(const Model& m) { return m.layout_ && m.layout_->blocked; }

bool ModelAccess::block_weights(Model& m) {
  if (m.config_.family != Family::gpt2 || m.weight_type() != WeightType::f32 || !m.layout_) return false;
  auto layout = std::make_unique<Model::Layout>(*m.layout_);
  for (nn::LayerRefs& r : layout->layers)
    for (nn::LinearRef* l : {&r.qkv, &r.o, &r.fc, &r.proj}) {
      if (l->w < 0 || l->layout != nn::Layout::in_out) continue;
      Tensor& w = m.params_[static_cast<size_t>(l->w)].second;
      if (w.shape().size() != 2 || !kernels::can_block(w.dim(0), w.dim(1))) continue;
      kernels::block_b_in_place(w.dim(0), w.dim(1), w.data());
      l->layout = nn::Layout::in_out_blocked;
      layout->blocked = true;
    }
  // The output matrix (GPT-2's tied embedding) transposed and blocked: the head is the largest
  // product of a step of several sequences. Its float tensor goes (the embedding reads the blocked
  // one), so the model holds no second copy of it.
  const int out = layout->head >= 0 ? layout->head : layout->embed;
  Tensor* w = out >= 0 ? &m.params_[static_cast<size_t>(out)].second : nullptr;
  if (w && w->shape().size() == 2 && nn::BlockedMatrix::fits(w->dim(0), w->dim(1))) {
    layout->blocked_out.resize(m.params_.size());
    layout->blocked_out[static_cast<size_t>(out)] = nn::BlockedMatrix::of(*w);
    *w = Tensor();
    layout->blocked = true;
  }
  const bool any = layout->blocked;
  m.layout_ = std::move(layout);
  return any;
}

// ---- parameters ------------------------------------------------------------------------------

std::vector<std::pair<std::string, const Tensor*>> Model::parameters() const {
  std::vector<std::pair<std::string, const Tensor*>> p;
  for (const auto& [name, t] : params_) p.emplace_back(name, &t);
  return p;
}

std::vector<std::pair<std::string, Tensor*>> Model::parameters() {
  std::vector<std::pair<std::string, Tensor*>> p;
  for (auto& [name, t] : params_) p.emplace_back(name, &t);
  return p;
}

const Tensor* Model::parameter(std::string_view name) const {
  for (const auto& [n, t] : params_)
    if (n == name) return &t;
  return nullptr;
}

namespace {
void require_f32(const Model& m, std::string_view fn) {
  if (ModelAccess::blocked(m))
    fail(fn, "model", "weights as loaded (this model's were blocked for decoding, for inference only)", "blocked weights");
  if (m.weight_type() != WeightType::f32)
    fail(fn, "model", "float32 weights (16-bit and 8-bit weights are for inference only: load with dtype f32 to train)",
         message(weight_type_name(m.weight_type()), " weights"));
}
}  // namespace

std::vector<Tensor> Model::zero_gradients() const {
  require_f32(*this, "Model::zero_gradients");
  std::vector<Tensor> g;
  for (const auto& [name, t] : params_) g.emplace_back(t.shape());
  return g;
}

// ---- running it ------------------------------------------------------------------------------

namespace {

template <class F>
auto with_decoder(const Model& m, bool names, F&& f) {
  const nn::Stack s = ModelAccess::stack(m);
  std::vector<std::string> n;
  if (names)
    for (auto& [name, t] : m.parameters()) n.push_back(std::move(name));
  const detail::Decoder d{s, "Model", "max_positions", m.config().eos_token_ids, n, m.kv_type()};
  return f(d);
}

}  // namespace

ModelCache Model::new_cache(int64_t batch, int64_t max_tokens) const {
  ModelCache cache;
  ModelAccess::layers(cache) =
      with_decoder(*this, false, [&](const detail::Decoder& d) { return detail::new_caches(d, batch, max_tokens); });
  return cache;
}

Tensor Model::forward(std::span<const int32_t> ids, int64_t B, int64_t T, std::vector<Tensor>* attention) const {
  return with_decoder(*this, false, [&](const detail::Decoder& d) { return detail::forward(d, ids, B, T, attention); });
}

Tensor hidden_states(const Model& model, std::span<const int32_t> ids, int64_t B, int64_t T) {
  return with_decoder(model, false, [&](const detail::Decoder& d) { return detail::hidden_states(d, ids, B, T); });
}

Tensor Model::extend(ModelCache& cache, std::span<const int32_t> ids, int64_t B, int64_t n, bool last_only) const {
  return with_decoder(*this, false, [&](const detail::Decoder& d) {
    return detail::extend(d, ModelAccess::layers(cache), ids, B, n, last_only);
  });
}

Tensor Model::step(std::span<const SequenceStep> seqs) const {
  std::vector<nn::SeqStep> steps;
  steps.reserve(seqs.size());
  for (const SequenceStep& q : seqs) steps.push_back({q.cache ? &ModelAccess::layers(*q.cache) : nullptr, q.ids, q.paged});
  return with_decoder(*this, false, [&](const detail::Decoder& d) { return detail::step(d, steps); });
}

std::vector<std::vector<int32_t>> Model::generate(std::span<const int32_t> prompts, int64_t B, int64_t T,
                                                  const GenerationOptions& o, const TokenCallback& on_token,
                                                  GenerationStats* stats) const {
  return with_decoder(*this, false, [&](const detail::Decoder& d) {
    return detail::generate(d, prompts, B, T, o, on_token, stats);
  });
}

int32_t Model::sample(std::span<float> logits, std::span<const int32_t> history, const GenerationOptions& o,
                      uint64_t& rng_state, size_t prompt_tokens) {
  return detail::sample(logits, history, o, rng_state, prompt_tokens);
}

double Model::loss_and_gradients(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T,
                                 std::vector<Tensor>& grads) const {
  require_f32(*this, "Model::loss_and_gradients");
  return with_decoder(*this, true, [&](const detail::Decoder& d) {
    return detail::loss_and_gradients(d, ids, targets, B, T, &grads);
  });
}

double Model::loss(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T) const {
  return with_decoder(*this, false, [&](const detail::Decoder& d) {
    return detail::loss_and_gradients(d, ids, targets, B, T, nullptr);
  });
}

}  // namespace mhsa
