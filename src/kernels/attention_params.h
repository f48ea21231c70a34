// kernels/attention_params.h — the one flat struct between the attention API and every kernel.
//
// The API validates once and fills this struct; kernels trust it (they only assert). Views are
// normalised to 4-D strides in elements: a broadcast mask dimension has stride 0. Not public.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/bf16.h"
#include "kernels/half.h"
#include "mhsa/tensor.h"

namespace mhsa::kernels {

using Strides4 = std::array<int64_t, 4>;

// The element type of keys or of values: float32, 16-bit (a bf16/f16 KV cache, forward only) or
// Q8_0 blocks (a q8_0 KV cache, forward only: a row of D values is D/32 BlockQ8_0, strides count
// blocks), widened or dequantised exactly as the kernels read them (f16 scale × int8 is exact in
// float32), so that the result is the float32 kernel's on the widened keys and values, bit for bit.
enum class KVElement : uint8_t { f32, bf16, f16, q8_0 };
inline constexpr int kKVElements = 4;

struct AttentionParams {
  int64_t B = 0, Hq = 0, Hkv = 0, Tq = 0, Tk = 0, D = 0, Dv = 0;
  const float* q = nullptr;     // [B, Hq, Tq, D]
  Strides4 q_stride{};
  // Keys are of k_element, values of v_element (float unless a 16-bit or q8_0 cache: forward
  // only); read them through key_row / value_row and kv_at.
  KVElement k_element = KVElement::f32, v_element = KVElement::f32;
  const void* k = nullptr;      // [B, Hkv, Tk, D]
  Strides4 k_stride{};
  const void* v = nullptr;      // [B, Hkv, Tk, Dv]; null when only lse is wanted
  Strides4 v_stride{};
  // Paged keys and values (B = 1, forward only), instead of k and v: pages of 2^page_shift
  // tokens; key j of kv head h is row j & page_mask of page j >> page_shift, at
  // pages[j >> page_shift] + h·k_stride[1] + (j & page_mask)·k_stride[2] (values alike), pages
  // being k_pages as `const T* const*` (T the element type). Null: k and v as above.
  const void* k_pages = nullptr;
  const void* v_pages = nullptr;
  int page_shift = 0;
  int64_t page_mask = 0;  // 2^page_shift − 1
  const float* mask = nullptr;  // [B, Hq, Tq, Tk] additive, stride 0 on broadcast dims; or null
  Strides4 mask_stride{};
  const int64_t* kv_lengths = nullptr;  // [B] valid keys per batch, or null
  float scale = 1.0f;
  float softcap = 0.0f;  // > 0: scores become softcap·tanh(score / softcap) before the mask; 0: none
  // [Hq] one learned logit per query head in every row's softmax denominator (attention sinks,
  // gpt-oss): a key without a value, so lse_i = log(Σ_j exp(s_ij) + exp(sink_h)). Null: none.
  // The fast forwards run without it and apply_sinks rescales out and lse after; the reference
  // kernels take it as one more key.
  const float* sinks = nullptr;
  bool causal = false;
  // The causal and window limits are taken at key position i + query_offset of query row i:
  // Tk − Tq aligned bottom-right, 0 aligned top-left.
  int64_t query_offset = 0;
  int64_t window_left = -1, window_right = -1;  // -1: unlimited; else at most Tq + Tk
  // Dropout on the probabilities: P_ij·keep_ij/(1 − dropout) in out (the row sums, lse, are not
  // dropped); keep_ij from dropout_scales. 0: none.
  float dropout = 0.0f;
  uint64_t dropout_seed = 0;
  // q, k and v hold bfloat16 values (the bfloat16 entry point's widened inputs): a forward may
  // multiply them as bfloat16 pairs and round P to bfloat16 for P·V (dispatch.h:
  // attention_forward_bf16_dot).
  bool bf16_values = false;
  float* out = nullptr;  // [B, Hq, Tq, Dv]; null when only lse is wanted
  Strides4 out_stride{};
  float* lse = nullptr;  // [B, Hq, Tq] (stride[3] unused), or null
  Strides4 lse_stride{};
  // Backward only: out and lse above are inputs (from the forward), these the incoming gradient
  // and the outputs. dk and dv sum over the query heads of a group.
  const float* dout = nullptr;  // [B, Hq, Tq, Dv]
  Strides4 dout_stride{};
  float* dq = nullptr;  // [B, Hq, Tq, D]
  Strides4 dq_stride{};
  float* dk = nullptr;  // [B, Hkv, Tk, D]
  Strides4 dk_stride{};
  float* dv = nullptr;  // [B, Hkv, Tk, Dv]
  Strides4 dv_stride{};
  float* dsinks = nullptr;  // [Hq], summed over batches and rows; or null (only with sinks)
};

// Key j and value j of kv head h in batch b: [D] and [Dv] at strides k_stride[3], v_stride[3].
// T: the element type, float, bfloat16, float16 or BlockQ8_0 (as p.k_element / p.v_element say;
// a Q8_0 row is D/32 contiguous blocks, element d at kv_at(row, d)).
template <class T = float>
const T* key_row(const AttentionParams& p, int64_t b, int64_t h, int64_t j) {
  if (p.k_pages)
    return static_cast<const T* const*>(p.k_pages)[j >> p.page_shift] + h * p.k_stride[1] +
           (j & p.page_mask) * p.k_stride[2];
  return static_cast<const T*>(p.k) + b * p.k_stride[0] + h * p.k_stride[1] + j * p.k_stride[2];
}
template <class T = float>
const T* value_row(const AttentionParams& p, int64_t b, int64_t h, int64_t j) {
  if (p.v_pages)
    return static_cast<const T* const*>(p.v_pages)[j >> p.page_shift] + h * p.v_stride[1] +
           (j & p.page_mask) * p.v_stride[2];
  return static_cast<const T*>(p.v) + b * p.v_stride[0] + h * p.v_stride[1] + j * p.v_stride[2];
}

// A key or value element as float32, exactly.
inline float kv_float(float x) { return x; }
inline float kv_float(bfloat16 x) { return bf16_to_float(x.bits); }
inline float kv_float(float16 x) { return f16_to_float(x.bits); }
// Element d of a key or value row (elements `stride` apart; a Q8_0 row's blocks are contiguous)
// as float32, exactly: a Q8_0 element is its block's f16 scale times its int8, a product exact in
// float32.
template <class T>
inline float kv_at(const T* row, int64_t d, int64_t stride) {
  return kv_float(row[d * stride]);
}
template <>
inline float kv_at(const BlockQ8_0* row, int64_t d, int64_t) {
  const BlockQ8_0& block = row[d >> 5];
  return f16_to_float(block.d) * static_cast<float>(block.qs[d & 31]);
}
// Bytes of a row of n elements of type T (n values; a Q8_0 row's n / 32 blocks).
template <class T>
constexpr int64_t kv_bytes(int64_t n) {
  if constexpr (std::is_same_v<T, BlockQ8_0>) return n / 32 * static_cast<int64_t>(sizeof(BlockQ8_0));
  return n * static_cast<int64_t>(sizeof(T));
}

// f(T{}) with T the element type `e`.
template <class F>
decltype(auto) with_element(KVElement e, F&& f) {
  switch (e) {
    case KVElement::bf16: return f(bfloat16{});
    case KVElement::f16: return f(float16{});
    case KVElement::q8_0: return f(BlockQ8_0{});
    case KVElement::f32: break;
  }
  return f(0.0f);
}
// f(K{}, V{}) with K and V the element types of p's keys and values: one instance of a kernel per
// pair of types.
template <class F>
decltype(auto) with_kv_element(const AttentionParams& p, F&& f) {
  return with_element(p.k_element, [&](auto key) {
    return with_element(p.v_element, [&](auto value) { return f(key, value); });
  });
}

// Keys visible to query row i of batch b form one interval [begin, end), begin <= end (empty
// when begin == end): the window's left limit cuts it from the left; the causal limit, the window's
// right limit and the padding length cut it from the right. The additive mask may remove more.
struct KeyRange {
  int64_t begin = 0, end = 0;
};
inline KeyRange key_range(const AttentionParams& p, int64_t b, int64_t i) {
  const int64_t pos = i + p.query_offset;  // the row's place among the keys
  int64_t end = p.Tk;
  if (p.kv_lengths) end = std::min(end, p.kv_lengths[b]);
  if (p.causal) end = std::min(end, pos + 1);
  if (p.window_right >= 0) end = std::min(end, pos + p.window_right + 1);
  const int64_t begin = p.window_left >= 0 ? std::clamp<int64_t>(pos - p.window_left, 0, p.Tk) : 0;
  return {begin, std::max(begin, end)};
}

// The fast backwards recompute P = exp(s − lse) from the saved float32 lse, so lse's rounding
// (up to half an ulp, the same for a whole row) is a relative error of the row's every P, and of
// its dq, dk and dv. Below 16 that is at most 2^-21 (4 float32 epsilons: gradients measured at
// 1.1-1.3x PyTorch fp32's error); from 16 (ulp 2^-19) it grows with |lse| (1.4-1.6x at 16-1000) to
// 3% at 5.9e5 (ulp 0.0625), where PyTorch's P, normalised by its own sum, is exact. Rows with such an
// lse get their max m and sum l recomputed over their keys, as the forward made them, and
// P = exp(s − m)·(1/l): exact at any magnitude, at the cost of one more pass of S for the query
// blocks that hold such a row. Ordinary rows (|lse| < 16, ±∞, NaN) keep P = exp(s − lse).
inline bool lse_too_coarse(float lse) { return std::fabs(lse) >= 16.0f && std::isfinite(lse); }

// Dropout's factors for query row i of head h in batch b against keys [j0, j0 + n):
// z[jj] = 1/(1 − dropout) where the key is kept, 0 where dropped. The decision is a counter-based
// hash — splitmix64 of (seed, row), then murmur3's 32-bit finaliser of (row key + j·golden ratio),
// kept when it reaches floor(dropout·2³²) — so the forward, the backward and the reference
// regenerate the same mask for any thread count, ISA or block size. The loop vectorises.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline void dropout_scales(const AttentionParams& p, int64_t b, int64_t h, int64_t i, int64_t j0, int64_t n,
                           float* z) {
  const uint64_t row = static_cast<uint64_t>((b * p.Hq + h) * p.Tq + i);
  const auto key = static_cast<uint32_t>(splitmix64(p.dropout_seed ^ splitmix64(row)));
  const auto threshold = static_cast<uint32_t>(std::min(4294967295.0, double(p.dropout) * 4294967296.0));
  const float kept = 1.0f / (1.0f - p.dropout);
  for (int64_t jj = 0; jj < n; ++jj) {
    uint32_t x = key + static_cast<uint32_t>(j0 + jj) * 0x9E3779B9u;
    x = (x ^ (x >> 16)) * 0x85EBCA6Bu;
    x = (x ^ (x >> 13)) * 0xC2B2AE35u;
    x ^= x >> 16;
    z[jj] = x >= threshold ? kept : 0.0f;
  }
}

// Plain reference kernels: scalar, float64 accumulation, the oracle for every fast kernel.
// Computes lse, and out when p.out is set.
void attention_forward_ref(const AttentionParams& p);
// dq, dk, dv from dout, q, k, v and lse (P recomputed row by row, in float64).
void attention_backward_ref(const AttentionParams& p);
// probs [B, n_heads, Tq, Tk] for query heads heads[0..n_heads), from p.lse (which must be set).
void attention_probabilities_ref(const AttentionParams& p, const int64_t* heads, int64_t n_heads,
                                 float* probs, const Strides4& probs_stride);

}  // namespace mhsa::kernels
