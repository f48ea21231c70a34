// model/gpt2.cpp — GPT-2 (see mhsa/gpt2.h): loading a Hugging Face directory (its config.json in
// gpt2_config.cpp), the forward pass over a KV cache, and generation. Attention is
// MultiHeadAttention::step; LayerNorm, GELU and the output projection are per-ISA kernels; every
// matrix product is the library's GEMM.
#include "mhsa/gpt2.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "core/check.h"
#include "io/checkpoint_dir.h"
#include "kernels/dispatch.h"
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

// splitmix64: a fast, well-mixed stream for filling random weights.
uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Zero-mean values with standard deviation `std` (uniform, so √3·std wide): cheap and enough for
// benchmarks and tests, which only need GPT-2-like magnitudes.
Tensor random_tensor(std::vector<int64_t> dims, float std, uint64_t& state) {
  Tensor t(std::move(dims));
  const float a = std * std::sqrt(3.0f);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data()[i] = a * (static_cast<float>(splitmix(state) >> 40) * 0x1.0p-23f - 1.0f);
  return t;
}

Tensor filled(std::vector<int64_t> dims, float value) {
  Tensor t(std::move(dims));
  std::fill(t.data(), t.data() + t.numel(), value);
  return t;
}

void add_into(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace

// ---- Gpt2Cache -------------------------------------------------------------------------------

void Gpt2Cache::reset() {
  for (KVCache& k : layers_) k.reset();
}

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
  return m;
}

Gpt2 Gpt2::random(const Gpt2Config& config, uint64_t seed) {
  config.validate("Gpt2::random");
  Gpt2 m;
  m.config_ = config;
  const int64_t C = config.n_embd, V = config.vocab_size, F = config.mlp_dim();
  uint64_t s = seed;
  m.wte_ = random_tensor({V, C}, 0.02f, s);
  m.wpe_ = random_tensor({config.n_positions, C}, 0.01f, s);
  m.lnf_g_ = filled({C}, 1.0f);
  m.lnf_b_ = filled({C}, 0.0f);
  for (int64_t l = 0; l < config.n_layer; ++l) {
    Block b{filled({C}, 1.0f), filled({C}, 0.0f), filled({C}, 1.0f), filled({C}, 0.0f),
            MultiHeadAttention(C, config.n_head), random_tensor({C, F}, 0.02f, s), filled({F}, 0.0f),
            random_tensor({F, C}, 0.02f, s), filled({C}, 0.0f)};
    b.attn.set_parameter("w_qkv", random_tensor({C, 3 * C}, 0.02f, s).view());
    b.attn.set_parameter("w_o", random_tensor({C, C}, 0.02f, s).view());
    m.blocks_.push_back(std::move(b));
  }
  return m;
}

// ---- forward ---------------------------------------------------------------------------------

Gpt2Cache Gpt2::new_cache(int64_t batch, int64_t max_tokens) const {
  constexpr std::string_view fn = "Gpt2::new_cache";
  if (batch <= 0) fail(fn, "batch", "a count > 0", std::to_string(batch));
  if (max_tokens <= 0 || max_tokens > config_.n_positions)
    fail(fn, "max_tokens", message("a count in [1, ", config_.n_positions, "] (n_positions, the context length)"),
         std::to_string(max_tokens));
  Gpt2Cache cache;
  for (const Block& b : blocks_) cache.layers_.push_back(b.attn.new_cache(batch, max_tokens));
  return cache;
}

Tensor Gpt2::forward(std::span<const int32_t> ids, int64_t B, int64_t T, std::vector<Tensor>* attention) const {
  if (T > config_.n_positions)
    fail("Gpt2::forward", "T", message("at most n_positions = ", config_.n_positions, " tokens"), std::to_string(T));
  if (B <= 0 || T <= 0)
    fail("Gpt2::forward", "ids", "a non-empty batch [B, T]", message("[", B, ", ", T, "]"));
  Gpt2Cache cache = new_cache(B, T);
  return run(ids, B, T, &cache, false, attention);
}

Tensor Gpt2::extend(Gpt2Cache& cache, std::span<const int32_t> ids, int64_t B, int64_t n, bool last_only) const {
  return run(ids, B, n, &cache, last_only);
}

Tensor Gpt2::run(std::span<const int32_t> ids, int64_t B, int64_t n, Gpt2Cache* cache, bool last_only,
                 std::vector<Tensor>* attention) const {
  constexpr std::string_view fn = "Gpt2::extend";
  const int64_t C = config_.n_embd, V = config_.vocab_size, F = config_.mlp_dim();
  if (cache->layers_.size() != blocks_.size())
    fail(fn, "cache", message("a cache of this model (", blocks_.size(), " layers)"),
         message(cache->layers_.size(), " layers"));
  if (B != cache->batch()) fail(fn, "B", message(cache->batch(), " (the cache's batch)"), std::to_string(B));
  if (n <= 0) fail(fn, "n", "at least one token", std::to_string(n));
  const int64_t pos0 = cache->length();
  if (n > cache->capacity() - pos0)
    fail(fn, "n", message("at most ", cache->capacity() - pos0, " more tokens (cache holds ", pos0, " of ",
                          cache->capacity(), "; the model's context is ", config_.n_positions, ")"),
         std::to_string(n));
  if (static_cast<int64_t>(ids.size()) != B * n)  // B and n are at most the cache's batch and capacity: no overflow
    fail(fn, "ids", message(B * n, " ids (B·n = ", B, "·", n, ")"), std::to_string(ids.size()));
  for (int64_t i = 0; i < B * n; ++i)
    if (ids[static_cast<size_t>(i)] < 0 || ids[static_cast<size_t>(i)] >= V)
      fail(fn, message("ids[", i / n, ", ", i % n, "]"), message("a token id in [0, ", V, ")"),
           std::to_string(ids[static_cast<size_t>(i)]));

  const kernels::KernelTable& k = kernels::kernels();
  const int64_t rows = B * n;
  Tensor x({B, n, C}), h({B, n, C}), u({rows, F}), y({rows, C});
  for (int64_t r = 0; r < rows; ++r) {  // token + position embeddings
    const float* te = wte_.data() + ids[static_cast<size_t>(r)] * C;
    const float* pe = wpe_.data() + (pos0 + r % n) * C;
    float* xr = x.data() + r * C;
    for (int64_t c = 0; c < C; ++c) xr[c] = te[c] + pe[c];
  }
  const float eps = config_.layer_norm_epsilon;
  if (attention) attention->assign(blocks_.size(), Tensor());
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const Block& b = blocks_[l];
    k.layer_norm(rows, C, x.data(), C, b.ln1_g.data(), b.ln1_b.data(), eps, h.data(), C);
    Tensor a;
    if (attention && pos0 == 0) {  // the same attention, also returning its probabilities
      MhaOptions opt;
      opt.causal = true;
      opt.weights = &(*attention)[l];
      a = b.attn.forward(h.view(), opt);
    } else {
      a = b.attn.step(h.view(), cache->layers_[l]);
    }
    add_into(x.data(), a.data(), rows * C);
    k.layer_norm(rows, C, x.data(), C, b.ln2_g.data(), b.ln2_b.data(), eps, h.data(), C);
    k.gemm(rows, F, C, h.data(), C, b.fc_w.data(), F, b.fc_b.data(), u.data(), F);
    k.gelu_tanh(rows * F, u.data());
    k.gemm(rows, C, F, u.data(), F, b.proj_w.data(), C, b.proj_b.data(), y.data(), C);
    add_into(x.data(), y.data(), rows * C);
  }
  // Final LayerNorm and logits, for every row or only each sequence's last.
  const int64_t out_rows = last_only ? B : rows;
  const int64_t ldx = last_only ? n * C : C;
  const float* xs = x.data() + (last_only ? (n - 1) * C : 0);
  k.layer_norm(out_rows, C, xs, ldx, lnf_g_.data(), lnf_b_.data(), eps, h.data(), C);
  Tensor logits({B, last_only ? 1 : n, V});
  const Tensor& w = lm_head_.defined() ? lm_head_ : wte_;  // [V, C]
  constexpr int64_t kStreamRows = 8;  // up to here the head is a stream over w; beyond, a GEMM
  if (out_rows <= kStreamRows) {
    k.matmul_bt(out_rows, V, C, h.data(), C, w.data(), C, logits.data(), V);
  } else {
    // Transpose w a block of vocabulary at a time ([C, kChunk], L2-sized) and multiply.
    constexpr int64_t kChunk = 512;
    Tensor wt({C, kChunk});
    for (int64_t v0 = 0; v0 < V; v0 += kChunk) {
      const int64_t cols = std::min(kChunk, V - v0);
      for (int64_t v = 0; v < cols; ++v)
        for (int64_t c = 0; c < C; ++c) wt.data()[c * kChunk + v] = w.data()[(v0 + v) * C + c];
      k.gemm(out_rows, cols, C, h.data(), C, wt.data(), kChunk, nullptr, logits.data() + v0, V);
    }
  }
  return logits;
}

// ---- generation ------------------------------------------------------------------------------

int32_t Gpt2::sample(std::span<float> logits, std::span<const int32_t> history, const GenerationOptions& o,
                     uint64_t& rng_state) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (o.repetition_penalty != 1.0f) {  // each distinct earlier token once, as Hugging Face does
    std::vector<int32_t> seen(history.begin(), history.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) {
      if (t < 0 || t >= V) continue;
      float& l = logits[static_cast<size_t>(t)];
      l = l > 0 ? l / o.repetition_penalty : l * o.repetition_penalty;
    }
  }
  if (o.temperature <= 0.0f)  // greedy; the first of equal maxima, like torch.argmax
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // Candidates sorted by logit, cut by top-k, then by top-p on the softmax of what remains.
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  const auto by_logit = [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
           (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  };
  size_t keep = order.size();
  if (o.top_k > 0 && o.top_k < V) {
    keep = static_cast<size_t>(o.top_k);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(), by_logit);
  } else {
    std::sort(order.begin(), order.end(), by_logit);
  }
  const float top = logits[static_cast<size_t>(order[0])];
  std::vector<double> p(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    p[i] = std::exp((static_cast<double>(logits[static_cast<size_t>(order[i])]) - top) / o.temperature);
    total += p[i];
  }
  if (o.top_p < 1.0f) {  // the smallest head of the sorted list whose mass reaches top_p
    double mass = 0;
    size_t cut = 0;
    while (cut < keep && mass < o.top_p * total) mass += p[cut++];
    keep = std::max<size_t>(cut, 1);
    total = std::accumulate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  }
  const double u = static_cast<double>(splitmix(rng_state) >> 11) * 0x1.0p-53 * total;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return order[i];
  }
  return order[keep - 1];
}

std::vector<std::vector<int32_t>> Gpt2::generate(std::span<const int32_t> prompts, int64_t B, int64_t T,
                                                 const GenerationOptions& o,
                                                 const std::function<bool(int64_t, std::span<const int32_t>)>& on_token,
                                                 GenerationStats* stats) const {
  constexpr std::string_view fn = "Gpt2::generate";
  if (B <= 0 || T <= 0) fail(fn, "prompts", "a non-empty batch [B, T] of token ids", message("[", B, ", ", T, "]"));
  if (o.max_new_tokens < 0) fail(fn, "max_new_tokens", "a count >= 0", std::to_string(o.max_new_tokens));
  if (o.max_new_tokens > config_.n_positions - T)  // not T + max_new_tokens: that could overflow
    fail(fn, "max_new_tokens",
         message("at most ", std::max<int64_t>(0, config_.n_positions - T), " (the context is ", config_.n_positions,
                 " tokens and the prompt has ", T, ")"),
         std::to_string(o.max_new_tokens));
  if (!(o.temperature >= 0.0f) || !std::isfinite(o.temperature))
    fail(fn, "temperature", "a finite value >= 0 (0 is greedy)", std::to_string(o.temperature));
  if (o.top_k < 0) fail(fn, "top_k", "a count >= 0 (0 keeps every token)", std::to_string(o.top_k));
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f)) fail(fn, "top_p", "a value in (0, 1]", std::to_string(o.top_p));
  if (!(o.repetition_penalty > 0.0f) || !std::isfinite(o.repetition_penalty))
    fail(fn, "repetition_penalty", "a finite value > 0 (1 is none)", std::to_string(o.repetition_penalty));
  if (static_cast<int64_t>(prompts.size()) / T != B || static_cast<int64_t>(prompts.size()) % T != 0)  // B·T could overflow
    fail(fn, "prompts", message(B, "·", T, " ids (B·T)"), std::to_string(prompts.size()));

  using clock = std::chrono::steady_clock;
  GenerationStats st;
  std::vector<std::vector<int32_t>> out(static_cast<size_t>(B));
  if (o.max_new_tokens == 0) {
    if (stats) *stats = st;
    return out;
  }
  Gpt2Cache cache = new_cache(B, T + o.max_new_tokens);
  std::vector<std::vector<int32_t>> history(static_cast<size_t>(B));
  std::vector<uint64_t> rng(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    history[static_cast<size_t>(b)].assign(prompts.begin() + b * T, prompts.begin() + (b + 1) * T);
    rng[static_cast<size_t>(b)] = o.seed * 0x2545F4914F6CDD1Dull + static_cast<uint64_t>(b);
  }
  auto t0 = clock::now();
  Tensor logits = run(prompts, B, T, &cache, true);
  st.prefill_tokens = B * T;
  st.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  t0 = clock::now();
  const int64_t V = config_.vocab_size;
  std::vector<char> done(static_cast<size_t>(B), 0);
  std::vector<int32_t> tokens(static_cast<size_t>(B));
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    for (int64_t b = 0; b < B; ++b) {
      const size_t i = static_cast<size_t>(b);
      if (done[i]) {
        tokens[i] = config_.eos_token_id;
        continue;
      }
      tokens[i] = sample({logits.data() + b * V, static_cast<size_t>(V)}, history[i], o, rng[i]);
      history[i].push_back(tokens[i]);
      out[i].push_back(tokens[i]);
      if (o.stop_at_eos && tokens[i] == config_.eos_token_id) done[i] = 1;
    }
    const bool go_on = !on_token || on_token(step, tokens);
    if (!go_on || std::all_of(done.begin(), done.end(), [](char d) { return d != 0; }) ||
        step + 1 == o.max_new_tokens)
      break;
    logits = run(tokens, B, 1, &cache, true);
    st.decode_tokens += B;
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  if (stats) *stats = st;
  return out;
}

}  // namespace mhsa
