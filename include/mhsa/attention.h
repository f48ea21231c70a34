// mhsa/attention.h — scaled dot-product attention, the kernel-level API.
//
// The attention contract (see docs/architecture.md), which every backend implements exactly:
//   q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv]  ->  out [B, Hq, Tq, Dv], lse [B, Hq, Tq]
//   - grouped heads: Hq % Hkv == 0, query head h reads key/value head h / (Hq / Hkv);
//   - scale: 1/sqrt(D) unless given;
//   - soft-capping (optional, Gemma 2): s = softcap·tanh(s / softcap), after the scale and before
//     any mask, so s_ij = softcap·tanh(scale·q_i·k_j / softcap) + mask_ij;
//   - the causal and window limits are taken in an aligned frame: query i stands at key position
//     p_i = i + (Tk - Tq) when aligned bottom-right (the default: the last query row meets the last
//     key, right for a KV cache, where one query sees every cached key) and at p_i = i when aligned
//     top-left (the first query meets the first key: PyTorch's is_causal=True when Tq != Tk; the
//     two agree when Tq == Tk);
//   - causal: query i sees keys j <= p_i;
//   - sliding window (left, right), -1 = unlimited on that side: query i sees keys
//     p_i - left <= j <= p_i + right. With causal, the right limit is moot (j <= p_i anyway).
//     Hugging Face's `sliding_window` W (Mistral, Gemma 2: transformers' masking_utils keeps
//     kv_idx > q_idx - W, checked by tests/python/test_sdpa_torch.py) is causal with window
//     (W - 1, -1). A window is allowed without causal (local attention, each side as given);
//   - additive float mask [Tq, Tk], [Hq|1, Tq, Tk] or [B|1, Hq|1, Tq, Tk] (broadcast over B and H);
//   - key padding as per-batch valid lengths: query rows of batch b see keys j < kv_lengths[b];
//   - a row whose keys are all masked gives out = 0 and lse = -inf, never NaN;
//   - lse = max + log(sum): the log-sum-exp of each row's scaled, soft-capped, masked scores;
//   - attention sinks (optional, gpt-oss): a learned logit sink_h per query head joins every row's
//     sum as a key without a value, lse_i = log(Σ_j exp(s_ij) + exp(sink_h)), so out_i is
//     Σ_j exp(s_ij − lse_i)·v_j and shrinks by the sink's share; a row whose keys are all masked
//     then gives out = 0 and lse = sink_h.
// The causal, window and padding limits leave each row one interval of keys; key blocks outside
// every row's interval are skipped, not masked (a causal window W of T keys costs ~T·W, not T²/2).
// Views may have any strides; out and lse must not overlap the inputs or themselves.
// This header is not the layer (see mha.h) and does no projections.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>

#include "mhsa/tensor.h"

namespace mhsa {

enum class Backend {
  automatic,  // the fastest kernel that takes the shape
  reference,  // the plain *_ref kernels: scalar, float64 accumulation; the oracle
};

// Where the causal and window limits put query row i: at key position i + (Tk - Tq) (bottom-right)
// or i (top-left). Only matters when Tq != Tk and some limit is set.
enum class CausalAlignment {
  bottom_right,  // the default; KV caches, FlashAttention, mhsa's layers
  top_left,      // torch.nn.functional.scaled_dot_product_attention(is_causal=True)
};

// Keys p_i - left <= j <= p_i + right stay visible; -1 leaves that side unlimited.
struct AttentionWindow {
  int64_t left = -1;
  int64_t right = -1;
};

// Dropout on the attention probabilities (training): each P_ij is kept with probability 1 − p
// and then scaled by 1/(1 − p), or dropped (0); the row sums (lse) are not dropped. The keep
// decisions are a counter-based hash of (seed, b, h, i, j), so the backward, given the same
// options, regenerates the forward's mask, and results do not depend on threads or ISA. The same
// seed gives the same mask; PyTorch users draw it from torch's generator (mhsa.torch does).
struct AttentionDropout {
  float p = 0.0f;  // in [0, 1); 0: none
  uint64_t seed = 0;
};

struct AttentionOptions {
  bool causal = false;
  CausalAlignment causal_alignment = CausalAlignment::bottom_right;  // for causal and the window
  AttentionWindow window;               // default: unlimited (no window)
  std::optional<float> softcap;         // Gemma 2's attn_logit_softcapping; a finite number > 0
  std::optional<float> scale;           // default 1/sqrt(D)
  ConstTensorView attn_mask;            // optional additive mask; -inf removes a key
  std::span<const int64_t> kv_lengths;  // optional [B]: keys j >= kv_lengths[b] are masked
  AttentionDropout dropout;             // default: none
  std::span<const float> sinks;         // optional [Hq]: attention sinks, finite logits; empty: none
  Backend backend = Backend::automatic;
};

// Writes out [B, Hq, Tq, Dv] and, if lse is defined, lse [B, Hq, Tq].
void scaled_dot_product_attention(ConstTensorView q, ConstTensorView k, ConstTensorView v,
                                  TensorView out, const AttentionOptions& options = {},
                                  TensorView lse = {});

// 16-bit elements (see the 16-bit entry points below).
template <class T>
concept Float16Element = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;
// The elements a KV cache may hold (kv_cache.h): float32, bfloat16 / float16, or Q8_0 blocks.
template <class T>
concept KVElementType = std::is_same_v<T, float> || Float16Element<T> || std::is_same_v<T, BlockQ8_0>;
// Keys K and values V of which at least one is not float32 (the all-float32 call is the one above).
template <class K, class V>
concept NarrowKV = KVElementType<K> && KVElementType<V> && !(std::is_same_v<K, float> && std::is_same_v<V, float>);

// Keys and values of a 16-bit or q8_0 KV cache (kv_cache.h's KVType bf16, f16 or q8_0; keys and
// values each their own type), read as they are: float32 queries and outputs, the keys and values
// widened (dequantised: a block's f16 scale times its int8s, exact in float32) by the kernels as
// they read them (no float32 copy: in registers, or while packed into key blocks), so out and lse
// are, bit for bit, those of the float32 call on the widened k and v. A Q8_0 view counts blocks:
// k [B, Hkv, Tk, D / 32] (D, q's head size, a multiple of 32), its last stride 1. Forward only.
template <class K, class V>
  requires NarrowKV<K, V>
void scaled_dot_product_attention(ConstTensorView q, View<const K> k, View<const V> v, TensorView out,
                                  const AttentionOptions& options = {}, TensorView lse = {});

// Keys and values of one sequence in fixed-size blocks (a paged KV cache, see kv_pool.h): key j of
// kv head h is row j % block_tokens of k_blocks[j / block_tokens], a block being [Hkv,
// block_tokens, D] contiguous (values alike, [Hkv, block_tokens, Dv]) of K (values: V) elements
// (float32, or bfloat16 / float16 / Q8_0 blocks — [Hkv, block_tokens, D / 32] — read exactly as
// above). Blocks past the length may be absent.
template <KVElementType K, KVElementType V = K>
struct PagedKVOf {
  std::span<const K* const> k_blocks;
  std::span<const V* const> v_blocks;
  int64_t block_tokens = 0, length = 0;  // tokens per block (a power of two); keys held (Tk)
  int64_t kv_heads = 0, head_dim = 0, v_head_dim = 0;
};
using PagedKV = PagedKVOf<float>;
// The attention of q [1, Hq, Tq, D] over paged keys and values, with the contract above: the
// kernels read each key where it lies (no gather), so the result is, bit for bit, that of the
// contiguous k [1, Hkv, Tk, D] and v the blocks hold.
template <KVElementType K, KVElementType V>
void scaled_dot_product_attention(ConstTensorView q, const PagedKVOf<K, V>& kv, TensorView out,
                                  const AttentionOptions& options = {}, TensorView lse = {});

// The sequences of a continuous-batching step in one call: item i is its own attention, q_i [B_i,
// Hq, Tq_i, D] over its own keys and values (contiguous views k_i [B_i, Hkv, Tk_i, D] and v_i, or
// `paged`, a paged sequence, B_i = 1) into out_i [B_i, Hq, Tq_i, Dv], all with the same options
// (no attn_mask or kv_lengths: each item's keys are its own). The items that decode (few query
// rows against their keys) run in one parallel region over all their heads and key slices,
// instead of one region each; every out_i is, bit for bit, what the call for item i alone writes.
// Forward only, no lse. Errors name the item.
template <KVElementType K, KVElementType V = K>
struct AttentionBatchItem {
  ConstTensorView q;
  View<const K> k;                        // unused when paged is set
  View<const V> v;
  const PagedKVOf<K, V>* paged = nullptr;
  TensorView out;
};
template <KVElementType K, KVElementType V>
void scaled_dot_product_attention(std::span<const AttentionBatchItem<K, V>> batch, const AttentionOptions& options = {});

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
// zero gradients. With options.sinks, dsinks [Hq] (if defined) receives the sinks' gradient, summed
// over batches and rows. Bitwise identical for any thread count.
void scaled_dot_product_attention_backward(ConstTensorView dout, ConstTensorView q, ConstTensorView k,
                                           ConstTensorView v, ConstTensorView out, ConstTensorView lse,
                                           TensorView dq, TensorView dk, TensorView dv,
                                           const AttentionOptions& options = {}, TensorView dsinks = {});
struct AttentionGrads {
  Tensor dq;      // [B, Hq, Tq, D]
  Tensor dk;      // [B, Hkv, Tk, D]
  Tensor dv;      // [B, Hkv, Tk, Dv]
  Tensor dsinks;  // [Hq] with options.sinks; otherwise empty
};
AttentionGrads scaled_dot_product_attention_backward(ConstTensorView dout, ConstTensorView q, ConstTensorView k,
                                                     ConstTensorView v, ConstTensorView out, ConstTensorView lse,
                                                     const AttentionOptions& options = {});

// 16-bit inputs (bfloat16 or float16, the same for every tensor of a call): the same contract,
// computed in float32 from the exactly widened inputs (float32 sums, lse in float32), out and the
// gradients rounded to the input type (nearest even) once at the end; the mask stays float32.
// Equal, bit for bit, to the float32 call on the widened inputs with its results rounded. Today
// the inputs are widened into a float32 copy at the boundary (O(B·H·T·D) memory, negligible time
// next to the O(T²) work). (A 16-bit KV cache with float32 queries: the entry point above.)
// The 16-bit backward refuses options.sinks (it has no dsinks output).
template <Float16Element T>
void scaled_dot_product_attention(View<const T> q, View<const T> k, View<const T> v, View<T> out,
                                  const AttentionOptions& options = {}, TensorView lse = {});
template <Float16Element T>
void scaled_dot_product_attention_backward(View<const T> dout, View<const T> q, View<const T> k, View<const T> v,
                                           View<const T> out, ConstTensorView lse, View<T> dq, View<T> dk,
                                           View<T> dv, const AttentionOptions& options = {});

// The exact softmax matrix P = exp(scaled masked scores - lse) (before any dropout) for the chosen query heads
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
// Forward FLOPs over the (query, key) pairs that the causal, window and kv_lengths limits leave
// visible: 2·(D + Dv) per visible pair per query head (the additive mask is not counted).
double attention_flops(int64_t B, int64_t Hq, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv,
                       const AttentionOptions& options);

}  // namespace mhsa
