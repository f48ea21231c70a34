// mhsa/attention.h — scaled dot-product attention, the kernel-level API.
//
// The attention contract (see docs/architecture.md), which every backend implements exactly:
//   q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv]  ->  out [B, Hq, Tq, Dv], lse [B, Hq, Tq]
//   - grouped heads: Hq % Hkv == 0, query head h reads key/value head h / (Hq / Hkv);
//   - scale: 1/sqrt(D) unless given;
//   - causal mask aligned bottom-right: query i sees keys j <= i + (Tk - Tq);
//   - additive float mask [Tq, Tk], [Hq|1, Tq, Tk] or [B|1, Hq|1, Tq, Tk] (broadcast over B and H);
//   - key padding as per-batch valid lengths: query rows of batch b see keys j < kv_lengths[b];
//   - a row whose keys are all masked gives out = 0 and lse = -inf, never NaN;
//   - lse = max + log(sum): the log-sum-exp of each row's scaled, masked scores.
// Views may have any strides; out and lse must not overlap the inputs or themselves.
// This header is not the layer (see mha.h) and does no projections.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "mhsa/tensor.h"

namespace mhsa {

enum class Backend {
  automatic,  // the fastest kernel that takes the shape
  reference,  // the plain *_ref kernels: scalar, float64 accumulation; the oracle
};

struct AttentionOptions {
  bool causal = false;
  std::optional<float> scale;           // default 1/sqrt(D)
  ConstTensorView attn_mask;            // optional additive mask; -inf removes a key
  std::span<const int64_t> kv_lengths;  // optional [B]: keys j >= kv_lengths[b] are masked
  Backend backend = Backend::automatic;
};

// Writes out [B, Hq, Tq, Dv] and, if lse is defined, lse [B, Hq, Tq].
void scaled_dot_product_attention(ConstTensorView q, ConstTensorView k, ConstTensorView v,
                                  TensorView out, const AttentionOptions& options = {},
                                  TensorView lse = {});

struct AttentionResult {
  Tensor out;  // [B, Hq, Tq, Dv]
  Tensor lse;  // [B, Hq, Tq]
};
AttentionResult scaled_dot_product_attention(ConstTensorView q, ConstTensorView k,
                                             ConstTensorView v,
                                             const AttentionOptions& options = {});

// Gradients of scaled_dot_product_attention, FlashAttention-style: from dout [B, Hq, Tq, Dv] and
// the forward's inputs, out and lse, the probabilities are recomputed block by block (memory
// O(T)), and dq [B, Hq, Tq, D], dk [B, Hkv, Tk, D], dv [B, Hkv, Tk, Dv] written; dk and dv sum over
// the query heads of a group. `options` must be the forward's. Rows whose keys were all masked get
// zero gradients. Bitwise identical for any thread count.
void scaled_dot_product_attention_backward(ConstTensorView dout, ConstTensorView q, ConstTensorView k,
                                           ConstTensorView v, ConstTensorView out, ConstTensorView lse,
                                           TensorView dq, TensorView dk, TensorView dv,
                                           const AttentionOptions& options = {});
struct AttentionGrads {
  Tensor dq;  // [B, Hq, Tq, D]
  Tensor dk;  // [B, Hkv, Tk, D]
  Tensor dv;  // [B, Hkv, Tk, Dv]
};
AttentionGrads scaled_dot_product_attention_backward(ConstTensorView dout, ConstTensorView q, ConstTensorView k,
                                                     ConstTensorView v, ConstTensorView out, ConstTensorView lse,
                                                     const AttentionOptions& options = {});

// The exact softmax matrix P = exp(scaled masked scores - lse) for the chosen query heads
// (all Hq heads when `heads` is empty), written to probs [B, heads, Tq, Tk]. `lse` [B, Hq, Tq]
// comes from the forward pass; if it is not defined it is computed here. Masked entries are 0.
void attention_probabilities(ConstTensorView q, ConstTensorView k, ConstTensorView lse,
                             TensorView probs, const AttentionOptions& options = {},
                             std::span<const int64_t> heads = {});
Tensor attention_probabilities(ConstTensorView q, ConstTensorView k, ConstTensorView lse,
                               const AttentionOptions& options = {},
                               std::span<const int64_t> heads = {});

// Forward FLOPs as docs/architecture.md counts them: 2·B·Hq·Tq·Tk·(D + Dv) (= 4·B·Hq·Tq·Tk·D when Dv = D),
// half of that for causal attention with Tq = Tk.
double attention_flops(int64_t B, int64_t Hq, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv,
                       bool causal);

}  // namespace mhsa
