// explain/explain.cpp — the numbers behind `mhsa explain` (see mhsa/explain.h): per-head summaries
// and the step-by-step trace of one head. The blocks before the traced layer run exactly as
// Gpt2::forward runs them (same kernels, same order), so the trace's x, Q, K and V are the model's.
#include "mhsa/explain.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "kernels/dispatch.h"

namespace mhsa {
namespace {

using detail::fail;
using detail::message;

void check_request(std::string_view fn, const Gpt2Config& c, std::span<const int32_t> ids, int64_t layer,
                   int64_t head) {
  const auto T = static_cast<int64_t>(ids.size());
  if (T == 0) fail(fn, "ids", "at least one token", "none");
  if (T > c.n_positions)
    fail(fn, "ids", message("at most n_positions = ", c.n_positions, " tokens (the model's context)"),
         message(T, " tokens"));
  for (int64_t i = 0; i < T; ++i)
    if (ids[static_cast<size_t>(i)] < 0 || ids[static_cast<size_t>(i)] >= c.vocab_size)
      fail(fn, message("ids[", i, "]"), message("a token id in [0, ", c.vocab_size, ")"),
           std::to_string(ids[static_cast<size_t>(i)]));
  if (layer < 0 || layer >= c.n_layer)
    fail(fn, "layer", message("a layer in [0, ", c.n_layer, ")"), std::to_string(layer));
  if (head < 0 || head >= c.n_head) fail(fn, "head", message("a head in [0, ", c.n_head, ")"), std::to_string(head));
}

// Columns [col, col + width) of a row-major [T, ld] buffer, as a [T, width] tensor.
Tensor columns(const float* src, int64_t T, int64_t ld, int64_t col, int64_t width) {
  Tensor t({T, width});
  for (int64_t i = 0; i < T; ++i) std::copy_n(src + i * ld + col, width, t.data() + i * width);
  return t;
}

void add_into(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
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
  const Gpt2Config& c = model.config();
  check_request("trace_head", c, ids, layer, head);
  const auto T = static_cast<int64_t>(ids.size());
  const int64_t C = c.n_embd, D = C / c.n_head, F = c.mlp_dim();
  const float eps = c.layer_norm_epsilon;
  const kernels::KernelTable& k = kernels::kernels();

  HeadTrace t;
  t.layer = layer;
  t.head = head;
  t.token_embedding = Tensor({T, C});
  t.position_embedding = Tensor({T, C});
  t.x = Tensor({T, C});
  for (int64_t i = 0; i < T; ++i) {
    const float* te = model.wte().data() + ids[static_cast<size_t>(i)] * C;
    const float* pe = model.wpe().data() + i * C;
    std::copy_n(te, C, t.token_embedding.data() + i * C);
    std::copy_n(pe, C, t.position_embedding.data() + i * C);
    for (int64_t ch = 0; ch < C; ++ch) t.x.data()[i * C + ch] = te[ch] + pe[ch];
  }

  // The residual stream through the blocks before `layer`, as Gpt2::forward computes it.
  Tensor h({1, T, C}), u({T, F}), y({T, C});  // [1, T, C], [T, F], [T, C]
  MhaOptions causal;
  causal.causal = true;
  for (int64_t l = 0; l < layer; ++l) {
    const Gpt2Block& b = model.block(l);
    float* x = t.x.data();
    k.layer_norm(T, C, x, C, b.ln1_g.data(), b.ln1_b.data(), eps, h.data(), C);
    const Tensor a = b.attn.forward(h.view(), causal);  // [1, T, C]
    add_into(x, a.data(), T * C);
    k.layer_norm(T, C, x, C, b.ln2_g.data(), b.ln2_b.data(), eps, h.data(), C);
    k.gemm(T, F, C, h.data(), C, b.fc_w.data(), F, b.fc_b.data(), u.data(), F);
    k.gelu_tanh(T * F, u.data());
    k.gemm(T, C, F, u.data(), F, b.proj_w.data(), C, b.proj_b.data(), y.data(), C);
    add_into(x, y.data(), T * C);
  }

  // The traced block's attention, with a tape: it keeps the projections and the concatenated heads.
  const Gpt2Block& b = model.block(layer);
  k.layer_norm(T, C, t.x.data(), C, b.ln1_g.data(), b.ln1_b.data(), eps, h.data(), C);
  t.ln = columns(h.data(), T, C, 0, C);
  MhaTape tape;
  MhaOptions taped = causal;
  taped.tape = &tape;
  const Tensor out = b.attn.forward(h.view(), taped);  // [1, T, C]
  const float* qkv = tape.qkv.data();                  // [1, T, 3C]: q | k | v
  t.q = columns(qkv, T, 3 * C, head * D, D);
  t.k = columns(qkv, T, 3 * C, C + head * D, D);
  t.v = columns(qkv, T, 3 * C, 2 * C + head * D, D);
  t.concat = columns(tape.ctx.data(), T, C, 0, C);
  t.out = columns(out.data(), T, C, 0, C);

  // QKᵀ, the scaling and the mask, in float64 like the reference kernels.
  t.scores = Tensor({T, T});
  t.scaled = Tensor({T, T});
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += double(t.q.data()[i * D + d]) * double(t.k.data()[j * D + d]);
      t.scores.data()[i * T + j] = static_cast<float>(dot);
      t.scaled.data()[i * T + j] =
          j > i ? -std::numeric_limits<float>::infinity() : static_cast<float>(dot * scale);
    }
  AttentionOptions reference;
  reference.causal = true;
  reference.backend = Backend::reference;
  const Tensor p = attention_probabilities(ConstTensorView(t.q.data(), {1, 1, T, D}),
                                           ConstTensorView(t.k.data(), {1, 1, T, D}), {}, reference);
  t.probs = columns(p.data(), T, T, 0, T);
  t.head_out = Tensor({T, D});
  for (int64_t i = 0; i < T; ++i)
    for (int64_t d = 0; d < D; ++d) {
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += double(t.probs.data()[i * T + j]) * double(t.v.data()[j * D + d]);
      t.head_out.data()[i * D + d] = static_cast<float>(sum);
    }
  return t;
}

Explanation explain(const Gpt2& model, std::span<const int32_t> ids, int64_t layer, int64_t head) {
  const Gpt2Config& c = model.config();
  check_request("explain", c, ids, layer, head);
  const auto T = static_cast<int64_t>(ids.size());
  Explanation e;
  e.ids.assign(ids.begin(), ids.end());
  model.forward(ids, 1, T, &e.attention);
  for (const Tensor& a : e.attention) {  // [1, H, T, T]
    std::vector<HeadSummary>& row = e.summaries.emplace_back();
    for (int64_t h = 0; h < c.n_head; ++h) row.push_back(summarize_head(ConstTensorView(a.data() + h * T * T, {T, T})));
  }
  e.trace = trace_head(model, ids, layer, head);
  return e;
}

}  // namespace mhsa
