// model/gguf_model.cpp — GGUF files as models (see model/gguf_model.h): the name map shared by
// reading and writing, the q/k row permutation, and GGUF metadata → ModelConfig. Writing is
// model/gguf_save.cpp's.
#include "model/gguf_model.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "io/json.h"
#include "model/family.h"
#include "model/gguf_names.h"

namespace mhsa::detail {
namespace {

// Metadata of one architecture ("llama.block_count", …), each value range-checked.
class Hyper {
 public:
  Hyper(const GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
  std::string key(std::string_view k) const { return message(arch_, ".", k); }
  [[noreturn]] void bad(std::string_view k, const std::string& expected, const std::string& got) const {
    fail(message("gguf ", f_.source()), "metadata " + quote(key(k)), expected, got);
  }
  // A positive count below 2^31; `fallback` when absent (0: required).
  int64_t count(std::string_view k, int64_t fallback = 0) const {
    const std::optional<uint64_t> v = f_.get_uint(key(k));
    if (!v) {
      if (fallback <= 0) bad(k, "a positive integer", "none");
      return fallback;
    }
    if (*v == 0 || *v > INT32_MAX) bad(k, message("an integer in [1, ", INT32_MAX, "]"), std::to_string(*v));
    return static_cast<int64_t>(*v);
  }
  double number(std::string_view k, double fallback) const { return f_.get_float(key(k)).value_or(fallback); }

 private:
  const GgufFile& f_;
  std::string arch_;
};

// ggml dims of a tensor that must be there.
const GgufTensorInfo& required(const GgufFile& f, const std::string& name) {
  const GgufTensorInfo* t = f.find(name);
  if (!t) fail(message("gguf ", f.source()), "tensors", message("a tensor ", quote(name)), "none");
  return *t;
}

// An "output" tensor distinct from token_embd (the GPT-2 converter writes a tied head out again).
bool distinct_head(const GgufFile& f) {
  const GgufTensorInfo* out = f.find("output.weight");
  if (!out) return false;
  const GgufTensorInfo& embd = required(f, "token_embd.weight");
  const auto a = f.data(*out), b = f.data(embd);
  return out->type != embd.type || out->dims != embd.dims || std::memcmp(a.data(), b.data(), a.size()) != 0;
}

// tokenizer.ggml.<key> as a token id of the vocabulary, or -1.
int32_t token_id(const GgufFile& f, const char* key, int64_t vocab, int32_t fallback) {
  const std::optional<uint64_t> v = f.get_uint(message("tokenizer.ggml.", key));
  const uint64_t id = v ? *v : static_cast<uint64_t>(fallback < 0 ? vocab : fallback);
  return id < static_cast<uint64_t>(vocab) ? static_cast<int32_t>(id) : -1;
}

}  // namespace

ModelConfig GgufModelFile::config_of(const GgufFile& f) {
  const std::string fn = message("gguf ", f.source());
  const std::optional<std::string> arch = f.get_string("general.architecture");
  const FamilyInfo* family = arch ? family_by_gguf_arch(*arch) : nullptr;
  if (!family)
    fail(fn, "metadata 'general.architecture'", message("one of ", gguf_families(), " (the architectures mhsa loads from GGUF)"),
         arch ? quote(*arch) : "none");
  const Hyper h(f, *arch);
  ModelConfig c;
  c.family = family->family;
  c.architecture = family->architecture;
  family->block.apply(c);
  c.hidden_size = h.count("embedding_length");
  c.num_layers = h.count("block_count");
  // Every layer has tensors: more layers than tensors is a hostile count (bounded before sizing).
  if (static_cast<uint64_t>(c.num_layers) > f.tensors().size())
    h.bad("block_count", message("at most the ", f.tensors().size(), " tensors' worth of layers"), std::to_string(c.num_layers));
  c.num_heads = h.count("attention.head_count");
  c.max_positions = h.count("context_length");
  const GgufTensorInfo& embd = required(f, "token_embd.weight");
  if (embd.dims.size() != 2 || embd.dims[0] != c.hidden_size)
    fail(fn, "tensor 'token_embd.weight' dims", message("[", c.hidden_size, " (embedding_length), vocab]"),
         shape_string(ConstTensorView(nullptr, embd.dims)));
  c.vocab_size = embd.dims[1];
  if (const std::optional<uint64_t> v = f.get_uint(h.key("vocab_size")); v && *v != static_cast<uint64_t>(c.vocab_size))
    h.bad("vocab_size", message(c.vocab_size, " (token_embd's rows)"), std::to_string(*v));
  if (family->hf_names == HfNames::gpt2) {
    c.num_kv_heads = c.num_heads;
    if (c.hidden_size % c.num_heads != 0)
      h.bad("attention.head_count", message("a divisor of embedding_length = ", c.hidden_size), std::to_string(c.num_heads));
    c.head_dim = c.hidden_size / c.num_heads;
    c.intermediate_size = h.count("feed_forward_length", 4 * c.hidden_size);
    c.norm = NormKind::layer_norm;
    c.norm_eps = h.number("attention.layer_norm_epsilon", 1e-5);
    c.positions = PositionKind::learned;
    c.mlp = MlpKind::gelu;
    c.qkv_bias = c.o_bias = c.mlp_bias = true;
    c.bos_token_id = token_id(f, "bos_token_id", c.vocab_size, 50256);
    const int32_t eos = token_id(f, "eos_token_id", c.vocab_size, 50256);
    if (eos >= 0) c.eos_token_ids = {eos};
  } else {
    c.num_kv_heads = h.count("attention.head_count_kv", c.num_heads);
    if (c.num_heads % c.num_kv_heads != 0)
      h.bad("attention.head_count_kv", message("a divisor of head_count = ", c.num_heads), std::to_string(c.num_kv_heads));
    if (!f.value(h.key("attention.key_length")) && c.hidden_size % c.num_heads != 0)
      h.bad("attention.head_count", message("a divisor of embedding_length = ", c.hidden_size), std::to_string(c.num_heads));
    c.head_dim = h.count("attention.key_length", c.hidden_size / c.num_heads);
    if (const int64_t dv = h.count("attention.value_length", c.head_dim); dv != c.head_dim)
      h.bad("attention.value_length", message(c.head_dim, " (key_length)"), std::to_string(dv));
    c.intermediate_size = h.count("feed_forward_length");
    c.norm = NormKind::rms_norm;
    c.norm_eps = h.number("attention.layer_norm_rms_epsilon", 1e-5);
    c.positions = PositionKind::rotary;
    c.rope_theta = h.number("rope.freq_base", 10000.0);
    c.rotary_dim = c.head_dim;
    if (const int64_t r = h.count("rope.dimension_count", c.head_dim); r != c.head_dim)
      h.bad("rope.dimension_count", message(c.head_dim, " (whole heads rotated; partial rotary is not supported)"),
            std::to_string(r));
    const std::string scaling = f.get_string(h.key("rope.scaling.type")).value_or("none");
    if (scaling == "linear") {
      c.rope_scaling.kind = RopeScalingKind::linear;
      c.rope_scaling.factor = h.number("rope.scaling.factor", 1.0);
    } else if (scaling != "none") {
      h.bad("rope.scaling.type", "\"none\" or \"linear\" (other RoPE scalings are not supported)", quote(scaling));
    }
    if (const GgufTensorInfo* t = f.find("rope_freqs.weight")) {  // the converter's form of llama3 scaling
      if (c.rope_scaling.kind != RopeScalingKind::none)
        h.bad("rope.scaling.type", "none beside a rope_freqs tensor", quote(scaling));
      if (t->dims != std::vector<int64_t>{c.rotary_dim / 2})
        fail(fn, "tensor 'rope_freqs.weight' dims", message("[", c.rotary_dim / 2, "] (rope.dimension_count / 2)"),
             shape_string(ConstTensorView(nullptr, t->dims)));
      const Tensor factors = f.load(*t);
      c.rope_scaling.kind = RopeScalingKind::factors;
      c.rope_scaling.factors.assign(factors.data(), factors.data() + factors.numel());  // checked by validate
    }
    c.mlp = MlpKind::swiglu;
    c.qkv_bias = f.find("blk.0.attn_q.bias") != nullptr;
    c.o_bias = f.find("blk.0.attn_output.bias") != nullptr;
    c.mlp_bias = f.find("blk.0.ffn_gate.bias") != nullptr;
    c.bos_token_id = token_id(f, "bos_token_id", c.vocab_size, 1);
    const int32_t eos = token_id(f, "eos_token_id", c.vocab_size, 2);
    if (eos >= 0) c.eos_token_ids = {eos};
  }
  c.tie_word_embeddings = !distinct_head(f);
  // A window on every layer (llama.cpp's n_swa, as its converter writes Phi-3's sliding_window).
  const int64_t window = f.get_uint(h.key("attention.sliding_window")) ? h.count("attention.sliding_window") : 0;
  c.window_left.assign(static_cast<size_t>(c.num_layers), window - 1);
  c.validate(fn);
  return c;
}

GgufModelFile GgufModelFile::open(const std::filesystem::path& path) {
  GgufModelFile m(GgufFile::open(path));
  m.config_ = config_of(m.file_);
  return m;
}

bool GgufModelFile::untied_head() const { return !config_.tie_word_embeddings; }

const GgufTensorInfo& GgufModelFile::checked(const GgufName& g, const std::string& name,
                                             const std::vector<int64_t>& shape) const {
  const GgufTensorInfo& t = required(file_, g.name);
  std::vector<int64_t> stored = shape;
  if (g.rows > 0) stored[0] = g.total_rows;  // the fused tensor this parameter is rows of
  if (g.layout == GgufLayout::transposed) std::reverse(stored.begin(), stored.end());
  if (t.shape() != stored)
    fail(message("gguf ", file_.source()), message("tensor ", quote(g.name), " (", name, ")"),
         "shape " + shape_string(ConstTensorView(nullptr, stored)), shape_string(ConstTensorView(nullptr, t.shape())));
  return t;
}

std::optional<nn::Q4Matrix> GgufModelFile::load_q4_k(const std::string& name, const std::vector<int64_t>& shape) const {
  const GgufName g = gguf_name(config_, name);
  const GgufTensorInfo& t = checked(g, name, shape);
  if (t.type != static_cast<uint32_t>(GgufType::q4_k) || t.dims.size() != 2) return std::nullopt;
  nn::Q4Matrix m;
  m.rows = g.rows > 0 ? g.rows : t.dims[1];  // the file's [out, in] (GPT-2's matrices are stored transposed: [out, in] too)
  m.cols = t.dims[0];
  const int64_t per_row = m.blocks_per_row();
  m.data.resize(static_cast<size_t>(m.rows * per_row));  // the file's bytes: the product is already checked
  const uint8_t* src = file_.data(t).data();
  const size_t row_bytes = static_cast<size_t>(per_row) * sizeof(kernels::BlockQ4_K);
  // Llama's q/k rows back from ggml's interleaved pairs to rotate_half order (as permute_rows).
  const int64_t D = g.layout == GgufLayout::permuted ? m.rows / g.heads : 0;
  for (int64_t r = 0; r < m.rows; ++r) {
    int64_t from = g.row_begin + r;
    if (D > 0) {
      const int64_t h = r / D, within = r % D, half = D / 2;
      from = h * D + 2 * (within % half) + within / half;
    }
    std::memcpy(m.row(r), src + static_cast<size_t>(from) * row_bytes, row_bytes);
  }
  for (const kernels::BlockQ4_K& b : m.data)
    if ((b.d & 0x7c00) == 0x7c00 || (b.dmin & 0x7c00) == 0x7c00)
      fail(message("gguf ", file_.source()), message("tensor ", quote(g.name), " (", name, ")"),
           "finite Q4_K scales", "an f16 infinity or NaN");
  kernels::interleave_q4_k(m.data.data(), static_cast<int64_t>(m.data.size()));  // the kernels' order
  return m;
}

Tensor GgufModelFile::load(const std::string& name, const std::vector<int64_t>& shape) const {
  const GgufName g = gguf_name(config_, name);
  const GgufTensorInfo& t = checked(g, name, shape);
  Tensor x = file_.load(t);
  if (g.rows > 0) {  // this parameter's rows of a fused tensor
    Tensor part(shape);
    const int64_t row = x.numel() / g.total_rows;
    std::copy_n(x.data() + g.row_begin * row, g.rows * row, part.data());
    x = std::move(part);
  }
  if (g.layout == GgufLayout::transposed) return transpose_2d(x);
  if (g.layout == GgufLayout::permuted) return permute_rows(x, g.heads, false);
  return x;
}

}  // namespace mhsa::detail
