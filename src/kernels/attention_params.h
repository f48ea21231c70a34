// kernels/attention_params.h — the one flat struct between the attention API and every kernel.
//
// The API validates once and fills this struct; kernels trust it (they only assert). Views are
// normalised to 4-D strides in elements: a broadcast mask dimension has stride 0. Not public.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace mhsa::kernels {

using Strides4 = std::array<int64_t, 4>;

struct AttentionParams {
  int64_t B = 0, Hq = 0, Hkv = 0, Tq = 0, Tk = 0, D = 0, Dv = 0;
  const float* q = nullptr;     // [B, Hq, Tq, D]
  Strides4 q_stride{};
  const float* k = nullptr;     // [B, Hkv, Tk, D]
  Strides4 k_stride{};
  const float* v = nullptr;     // [B, Hkv, Tk, Dv]; null when only lse is wanted
  Strides4 v_stride{};
  // Paged keys and values (B = 1, forward only), instead of k and v: pages of 2^page_shift
  // tokens; key j of kv head h is row j & page_mask of page j >> page_shift, at
  // k_pages[j >> page_shift] + h·k_stride[1] + (j & page_mask)·k_stride[2] (values alike).
  // Null: k and v as above.
  const float* const* k_pages = nullptr;
  const float* const* v_pages = nullptr;
  int page_shift = 0;
  int64_t page_mask = 0;  // 2^page_shift − 1
  const float* mask = nullptr;  // [B, Hq, Tq, Tk] additive, stride 0 on broadcast dims; or null
  Strides4 mask_stride{};
  const int64_t* kv_lengths = nullptr;  // [B] valid keys per batch, or null
  float scale = 1.0f;
  float softcap = 0.0f;  // > 0: scores become softcap·tanh(score / softcap) before the mask; 0: none
  bool causal = false;
  // The causal and window limits are taken at key position i + query_offset of query row i:
  // Tk − Tq aligned bottom-right, 0 aligned top-left.
  int64_t query_offset = 0;
  int64_t window_left = -1, window_right = -1;  // -1: unlimited; else at most Tq + Tk
  // Dropout on the probabilities: P_ij·keep_ij/(1 − dropout) in out (the row sums, lse, are not
  // dropped); keep_ij from dropout_scales. 0: none.
  float dropout = 0.0f;
  uint64_t dropout_seed = 0;
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
};

// Key j and value j of kv head h in batch b: [D] and [Dv] at strides k_stride[3], v_stride[3].
inline const float* key_row(const AttentionParams& p, int64_t b, int64_t h, int64_t j) {
  if (p.k_pages) return p.k_pages[j >> p.page_shift] + h * p.k_stride[1] + (j & p.page_mask) * p.k_stride[2];
  return p.k + b * p.k_stride[0] + h * p.k_stride[1] + j * p.k_stride[2];
}
inline const float* value_row(const AttentionParams& p, int64_t b, int64_t h, int64_t j) {
  if (p.v_pages) return p.v_pages[j >> p.page_shift] + h * p.v_stride[1] + (j & p.page_mask) * p.v_stride[2];
  return p.v + b * p.v_stride[0] + h * p.v_stride[1] + j * p.v_stride[2];
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
