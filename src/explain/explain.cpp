// explain/explain.cpp — the numbers behind `mhsa explain` (see mhsa/explain.h): per-head summaries
// and the step-by-step trace of one head. The trace runs the model's own block (nn/block.h) up to
// and through the traced layer, so its x, Q, K and V are the model's numbers; the scores and the
// softmax are then redone on the reference path.
#include "mhsa/explain.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "model/access.h"

namespace mhsa {
namespace {

using detail::fail;
using detail::message;

void check_request(std::string_view fn, const nn::Stack& s, std::string_view context_key, std::span<const int32_t> ids,
                   int64_t layer, int64_t head) {
  const ModelConfig& c = *s.config;
  const auto T = static_cast<int64_t>(ids.size());
  if (T == 0) fail(fn, "ids", "at least one token", "none");
  if (T > c.max_positions)
    fail(fn, "ids", message("at most ", context_key, " = ", c.max_positions, " tokens (the model's context)"),
         message(T, " tokens"));
  for (int64_t i = 0; i < T; ++i)
    if (ids[static_cast<size_t>(i)] < 0 || ids[static_cast<size_t>(i)] >= c.vocab_size)
      fail(fn, message("ids[", i, "]"), message("a token id in [0, ", c.vocab_size, ")"),
           std::to_string(ids[static_cast<size_t>(i)]));
  if (layer < 0 || layer >= c.num_layers)
    fail(fn, "layer", message("a layer in [0, ", c.num_layers, ")"), std::to_string(layer));
  if (head < 0 || head >= c.num_heads) fail(fn, "head", message("a head in [0, ", c.num_heads, ")"), std::to_string(head));
}

// Columns [col, col + width) of a row-major [T, ld] buffer, as a [T, width] tensor.
Tensor columns(const float* src, int64_t T, int64_t ld, int64_t col, int64_t width) {
  Tensor t({T, width});
  for (int64_t i = 0; i < T; ++i) std::copy_n(src + i * ld + col, width, t.data() + i * width);
  return t;
}

HeadTrace trace(const nn::Stack& s, std::string_view context_key, std::span<const int32_t> ids, int64_t layer,
                int64_t head) {
  const ModelConfig& c = *s.config;
  check_request("trace_head", s, context_key, ids, layer, head);
  const auto T = static_cast<int64_t>(ids.size());
  const int64_t C = c.hidden_size, D = c.head_dim, Nq = c.num_heads * D, Nkv = c.num_kv_heads * D;
  const int64_t N = Nq + 2 * Nkv, kv_head = head / (c.num_heads / c.num_kv_heads);

  HeadTrace t;
  t.layer = layer;
  t.head = head;
  t.token_embedding = Tensor({T, C});
  nn::embed_forward(s, ids, T, 0, t.token_embedding.data(), false);
  t.position_embedding = Tensor({T, C});  // zero for rotary positions (they act inside attention)
  if (s.pos >= 0) std::copy_n(s.p(s.pos).data(), T * C, t.position_embedding.data());
  t.x = Tensor({T, C});
  nn::embed_forward(s, ids, T, 0, t.x.data());

  // The residual stream through the blocks before `layer`, then the traced block with a tape.
  const nn::RopeTable rope = nn::rope_positions(s, T, T, 0);
  for (int64_t l = 0; l < layer; ++l)
    nn::block_forward(s, l, t.x.data(), nn::BlockRun{1, T, &rope, nullptr, nullptr, nullptr, {}});
  nn::BlockTape tape;
  Tensor x = t.x;
  nn::block_forward(s, layer, x.data(), nn::BlockRun{1, T, &rope, nullptr, &tape, nullptr, {}});
  t.ln = std::move(tape.h1);
  t.q = columns(tape.qkv.data(), T, N, head * D, D);
  t.k = columns(tape.qkv.data(), T, N, Nq + kv_head * D, D);
  t.v = columns(tape.qkv.data(), T, N, Nq + Nkv + kv_head * D, D);
  t.concat = std::move(tape.ctx);
  t.out = std::move(tape.a);

  // QKᵀ, the scaling and the mask, in float64 like the reference kernels.
  AttentionOptions reference = nn::attention_options(s, layer);
  reference.backend = Backend::reference;
  t.scores = Tensor({T, T});
  t.scaled = Tensor({T, T});
  const double scale = reference.scale ? double(*reference.scale) : 1.0 / std::sqrt(static_cast<double>(D));
  const int64_t left = reference.window.left;  // −1: no window
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += double(t.q.data()[i * D + d]) * double(t.k.data()[j * D + d]);
      t.scores.data()[i * T + j] = static_cast<float>(dot);
      double scaled = dot * scale;
      if (reference.softcap) scaled = *reference.softcap * std::tanh(scaled / *reference.softcap);
      const bool masked = j > i || (left >= 0 && j < i - left);
      t.scaled.data()[i * T + j] = masked ? -std::numeric_limits<float>::infinity() : static_cast<float>(scaled);
    }
  const Tensor p = attention_probabilities(ConstTensorView(t.q.data(), {1, 1, T, D}),
                                           ConstTensorView(t.k.data(), {1, 1, T, D}), {}, reference);
  t.probs = columns(p.data(), T, T, 0, T);
  t.head_out = Tensor({T, D});
  for (int64_t i = 0; i < T; ++i)
    for (int64_t d = 0; d < D; ++d) {
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += double(t.probs.data()[i * T + j]) * double(t.v.data()[j * D + d]);  // 0 where masked
      t.head_out.data()[i * D + d] = static_cast<float>(sum);
    }
  return t;
}

Explanation explain_stack(const nn::Stack& s, std::string_view context_key, std::span<const int32_t> ids,
                          int64_t layer, int64_t head) {
  check_request("explain", s, context_key, ids, layer, head);
  const auto T = static_cast<int64_t>(ids.size());
  Explanation e;
  e.ids.assign(ids.begin(), ids.end());
  nn::stack_forward(s, ids, 1, T, nullptr, false, &e.attention);
  for (const Tensor& a : e.attention) {  // [1, H, T, T]
    std::vector<HeadSummary>& row = e.summaries.emplace_back();
    for (int64_t h = 0; h < s.config->num_heads; ++h)
      row.push_back(summarize_head(ConstTensorView(a.data() + h * T * T, {T, T})));
  }
  e.trace = trace(s, context_key, ids, layer, head);
  return e;
}

}  // namespace

HeadSummary summarize_head(ConstTensorView probs) {
  detail::check_tensor("summarize_head", "probs", probs, 2, "[T, T]");
  const int64_t T = probs.shape[0];
  if (probs.shape[1] != T) fail("summarize_head", "probs", "a square [T, T] matrix", shape_string(probs));
  HeadSummary s;
  if (T == 0) return s;
  const int64_t first_row = T > 1 ? 1 : 0;
  for (int64_t i = first_row; i < T; ++i) {
    const auto p = [&](int64_t j) { return static_cast<double>(probs.data[i * probs.stride[0] + j * probs.stride[1]]); };
    for (int64_t j = 0; j <= i; ++j)
      if (p(j) > 0) s.entropy -= p(j) * std::log(p(j));
    s.first_token += p(0);
    s.previous_token += i > 0 ? p(i - 1) : 0.0;
    s.self += p(i);
  }
  const auto rows = static_cast<double>(T - first_row);
  s.entropy /= rows;
  s.first_token /= rows;
  s.previous_token /= rows;
  s.self /= rows;
  return s;
}

HeadTrace trace_head(const Gpt2& model, std::span<const int32_t> ids, int64_t layer, int64_t head) {
  return trace(ModelAccess::stack(model), "n_positions", ids, layer, head);
}

HeadTrace trace_head(const Model& model, std::span<const int32_t> ids, int64_t layer, int64_t head) {
  return trace(ModelAccess::stack(model), "max_positions", ids, layer, head);
}

Explanation explain(const Gpt2& model, std::span<const int32_t> ids, int64_t layer, int64_t head) {
  return explain_stack(ModelAccess::stack(model), "n_positions", ids, layer, head);
}

Explanation explain(const Model& model, std::span<const int32_t> ids, int64_t layer, int64_t head) {
  return explain_stack(ModelAccess::stack(model), "max_positions", ids, layer, head);
}

}  // namespace mhsa
