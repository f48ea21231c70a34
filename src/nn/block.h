// nn/block.h — the one transformer block of every family, and the decoder stack around it.
//
// A model is a ModelConfig plus a flat list of parameter tensors plus a Stack: which tensor of the
// list plays which part (indices, −1 for a part the family does not have). The block is
//   [h = norm₁(x)];  a = attention(h);  [a = post_norm₁(a)];  x += a
//   [h = norm₂(x)];  m = mlp(h);        [m = post_norm₂(m)];  x += m
// with the attention q/k/v projections fused (GPT-2's c_attn) or separate, an optional RMSNorm on
// q and k per head (Qwen3) or over their full width (OLMo-2), rotary or learned positions, grouped-query heads, the layer's window
// and soft-cap, and the MLP plain (GELU) or gated (SwiGLU, GeGLU). The same code runs inference
// (over a KV cache), training (a forward that records a tape, and the backward) and the explorer
// (probability taps, the traced layer's tape). Not public: model/ builds Stacks, train/ and
// explain/ use them.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "mhsa/attention.h"
#include "mhsa/kv_cache.h"
#include "mhsa/kv_pool.h"
#include "mhsa/model_config.h"
#include "mhsa/tensor.h"
#include "nn/linear.h"
#include "nn/ops.h"
#include "nn/rope.h"

namespace mhsa::nn {

struct LinearRef {
  int w = -1, b = -1;  // indices into the parameter list; b −1: no bias
  Layout layout = Layout::in_out;
};

struct LayerRefs {
  int norm1_w = -1, norm1_b = -1, post_norm1_w = -1;  // before attention (−1: none); after it
  LinearRef qkv;                                       // fused q | k | v (GPT-2), or
  LinearRef q, k, v;                                   // separate projections
  int q_norm = -1, k_norm = -1;                        // RMSNorm [D] per head, or [Hq·D], [Hkv·D]
  LinearRef o;
  int norm2_w = -1, norm2_b = -1, post_norm2_w = -1;   // before the MLP; after it
  LinearRef fc, proj;                                  // MlpKind::gelu
  LinearRef gate, up, down;                            // gated MLPs
};

struct Stack {
  const ModelConfig* config = nullptr;
  std::vector<const Tensor*> params;  // the model's parameters, in its parameters() order
  int embed = -1, pos = -1;           // token embedding [V, C]; learned positions [P, C] (or −1)
  std::vector<LayerRefs> layers;
  int final_norm_w = -1, final_norm_b = -1;
  int head = -1;                      // the output matrix [V, C]; −1: tied to the embedding
  Rope rope;                          // rotary positions (PositionKind::rotary)
  // 16-bit weights: indexed like params (empty for a float model); where set, that parameter is
  // this bfloat16 matrix [out, in] (linear layers read as Layout::out_in whatever their
  // LinearRef says). In a bf16 model its float tensor is empty, and no gradients are computed;
  // in bf16 training (half_parts) the float tensor is the master weight: the forward and the
  // input gradients read the bfloat16 copy, the parameter's gradient has the float tensor's shape.
  std::vector<const HalfMatrix*> half;
  // 8-bit weights likewise: indexed like params (empty unless the model is Q8_0); where set, that
  // parameter is this Q8_0 matrix [out, in]. A matrix whose rows are not whole blocks stays float.
  std::vector<const Q8Matrix*> q8;
  // 4-bit weights likewise (empty unless the model is Q4_K); a matrix whose rows are not whole
  // 256-weight blocks is in q8 (or float) instead.
  std::vector<const Q4Matrix*> q4;
  // The output matrix kept transposed and blocked (nn/blocked_matrix.h; the CLI's float GPT-2
  // models): indexed like params, set at the output matrix only; its float tensor is then empty,
  // and a tied embedding gathers its rows from it. Inference only.
  std::vector<const BlockedMatrix*> blocked;
  // LoRA adapters (mhsa/lora.h): indexed like params (empty: none), set at each linear weight
  // [out, in] that has one. Its A [r, in] and B [out, r] are parameters of the list too, and the
  // layer computes x·Wᵀ + scale·(x·Aᵀ)·Bᵀ (peft's LoRA). A gradient tensor left undefined
  // (zero_gradients' of a frozen weight) receives nothing: an adapter's training computes the
  // gradients of A and B and the input gradients through the frozen weights only.
  struct Lora {
    int a = -1, b = -1;
    float scale = 0;
  };
  std::vector<Lora> lora;

  const Tensor& p(int i) const { return *params[static_cast<size_t>(i)]; }
  const HalfMatrix* p16(int i) const { return half.empty() || i < 0 ? nullptr : half[static_cast<size_t>(i)]; }
  const Q8Matrix* p8(int i) const { return q8.empty() || i < 0 ? nullptr : q8[static_cast<size_t>(i)]; }
  const Q4Matrix* p4(int i) const { return q4.empty() || i < 0 ? nullptr : q4[static_cast<size_t>(i)]; }
  const BlockedMatrix* pb(int i) const { return blocked.empty() || i < 0 ? nullptr : blocked[static_cast<size_t>(i)]; }
  const Lora* adapter(int i) const {
    return lora.empty() || i < 0 || lora[static_cast<size_t>(i)].a < 0 ? nullptr : &lora[static_cast<size_t>(i)];
  }
  const float* data_or_null(int i) const { return i >= 0 ? params[static_cast<size_t>(i)]->data() : nullptr; }
  const Tensor& output_matrix() const { return p(head >= 0 ? head : embed); }
  const HalfMatrix* output_matrix16() const { return p16(head >= 0 ? head : embed); }
  const Q8Matrix* output_matrix8() const { return p8(head >= 0 ? head : embed); }
  const Q4Matrix* output_matrix4() const { return p4(head >= 0 ? head : embed); }
  const BlockedMatrix* output_matrix_blocked() const { return pb(head >= 0 ? head : embed); }
  NormSpec norm() const;
};

// The parameters a bfloat16 Stack keeps as bfloat16 (what Model::load with WeightType::bf16
// rounds, and bf16 training's copy): every linear weight, transposed into [out, in] where it is
// stored [in, out], and the token embedding and output matrix — every matrix but learned positions.
struct HalfPart {
  int index;        // into params
  bool transposed;  // stored [in, out] (GPT-2's Conv1D)
};
std::vector<HalfPart> half_parts(const Stack& s);

// What one block's training forward keeps for its backward (rows = B·T; N = (Hq + 2·Hkv)·D).
struct BlockTape {
  Tensor x_in;   // [rows, C] the block's input
  Tensor h1;     // [rows, C] norm₁(x_in): the attention's input
  Tensor qkv0;   // [rows, N] the projections before the q/k norms (qk_norm only)
  Tensor qkv;    // [rows, N] q | k | v as attention read them (after q/k norms and RoPE)
  Tensor ctx;    // [rows, Hq·D] the heads' outputs side by side
  Tensor lse;    // [B, Hq, T]
  Tensor a;      // [rows, C] the attention output (before post_norm₁)
  Tensor x_mid;  // [rows, C] x after the attention's residual add
  Tensor h2;     // [rows, C] norm₂(x_mid)
  Tensor z;      // [rows, F] gelu: fc output before GELU; gated: the gate projection
  Tensor u;      // [rows, F] gelu: GELU(z); gated: the up projection
  Tensor act;    // [rows, F] gated: act(z)·u
  Tensor m;      // [rows, C] the MLP output (before post_norm₂; post norms only)
};

// One sequence of a batched step: its next `rows` rows of x (the sequences' rows follow one
// another) and its own cache (batch 1) for this layer, or its place in a paged pool (whose blocks
// cover paged->length + rows tokens; the rows are written at paged->length, which the caller
// advances after the last layer).
struct SeqRows {
  KVCache* cache = nullptr;
  int64_t rows = 0;
  const PagedSequence* paged = nullptr;
};

// How one block's forward runs: over a cache (inference), over several sequences' caches at once
// (a batched step: B = 1, T = all their rows; every part of the block but attention runs over
// all rows together, attention per sequence over its own cache), recording a tape (training, the
// explorer's traced layer), or returning the attention probabilities (taps).
struct BlockRun {
  int64_t B = 0, T = 0;            // T rows per sequence
  const RopeTable* rope = nullptr; // their positions' cos/sin (rotary families; rope_positions)
  KVCache* cache = nullptr;        // append k, v and attend over the whole cache
  BlockTape* tape = nullptr;
  Tensor* probs = nullptr;         // [B, Hq, T, T] (no cache)
  std::span<const SeqRows> seqs;   // a batched step (no cache, tape or probs)
};

// The rotary table of B·T rows at positions pos0 + r % T (empty for learned positions).
RopeTable rope_positions(const Stack& s, int64_t rows, int64_t T, int64_t pos0);

// Options of layer `layer`'s attention (scale, window, soft-cap, causal).
AttentionOptions attention_options(const Stack& s, int64_t layer);

// x [B·T, C] ← block(x).
void block_forward(const Stack& s, int64_t layer, float* x, const BlockRun& run);
// From dx = ∂loss/∂(block output) [rows, C], in place to ∂loss/∂(block input); parameter
// gradients added into grads (indexed like s.params).
void block_backward(const Stack& s, int64_t layer, const BlockTape& tape, int64_t B, int64_t T, const RopeTable& rope,
                    float* dx, std::vector<Tensor>& grads);

// Embedding rows ids [B·T] at positions pos0 + r % T into x [B·T, C]; without `positions`, the
// token embedding alone (learned positions not added).
void embed_forward(const Stack& s, std::span<const int32_t> ids, int64_t T, int64_t pos0, float* x,
                   bool positions = true);

// The whole stack over a cache (one KVCache per layer): logits [B, T, V], or [B, 1, V] of each
// sequence's last row. probs: every layer's attention probabilities (no cache; caches must be null).
Tensor stack_forward(const Stack& s, std::span<const int32_t> ids, int64_t B, int64_t T, std::vector<KVCache>* caches,
                     bool last_only, std::vector<Tensor>* probs);
// The final norm's output [B, T, C] over a cache (as stack_forward): the hidden states the LM head
// reads (the server's embeddings).
Tensor stack_hidden(const Stack& s, std::span<const int32_t> ids, int64_t B, int64_t T, std::vector<KVCache>* caches);
// One sequence of stack_step: its new tokens and its caches (one KVCache per layer, batch 1),
// which they are appended to at positions caches[0].length() onwards, or its paged sequence.
struct SeqStep {
  std::vector<KVCache>* caches = nullptr;
  std::span<const int32_t> ids;  // at least one
  PagedSequence* paged = nullptr;  // instead of caches: appended at paged->length, which advances
  int64_t logit_rows = 1;  // the logits of its last logit_rows rows (1 .. ids.size()): speculation's checks
};
// One forward over several sequences, each at its own positions against its own caches: the
// embedding, norms, linear layers, MLP and LM head run over every sequence's rows at once (one
// pass over the weights), attention per sequence. Logits [Σ logit_rows, 1, V]: each sequence's
// last logit_rows rows, in order (with one each, [S, 1, V]).
// A sequence's logits are extend's for it up to the GEMM's rounding, which depends on the total
// rows (see kernels/gemm.cpp): bitwise equal where the row counts take the same kernel paths.
Tensor stack_step(const Stack& s, std::span<const SeqStep> seqs);
// The mean cross-entropy of targets [B·T] (−1 ignored; `counted` of them are not); with grads
// (zero_gradients-shaped, indexed like s.params), also adds every parameter's gradient. The
// backward runs from the output to the embedding; on_final(first), called from the calling thread
// between parallel regions, says that the gradients of params [first, params.size()) are final:
// nothing more is added to them (a data-parallel run starts reducing them while the backward goes
// on). first only decreases, and ends at 0.
double stack_loss(const Stack& s, std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T,
                  int64_t counted, std::vector<Tensor>* grads, const std::function<void(size_t first)>& on_final = {});

}  // namespace mhsa::nn
