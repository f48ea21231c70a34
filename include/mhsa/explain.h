// mhsa/explain.h — what the attention explorer (`mhsa explain`) shows about one prompt, computed
// from a model of any family (Model, or Gpt2): every head's attention probabilities, a few numbers that summarise each
// head, and the step-by-step trace of one head with the real numbers (embeddings, LayerNorm,
// Q, K, V, QKᵀ, scaling, causal mask, softmax, weighted sum of V, concatenation, projection).
//
// The probabilities are the model's own: its forward recomputes them exactly from the fast
// kernel's log-sum-exp. The trace runs the model's own block up to and through its layer, so its
// numbers are the ones the model computes, and gets its softmax from the reference path.
// Not the report: HTML, JSON and the terminal heatmap are the CLI's (apps/mhsa/explain_cmd.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "mhsa/gpt2.h"
#include "mhsa/model.h"
#include "mhsa/tensor.h"

namespace mhsa {

// Averages over the query rows i = 1 .. T−1 of one head's causal probabilities (row 0 can only
// attend to itself, so it says nothing about the head; a one-token prompt uses row 0).
struct HeadSummary {
  double entropy = 0;         // −Σ_j p_ij ln p_ij in nats: 0 is one key, ln(i+1) is uniform
  double first_token = 0;     // p_i0: attention to the first token (a common "no-op" sink)
  double previous_token = 0;  // p_i,i−1
  double self = 0;            // p_ii
};

// The summary of one head's probabilities [T, T] (any strides; masked entries 0).
HeadSummary summarize_head(ConstTensorView probs);

// One head of one layer on one prompt, step by step. T tokens, C channels, D = C / H.
struct HeadTrace {
  int64_t layer = 0, head = 0;
  Tensor token_embedding;     // [T, C] wte[ids] (times the family's embedding scale)
  Tensor position_embedding;  // [T, C] wpe[0 .. T); zeros for rotary positions (applied to q and k)
  Tensor x;                   // [T, C] the block's input: embeddings + positions, after `layer` blocks
  Tensor ln;                  // [T, C] ln_1(x) (the block's first norm)
  Tensor q, k, v;             // [T, D] this head's q and its group's k, v (after q/k norms and RoPE)
  Tensor scores;              // [T, T] q · kᵀ (every entry, the future included)
  Tensor scaled;              // [T, T] scores·scale (soft-capped where the family caps), −∞ where the causal
                              // mask (j > i) or the layer's window (j < i − left) removes a key
  Tensor probs;               // [T, T] the softmax of each row of `scaled` (reference path)
  Tensor head_out;            // [T, D] probs · v
  Tensor concat;              // [T, H·D] every head's output side by side; this head's at [head·D, (head+1)·D)
  Tensor out;                 // [T, C] concat · W_o + b_o: the attention's output (before a post-norm)
};

// Traces `head` of `layer` on ids [T]. Throws mhsa::Error for no ids, more than n_positions,
// an id outside the vocabulary, or a layer or head out of range.
HeadTrace trace_head(const Gpt2& model, std::span<const int32_t> ids, int64_t layer, int64_t head);
HeadTrace trace_head(const Model& model, std::span<const int32_t> ids, int64_t layer, int64_t head);

// Everything the explorer shows about one prompt.
struct Explanation {
  std::vector<int32_t> ids;                         // [T]
  std::vector<Tensor> attention;                    // per layer [1, H, T, T], from the model's forward
  std::vector<std::vector<HeadSummary>> summaries;  // [layer][head]
  HeadTrace trace;                                  // of the chosen layer and head
};

Explanation explain(const Gpt2& model, std::span<const int32_t> ids, int64_t layer, int64_t head);
Explanation explain(const Model& model, std::span<const int32_t> ids, int64_t layer, int64_t head);

}  // namespace mhsa
