// mhsa/mha.h — the MultiHeadAttention layer: projections, heads, attention, output projection.
//
// Weights are in the GPT-2 checkpoint layout (Hugging Face Conv1D, input-major), so a real
// checkpoint loads without transposes:
//   w_qkv [C, C + 2·Ckv], b_qkv [C + 2·Ckv]   columns: queries [0, C), keys [C, C+Ckv), values after
//   w_o   [C, C],         b_o   [C]
// with C = embed_dim, H = num_heads, D = C / H, Hkv = num_kv_heads (grouped-query attention when
// Hkv < H) and Ckv = Hkv·D. Cross-attention uses the same weights as PyTorch does: the query
// columns for x and the key/value columns for the encoder memory, whose K/V are projected once
// into a KVCache and reused for every decoding step.
// Not a transformer block: no LayerNorm, MLP or residual here (see model/).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>
#include <string_view>

#include "mhsa/attention.h"
#include "mhsa/kv_cache.h"
#include "mhsa/tensor.h"

namespace mhsa {

struct MhaTape;

struct MhaOptions {
  bool causal = false;                  // bottom-right aligned, as in scaled_dot_product_attention
  CausalAlignment causal_alignment = CausalAlignment::bottom_right;  // as AttentionOptions
  AttentionWindow window;               // sliding window, as AttentionOptions (default: none)
  std::optional<float> softcap;         // score soft-capping, as AttentionOptions
  std::span<const int64_t> kv_lengths;  // optional [B]: valid keys of x (self) or of the memory
  ConstTensorView attn_mask;            // optional additive [T, S] or [B|1, H|1, T, S]
  Tensor* weights = nullptr;            // if set, receives the probabilities [B, H, T, S]
  Backend backend = Backend::automatic;
  MhaTape* tape = nullptr;              // if set, the forward records what backward needs here
};

// What one forward recorded for MultiHeadAttention::backward: inputs, projections, the attention
// output and its lse (the probabilities are recomputed, never stored), and the options.
struct MhaTape {
  bool cross = false;
  Tensor x;       // [B, T, C]
  Tensor memory;  // [B, S, C], cross-attention only
  Tensor qkv;     // self: [B, T, C + 2·Ckv]; cross: the queries [B, T, C]
  Tensor kv;      // cross: [B, S, 2·Ckv]
  Tensor ctx;     // [B, T, C] the heads concatenated
  Tensor lse;     // [B, H, T]
  bool causal = false;
  CausalAlignment causal_alignment = CausalAlignment::bottom_right;
  AttentionWindow window;
  std::optional<float> softcap;
  std::vector<int64_t> kv_lengths;
  Tensor attn_mask;  // a copy, in the shape given
};

// Gradients of the parameters, shaped like them (undefined biases for a layer without bias).
struct MhaGradients {
  Tensor w_qkv, b_qkv, w_o, b_o;
};
struct MhaInputGradients {
  Tensor dx;       // [B, T, C]
  Tensor dmemory;  // [B, S, C], cross-attention only
};

class MultiHeadAttention {
 public:
  // num_kv_heads = 0 means num_heads. Weights get init_parameters(seed).
  MultiHeadAttention(int64_t embed_dim, int64_t num_heads, int64_t num_kv_heads = 0,
                     bool bias = true, uint64_t seed = 0);

  int64_t embed_dim() const { return embed_dim_; }
  int64_t num_heads() const { return num_heads_; }
  int64_t num_kv_heads() const { return num_kv_heads_; }
  int64_t head_dim() const { return embed_dim_ / num_heads_; }
  int64_t kv_dim() const { return num_kv_heads_ * head_dim(); }  // Ckv
  bool has_bias() const { return b_qkv_.defined(); }

  // Xavier-uniform w_qkv, uniform(±1/√C) w_o, zero biases, from a seeded generator.
  void init_parameters(uint64_t seed);
  // Parameters by name: "w_qkv", "b_qkv", "w_o", "b_o".
  Tensor& parameter(std::string_view name);
  const Tensor& parameter(std::string_view name) const;
  // Copies `value` (any strides) into the named parameter after checking its shape.
  void set_parameter(std::string_view name, ConstTensorView value);

  // Self-attention: x [B, T, C] -> y [B, T, C].
  Tensor forward(ConstTensorView x, const MhaOptions& options = {}) const;
  // Cross-attention: queries from x [B, T, C], keys and values from a projected memory.
  Tensor forward(ConstTensorView x, const KVCache& memory, const MhaOptions& options = {}) const;
  // Cross-attention over a memory given as an array [B, S, C] (projected in this call): the form
  // to use for training, since backward then also returns the memory's gradient.
  Tensor forward(ConstTensorView x, ConstTensorView memory, const MhaOptions& options) const;
  // Projects an encoder memory [B, S, C] to its keys and values, once.
  KVCache project_memory(ConstTensorView memory) const;

  // Incremental decoding: an empty cache for `batch` sequences of up to `max_tokens` tokens.
  KVCache new_cache(int64_t batch, int64_t max_tokens) const;
  // Appends the T new tokens x [B, T, C] to the cache and attends causally over everything cached;
  // y [B, T, C] equals the matching rows of a causal forward over the whole sequence. On error the
  // cache is unchanged.
  Tensor step(ConstTensorView x, KVCache& cache) const;

  // Gradients from dy [B, T, C] and the tape of the forward that produced y: adds the parameters'
  // gradients into `grads` (accumulating, as PyTorch does; the GEMM adds the weight products into
  // them, so two calls give g1 + g2 to within float32 rounding) and returns dx (and dmemory).
  MhaInputGradients backward(const MhaTape& tape, ConstTensorView dy, MhaGradients& grads) const;
  // Zero gradients shaped like the parameters.
  MhaGradients zero_gradients() const;

 private:
  Tensor attend(ConstTensorView q, ConstTensorView k, ConstTensorView v, const AttentionOptions& options,
                Tensor* weights, MhaTape* tape) const;

  int64_t embed_dim_, num_heads_, num_kv_heads_;
  Tensor w_qkv_;  // [C, C + 2·Ckv]
  Tensor b_qkv_;  // [C + 2·Ckv], undefined without bias
  Tensor w_o_;    // [C, C]
  Tensor b_o_;    // [C], undefined without bias
};

}  // namespace mhsa
