// mhsa/gpt2.h — GPT-2 on the library's own attention: load a Hugging Face checkpoint directory,
// compute logits, generate with a KV cache.
//
// The model is GPT-2 exactly: learned token and position embeddings, n_layer pre-LayerNorm
// blocks x += attn(ln_1(x)); x += mlp(ln_2(x)) with a causal MultiHeadAttention and an MLP
// c_fc → GELU (tanh approximation) → c_proj, a final ln_f, and logits = ln_f(x)·wteᵀ (the output
// matrix is tied to the token embedding unless the file holds its own lm_head.weight).
// float32 throughout; F16/BF16 checkpoints are widened at load. Other families: mhsa::Model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mhsa/kv_cache.h"
#include "mhsa/mha.h"
#include "mhsa/model.h"
#include "mhsa/tensor.h"

namespace mhsa {

struct Gpt2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;  // the context length
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_inner = 0;  // the MLP width; 0 means 4·n_embd
  float layer_norm_epsilon = 1e-5f;
  int32_t eos_token_id = 50256;  // -1: none (a config whose eos is outside its vocabulary)

  int64_t mlp_dim() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
  // Reads a Hugging Face config.json; throws mhsa::Error naming the key for a missing or bad
  // value or an unsupported option (another activation, scale_attn_by_inverse_layer_idx, ...).
  static Gpt2Config load(const std::filesystem::path& config_json);
  // The same from config.json's text; `file` names it in errors.
  static Gpt2Config parse(std::string_view json_text, const std::string& file = "config.json");
  void validate(std::string_view fn) const;
};

// The keys and values of every layer for one batch of sequences: the state of a generation.
using Gpt2Cache = ModelCache;

// The weights of one transformer block (Hugging Face names in comments).
struct Gpt2Block {
  Tensor ln1_g, ln1_b, ln2_g, ln2_b;  // ln_1, ln_2 weight and bias [C]
  MultiHeadAttention attn;            // attn.c_attn (w_qkv [C, 3C]), attn.c_proj (w_o [C, C])
  Tensor fc_w, fc_b, proj_w, proj_b;  // mlp.c_fc [C, F], [F]; mlp.c_proj [F, C], [C]
};

class Gpt2 {
 public:
  // A directory with config.json and model.safetensors (Hugging Face layout; tensor names with or
  // without the "transformer." prefix; attn.bias / attn.masked_bias buffers ignored).
  static Gpt2 load(const std::filesystem::path& dir);
  // Random weights of a given shape (normal(0, 0.02) like GPT-2's init; LayerNorms at identity):
  // for benchmarks and tests.
  static Gpt2 random(const Gpt2Config& config, uint64_t seed);

  const Gpt2Config& config() const { return config_; }

  // Logits [B, T, V] of ids [B, T] (row-major), positions 0..T-1, no cache. With `attention`,
  // also every layer's attention probabilities [B, H, T, T], recomputed exactly from the fast
  // kernel's log-sum-exp (attention_probabilities), for the explainer.
  Tensor forward(std::span<const int32_t> ids, int64_t B, int64_t T,
                 std::vector<Tensor>* attention = nullptr) const;
  // The same model as the block sees it (family gpt2).
  const ModelConfig& model_config() const { return model_config_; }

  // An empty cache for `batch` sequences of up to `max_tokens` tokens (≤ n_positions).
  Gpt2Cache new_cache(int64_t batch, int64_t max_tokens) const;
  // Runs ids [B, n] at positions cache.length() .. + n − 1, appends them to the cache, and returns
  // the logits [B, n, V], or only the last position's [B, 1, V] when last_only (what generation
  // needs: the output matrix is then applied to one row per sequence). On error the cache is unchanged.
  Tensor extend(Gpt2Cache& cache, std::span<const int32_t> ids, int64_t B, int64_t n, bool last_only) const;

  // Continues each of the B prompts [B, T] by up to max_new_tokens tokens: one batched prefill,
  // then one token at a time through the cache. on_token(step, tokens[B]) sees each step's tokens
  // as they are made (a finished sequence repeats eos) and may return false to stop early.
  // Returns the new tokens per sequence (without the prompt; a sequence stops after its eos).
  // Throws mhsa::Error, before any work, if T + max_new_tokens exceeds n_positions.
  std::vector<std::vector<int32_t>> generate(
      std::span<const int32_t> prompts, int64_t B, int64_t T, const GenerationOptions& options,
      const std::function<bool(int64_t, std::span<const int32_t>)>& on_token = {},
      GenerationStats* stats = nullptr) const;

  // Picks the next token from one row of logits (modified in place by the penalty and
  // temperature) given the tokens so far: the sampling rule of generate(), exposed for tests
  // (prompt_tokens as Model::sample's).
  static int32_t sample(std::span<float> logits, std::span<const int32_t> history, const GenerationOptions& options,
                        uint64_t& rng_state, size_t prompt_tokens = 0);

  // The weights, read-only: embeddings wte [V, C] and wpe [n_positions, C], the blocks, ln_f, and
  // the output matrix [V, C] (wte unless the checkpoint has its own lm_head).
  const Tensor& wte() const { return wte_; }
  const Tensor& wpe() const { return wpe_; }
  const Gpt2Block& block(int64_t layer) const { return blocks_.at(static_cast<size_t>(layer)); }
  const Tensor& ln_f_weight() const { return lnf_g_; }
  const Tensor& ln_f_bias() const { return lnf_b_; }
  const Tensor& output_matrix() const { return lm_head_.defined() ? lm_head_ : wte_; }

  // ---- training ----
  // Every parameter with its Hugging Face name ("wte.weight", "h.0.attn.c_attn.weight", ...), in
  // a fixed order: what optimisers update and checkpoints store.
  std::vector<std::pair<std::string, Tensor*>> parameters();
  std::vector<std::pair<std::string, const Tensor*>> parameters() const;
  // Zero gradients shaped like parameters(), in the same order.
  std::vector<Tensor> zero_gradients() const;
  // Mean cross-entropy (nats per token) of predicting targets [B, T] from ids [B, T] (a target
  // of -1 is ignored); adds d(loss)/d(parameter) into grads (from zero_gradients()). The logits
  // are never materialised beyond one block of rows; results are the same for any thread count.
  double loss_and_gradients(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T,
                            std::vector<Tensor>& grads) const;
  // The same loss without gradients (for validation).
  double loss(std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T) const;

 private:
  friend struct ModelAccess;
  using Block = Gpt2Block;
  Gpt2() = default;
  std::vector<const Tensor*> parameter_list() const;  // parameters() without the names

  Gpt2Config config_;
  ModelConfig model_config_;
  Tensor wte_;     // [V, C], also the output matrix unless lm_head_ is defined
  Tensor wpe_;     // [n_positions, C]
  Tensor lm_head_; // [V, C] when the checkpoint has an untied one
  Tensor lnf_g_, lnf_b_;
  std::vector<Block> blocks_;
};

}  // namespace mhsa
