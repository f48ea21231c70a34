// nn/block.cpp — the transformer block and the decoder stack (see block.h): attention (q/k/v
// projections, q/k norms, RoPE, the kernel, the output projection), the MLP, the norms and
// residuals, each as a forward and a backward; the stack's embedding, final norm and LM head.
// The heads are strided views of the projection buffers: no split or concat copies.
#include "nn/block.h"

#include <algorithm>
#include <cstddef>

#include "core/check.h"
#include "nn/kv_store.h"
#include "nn/profile.h"

namespace mhsa::nn {
namespace {

struct Dims {
  int64_t C, Hq, Hkv, D, Nq, Nkv, N, F;
};

Dims dims(const ModelConfig& c) {
  const int64_t Nq = c.num_heads * c.head_dim, Nkv = c.num_kv_heads * c.head_dim;
  return {c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, Nq, Nkv, Nq + 2 * Nkv, c.intermediate_size};
}

// Heads of a [B, T, width] buffer as a [B, H, T, D] view starting at column `col`.
TensorView heads_view(float* base, int64_t B, int64_t T, int64_t width, int64_t col, int64_t H, int64_t D) {
  return {base + col, {B, H, T, D}, {T * width, D, width, 1}};
}

Tensor copy_of(const float* x, int64_t rows, int64_t cols) {
  Tensor t({rows, cols});
  std::copy_n(x, rows * cols, t.data());
  return t;
}

// The gradient of parameter i, or null where it has none (i < 0) or is frozen (left undefined).
Tensor* grad_of(std::vector<Tensor>& grads, int i) {
  return i >= 0 && grads[static_cast<size_t>(i)].defined() ? &grads[static_cast<size_t>(i)] : nullptr;
}
float* grad_or_null(std::vector<Tensor>& grads, int i) {
  Tensor* g = grad_of(grads, i);
  return g ? g->data() : nullptr;
}

// y [rows, out] (ldy) += scale·(x·Aᵀ)·Bᵀ where l's weight has a LoRA adapter (A [r, in], B [out, r]).
void lora_forward(const Stack& s, const LinearRef& l, int64_t rows, const float* x, int64_t ldx, float* y, int64_t ldy) {
  const Stack::Lora* ad = s.adapter(l.w);
  if (!ad) return;
  const Tensor &a = s.p(ad->a), &b = s.p(ad->b);
  const int64_t r = a.dim(0), out = b.dim(0);
  Tensor xa({rows, r}), delta({rows, out});  // [rows, r], [rows, out]
  linear_forward(rows, x, ldx, a, Layout::out_in, nullptr, xa.data(), r);
  for (int64_t i = 0; i < rows * r; ++i) xa.data()[i] *= ad->scale;
  linear_forward(rows, xa.data(), r, b, Layout::out_in, nullptr, delta.data(), out);
#pragma omp parallel for schedule(static) if (rows * out >= (int64_t{1} << 16))
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < out; ++j) y[i * ldy + j] += delta.data()[i * out + j];
}

// From dy [rows, out] through l's adapter: dB += dyᵀ·(scale·x·Aᵀ), dA += (scale·dy·B)ᵀ·x (each
// where not frozen), dx [rows, in] += scale·dy·B·A. x·Aᵀ is recomputed (r columns: cheap).
void lora_backward(const Stack& s, const LinearRef& l, int64_t rows, const float* x, int64_t ldx, const float* dy,
                   int64_t ldy, float* dx, int64_t lddx, std::vector<Tensor>& grads) {
  const Stack::Lora* ad = s.adapter(l.w);
  if (!ad) return;
  const Tensor &a = s.p(ad->a), &b = s.p(ad->b);
  const int64_t r = a.dim(0);
  Tensor xa({rows, r}), dxa({rows, r});  // [rows, r]
  linear_forward(rows, x, ldx, a, Layout::out_in, nullptr, xa.data(), r);
  for (int64_t i = 0; i < rows * r; ++i) xa.data()[i] *= ad->scale;
  linear_backward(rows, xa.data(), r, dy, ldy, b, Layout::out_in, grad_of(grads, ad->b), nullptr, dxa.data(), r, false);
  for (int64_t i = 0; i < rows * r; ++i) dxa.data()[i] *= ad->scale;
  linear_backward(rows, x, ldx, dxa.data(), r, a, Layout::out_in, grad_of(grads, ad->a), nullptr, dx, lddx, dx != nullptr);
}

void linear(const Stack& s, const LinearRef& l, int64_t rows, const float* x, int64_t ldx, float* y, int64_t ldy) {
  if (const HalfMatrix* w16 = s.p16(l.w)) linear_forward(rows, x, ldx, *w16, s.data_or_null(l.b), y, ldy);
  else if (const Q8Matrix* w8 = s.p8(l.w)) linear_forward(rows, x, ldx, *w8, s.data_or_null(l.b), y, ldy);
  else if (const Q4Matrix* w4 = s.p4(l.w)) linear_forward(rows, x, ldx, *w4, s.data_or_null(l.b), y, ldy);
  else linear_forward(rows, x, ldx, s.p(l.w), l.layout, s.data_or_null(l.b), y, ldy);
  lora_forward(s, l, rows, x, ldx, y, ldy);
}

LinearOut out_of(const Stack& s, const LinearRef& l, float* y, int64_t ldy) {
  return {&s.p(l.w), l.layout, s.data_or_null(l.b), y, ldy, s.p16(l.w), s.p8(l.w), s.p4(l.w)};
}

void linear_grad(const Stack& s, const LinearRef& l, int64_t rows, const float* x, int64_t ldx, const float* dy,
                 int64_t ldy, float* dx, int64_t lddx, bool accumulate, std::vector<Tensor>& grads) {
  Tensor* dw = grad_of(grads, l.w);
  if (const HalfMatrix* w16 = s.p16(l.w))  // bf16 training: dx from the copy the forward read
    linear_backward(rows, x, ldx, dy, ldy, *w16, l.layout, dw, grad_or_null(grads, l.b), dx, lddx, accumulate);
  else
    linear_backward(rows, x, ldx, dy, ldy, s.p(l.w), l.layout, dw, grad_or_null(grads, l.b), dx, lddx, accumulate);
  lora_backward(s, l, rows, x, ldx, dy, ldy, dx, lddx, grads);
}

NormSpec head_norm(const Stack& s) { return {NormKind::rms_norm, s.norm().eps, s.norm().offset}; }

// The q/k norms as rows of a norm: each head its own row (Qwen3), or all of q one row and all of k
// another (OLMo-2's full-width norms).
struct QkNormShape {
  int64_t q_groups, q_width, k_groups, k_width;
};
QkNormShape qk_norm_shape(const Stack& s, const Dims& d) {
  if (s.config->qk_norm_full_width) return {1, d.Nq, 1, d.Nkv};
  return {d.Hq, d.D, d.Hkv, d.D};
}

// ---- attention -------------------------------------------------------------------------------

// qkv [rows, N] = q | k | v of h [rows, C], with the q/k norms and RoPE applied; qkv0 receives the
// projections before the norms (for the backward) when given.
void project_qkv(const Stack& s, const LayerRefs& L, const Dims& d, int64_t rows, const RopeTable* rope,
                 const float* h, float* qkv, Tensor* qkv0) {
  if (L.qkv.w >= 0) {
    linear(s, L.qkv, rows, h, d.C, qkv, d.N);
  } else {
    const LinearOut outs[] = {out_of(s, L.q, qkv, d.N), out_of(s, L.k, qkv + d.Nq, d.N),
                              out_of(s, L.v, qkv + d.Nq + d.Nkv, d.N)};
    linear_forward_many(rows, h, d.C, outs);
    lora_forward(s, L.q, rows, h, d.C, qkv, d.N);
    lora_forward(s, L.k, rows, h, d.C, qkv + d.Nq, d.N);
    lora_forward(s, L.v, rows, h, d.C, qkv + d.Nq + d.Nkv, d.N);
  }
  if (L.q_norm >= 0) {
    if (qkv0) *qkv0 = copy_of(qkv, rows, d.N);
    const NormSpec ns = head_norm(s);
    const QkNormShape qs = qk_norm_shape(s, d);
    for (int64_t r = 0; r < rows; ++r) {
      float* q = qkv + r * d.N;
      norm_forward(ns, qs.q_groups, qs.q_width, q, qs.q_width, s.p(L.q_norm).data(), nullptr, q, qs.q_width);
      norm_forward(ns, qs.k_groups, qs.k_width, q + d.Nq, qs.k_width, s.p(L.k_norm).data(), nullptr, q + d.Nq,
                   qs.k_width);
    }
  }
  if (s.config->positions == PositionKind::rotary)
    rope_forward(*rope, rows, d.Hq + d.Hkv, d.D, qkv, d.N);  // q and k: adjacent heads of each row
}

// ctx [B, T, Hq·D] = the attention of the q heads of qkv [B, T, N] over `cache`, after their k
// and v heads are appended to it.
void attend_over_cache(const Dims& d, int64_t B, int64_t T, float* qkv, float* ctx, KVCache& cache,
                       const AttentionOptions& opt) {
  cache.append(heads_view(qkv, B, T, d.N, d.Nq, d.Hkv, d.D), heads_view(qkv, B, T, d.N, d.Nq + d.Nkv, d.Hkv, d.D));
  const ConstTensorView q = heads_view(qkv, B, T, d.N, 0, d.Hq, d.D);
  const TensorView out = heads_view(ctx, B, T, d.Nq, 0, d.Hq, d.D);
  with_kv_type(cache.type().key, [&](auto key) {
    with_kv_type(cache.type().value, [&](auto value) {
      using K = decltype(key);
      using V = decltype(value);
      if constexpr (std::is_same_v<K, float> && std::is_same_v<V, float>) {
        scaled_dot_product_attention(q, cache.keys(), cache.values(), out, opt);
      } else {  // a 16-bit or q8_0 cache, read as it is
        scaled_dot_product_attention(q, cache.keys_as<K>(), cache.values_as<V>(), out, opt);
      }
    });
  });
}

// Writes the k and v heads of qkv [T, N] into a paged sequence's blocks of `layer` at positions
// seq.length onwards (stored in the pool's types), and returns its blocks of keys and values
// (length + T tokens) for the kernel, which walks them in place: no gather.
template <class K, class V>
PagedKVOf<K, V> write_pages(const Dims& d, int64_t layer, int64_t T, const float* qkv, const PagedSequence& seq,
                            std::vector<const K*>& kb, std::vector<const V*>& vb) {
  KVBlockPool& pool = *seq.pool;
  const int64_t bs = pool.block_tokens();
  const KVTypes type = pool.type();
  const int64_t k_row = kv_row_bytes(type.key, d.D), v_row = kv_row_bytes(type.value, d.D);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = seq.length + t;
    const int32_t b = seq.blocks[static_cast<size_t>(pos / bs)];
    const float* row = qkv + t * d.N;
    auto* k = static_cast<std::byte*>(pool.keys(layer, b)) + (pos % bs) * k_row;
    auto* v = static_cast<std::byte*>(pool.values(layer, b)) + (pos % bs) * v_row;
    for (int64_t h = 0; h < d.Hkv; ++h) {
      store_kv(type.key, row + d.Nq + h * d.D, d.D, k + h * bs * k_row);
      store_kv(type.value, row + d.Nq + d.Nkv + h * d.D, d.D, v + h * bs * v_row);
    }
  }
  const int64_t length = seq.length + T;
  const size_t blocks = static_cast<size_t>(pool.blocks_for(length));
  kb.resize(blocks);
  vb.resize(blocks);
  for (size_t i = 0; i < blocks; ++i) {
    kb[i] = static_cast<const K*>(pool.keys(layer, seq.blocks[i]));
    vb[i] = static_cast<const V*>(pool.values(layer, seq.blocks[i]));
  }
  return PagedKVOf<K, V>{kb, vb, bs, length, d.Hkv, d.D, d.D};
}

// A batched step's attention: every sequence's new keys and values appended to its own cache or
// written to its pages, then all sequences' attention in one call (the decoding ones in one
// parallel region over all their heads). qkv [rows, N] and ctx [rows, Nq] hold the sequences'
// rows in turn. Sequences whose caches differ in element types are attended one pair of types at
// a time.
void attend_sequences(const Dims& d, int64_t layer, float* qkv, float* ctx, std::span<const SeqRows> seqs,
                      const AttentionOptions& opt) {
  const auto type_of = [](const SeqRows& s) { return s.paged ? s.paged->pool->type() : s.cache->type(); };
  std::vector<int64_t> first(seqs.size());  // each sequence's first row
  for (size_t i = 0, r0 = 0; i < seqs.size(); r0 += static_cast<size_t>(seqs[i++].rows)) first[i] = static_cast<int64_t>(r0);
  std::vector<KVTypes> types;  // the pairs present, in order of first appearance
  for (const SeqRows& s : seqs)
    if (std::find(types.begin(), types.end(), type_of(s)) == types.end()) types.push_back(type_of(s));
  for (const KVTypes type : types) {
    with_kv_type(type.key, [&](auto key) {
      with_kv_type(type.value, [&](auto value) {
        using K = decltype(key);
        using V = decltype(value);
        std::vector<std::vector<const K*>> k_blocks(seqs.size());
        std::vector<std::vector<const V*>> v_blocks(seqs.size());
        std::vector<PagedKVOf<K, V>> paged(seqs.size());  // sized once: the items point into it
        std::vector<AttentionBatchItem<K, V>> items;
        for (size_t i = 0; i < seqs.size(); ++i) {
          const SeqRows& seq = seqs[i];
          if (type_of(seq) != type) continue;
          float* q = qkv + first[i] * d.N;
          AttentionBatchItem<K, V> item;
          item.q = heads_view(q, 1, seq.rows, d.N, 0, d.Hq, d.D);
          item.out = heads_view(ctx + first[i] * d.Nq, 1, seq.rows, d.Nq, 0, d.Hq, d.D);
          if (seq.paged) {
            paged[i] = write_pages<K, V>(d, layer, seq.rows, q, *seq.paged, k_blocks[i], v_blocks[i]);
            item.paged = &paged[i];
          } else {
            KVCache& cache = *seq.cache;
            cache.append(heads_view(q, 1, seq.rows, d.N, d.Nq, d.Hkv, d.D),
                         heads_view(q, 1, seq.rows, d.N, d.Nq + d.Nkv, d.Hkv, d.D));
            item.k = cache.keys_as<K>();
            item.v = cache.values_as<V>();
          }
          items.push_back(item);
        }
        scaled_dot_product_attention<K, V>(std::span<const AttentionBatchItem<K, V>>(items), opt);
      });
    });
  }
}

// y [rows, C] = attention(h [rows, C]) of layer `layer`.
void attention_forward(const Stack& s, int64_t layer, const float* h, float* y, const BlockRun& run) {
  const LayerRefs& L = s.layers[static_cast<size_t>(layer)];
  const Dims d = dims(*s.config);
  const int64_t B = run.B, T = run.T, rows = B * T;
  Tensor qkv({rows, d.N});  // [rows, q | k | v]
  {
    const profile::Scope phase(profile::Phase::qkv);
    project_qkv(s, L, d, rows, run.rope, h, qkv.data(), run.tape ? &run.tape->qkv0 : nullptr);
  }
  const AttentionOptions opt = attention_options(s, layer);
  Tensor ctx({rows, d.Nq});  // heads side by side: [B, T, Hq·D]
  profile::Scope phase(profile::Phase::attention);
  if (!run.seqs.empty()) {
    attend_sequences(d, layer, qkv.data(), ctx.data(), run.seqs, opt);  // a batched step
  } else if (run.cache) {
    attend_over_cache(d, B, T, qkv.data(), ctx.data(), *run.cache, opt);
  } else {
    const TensorView ctx_heads = heads_view(ctx.data(), B, T, d.Nq, 0, d.Hq, d.D);
    const ConstTensorView q = heads_view(qkv.data(), B, T, d.N, 0, d.Hq, d.D);
    const ConstTensorView k = heads_view(qkv.data(), B, T, d.N, d.Nq, d.Hkv, d.D);
    Tensor lse = run.tape || run.probs ? Tensor({B, d.Hq, T}) : Tensor();  // [B, Hq, T]
    scaled_dot_product_attention(q, k, heads_view(qkv.data(), B, T, d.N, d.Nq + d.Nkv, d.Hkv, d.D), ctx_heads, opt,
                                 lse.defined() ? lse.view() : TensorView{});
    if (run.probs) *run.probs = attention_probabilities(q, k, lse.view(), opt);
    if (run.tape) run.tape->lse = std::move(lse);
  }
  phase.next(profile::Phase::out_proj);
  linear(s, L.o, rows, ctx.data(), d.Nq, y, d.C);
  if (run.tape) {
    run.tape->qkv = std::move(qkv);
    run.tape->ctx = std::move(ctx);
  }
}

// dh [rows, C] = ∂loss/∂h from dy [rows, C] = ∂loss/∂y; parameter gradients added.
void attention_backward(const Stack& s, int64_t layer, const BlockTape& t, int64_t B, int64_t T,
                        const RopeTable& rope, const float* dy, float* dh, std::vector<Tensor>& grads) {
  const LayerRefs& L = s.layers[static_cast<size_t>(layer)];
  const Dims d = dims(*s.config);
  const int64_t rows = B * T;
  Tensor dctx({rows, d.Nq});
  linear_grad(s, L.o, rows, t.ctx.data(), d.Nq, dy, d.C, dctx.data(), d.Nq, false, grads);
  Tensor dqkv({rows, d.N});  // [rows, dq | dk | dv]
  float* qkv = const_cast<float*>(t.qkv.data());  // read only: the views are mutable-typed
  float* ctx = const_cast<float*>(t.ctx.data());
  scaled_dot_product_attention_backward(
      heads_view(dctx.data(), B, T, d.Nq, 0, d.Hq, d.D), heads_view(qkv, B, T, d.N, 0, d.Hq, d.D),
      heads_view(qkv, B, T, d.N, d.Nq, d.Hkv, d.D), heads_view(qkv, B, T, d.N, d.Nq + d.Nkv, d.Hkv, d.D),
      heads_view(ctx, B, T, d.Nq, 0, d.Hq, d.D), t.lse.view(), heads_view(dqkv.data(), B, T, d.N, 0, d.Hq, d.D),
      heads_view(dqkv.data(), B, T, d.N, d.Nq, d.Hkv, d.D), heads_view(dqkv.data(), B, T, d.N, d.Nq + d.Nkv, d.Hkv, d.D),
      attention_options(s, layer));
  if (s.config->positions == PositionKind::rotary) rope_backward(rope, rows, d.Hq + d.Hkv, d.D, dqkv.data(), d.N);
  if (L.q_norm >= 0) {
    const NormSpec ns = head_norm(s);
    const QkNormShape qs = qk_norm_shape(s, d);
    Tensor dpre({d.Nq + d.Nkv});
    for (int64_t r = 0; r < rows; ++r) {
      float* g = dqkv.data() + r * d.N;
      const float* x0 = t.qkv0.data() + r * d.N;
      std::fill_n(dpre.data(), dpre.numel(), 0.0f);
      norm_backward(ns, qs.q_groups, qs.q_width, x0, s.p(L.q_norm).data(), g, dpre.data(), grad_or_null(grads, L.q_norm),
                    nullptr);
      norm_backward(ns, qs.k_groups, qs.k_width, x0 + d.Nq, s.p(L.k_norm).data(), g + d.Nq, dpre.data() + d.Nq,
                    grad_or_null(grads, L.k_norm), nullptr);
      std::copy_n(dpre.data(), dpre.numel(), g);
    }
  }
  if (L.qkv.w >= 0) {
    linear_grad(s, L.qkv, rows, t.h1.data(), d.C, dqkv.data(), d.N, dh, d.C, false, grads);
  } else {
    linear_grad(s, L.q, rows, t.h1.data(), d.C, dqkv.data(), d.N, dh, d.C, false, grads);
    linear_grad(s, L.k, rows, t.h1.data(), d.C, dqkv.data() + d.Nq, d.N, dh, d.C, true, grads);
    linear_grad(s, L.v, rows, t.h1.data(), d.C, dqkv.data() + d.Nq + d.Nkv, d.N, dh, d.C, true, grads);
  }
}

// ---- MLP -------------------------------------------------------------------------------------

// m [rows, C] = mlp(h [rows, C]); the tape keeps z, u (and act) when given.
void mlp_forward(const Stack& s, const LayerRefs& L, int64_t rows, const float* h, float* m, BlockTape* tape) {
  const Dims d = dims(*s.config);
  const MlpKind kind = s.config->mlp;
  Tensor z({rows, d.F});
  profile::Scope phase(profile::Phase::mlp_in);
  if (kind == MlpKind::gelu) {
    linear(s, L.fc, rows, h, d.C, z.data(), d.F);
    phase.next(profile::Phase::activation);
    Tensor u = tape ? z : Tensor();  // in place when nothing is recorded
    float* a = tape ? u.data() : z.data();
    gelu_forward(rows * d.F, a);
    phase.next(profile::Phase::mlp_out);
    linear(s, L.proj, rows, a, d.F, m, d.C);
    if (tape) {
      tape->z = std::move(z);
      tape->u = std::move(u);
    }
    return;
  }
  Tensor u({rows, d.F}), act({rows, d.F});
  const LinearOut outs[] = {out_of(s, L.gate, z.data(), d.F), out_of(s, L.up, u.data(), d.F)};
  linear_forward_many(rows, h, d.C, outs);
  lora_forward(s, L.gate, rows, h, d.C, z.data(), d.F);
  lora_forward(s, L.up, rows, h, d.C, u.data(), d.F);
  phase.next(profile::Phase::activation);
  gated_forward(kind, rows, d.F, z.data(), u.data(), act.data());
  phase.next(profile::Phase::mlp_out);
  linear(s, L.down, rows, act.data(), d.F, m, d.C);
  if (tape) {
    tape->z = std::move(z);
    tape->u = std::move(u);
    tape->act = std::move(act);
  }
}

// dh [rows, C] = ∂loss/∂h from dm [rows, C].
void mlp_backward(const Stack& s, const LayerRefs& L, const BlockTape& t, int64_t rows, const float* dm, float* dh,
                  std::vector<Tensor>& grads) {
  const Dims d = dims(*s.config);
  const MlpKind kind = s.config->mlp;
  if (kind == MlpKind::gelu) {
    Tensor du({rows, d.F});
    linear_grad(s, L.proj, rows, t.u.data(), d.F, dm, d.C, du.data(), d.F, false, grads);
    gelu_backward(rows * d.F, t.z.data(), du.data(), du.data());
    linear_grad(s, L.fc, rows, t.h2.data(), d.C, du.data(), d.F, dh, d.C, false, grads);
    return;
  }
  Tensor dact({rows, d.F}), dz({rows, d.F}), du({rows, d.F});
  linear_grad(s, L.down, rows, t.act.data(), d.F, dm, d.C, dact.data(), d.F, false, grads);
  gated_backward(kind, rows, d.F, t.z.data(), t.u.data(), dact.data(), dz.data(), du.data());
  linear_grad(s, L.gate, rows, t.h2.data(), d.C, dz.data(), d.F, dh, d.C, false, grads);
  linear_grad(s, L.up, rows, t.h2.data(), d.C, du.data(), d.F, dh, d.C, true, grads);
}

}  // namespace

NormSpec Stack::norm() const {
  return {config->norm, static_cast<float>(config->norm_eps), config->norm_weight_offset};
}

AttentionOptions attention_options(const Stack& s, int64_t layer) {
  AttentionOptions o;
  o.causal = true;  // bottom-right: a cache's new rows are the last of the sequence
  const ModelConfig& c = *s.config;
  if (c.attention_scale > 0) o.scale = c.attention_scale;
  if (c.attn_logit_softcap > 0) o.softcap = c.attn_logit_softcap;
  o.window.left = c.window_left.empty() ? -1 : c.window_left[static_cast<size_t>(layer)];
  return o;
}

// ---- the block -------------------------------------------------------------------------------

// h [rows, C] = norm(x) where the block has a norm before attention / the MLP (w ≥ 0), else x
// itself (OLMo-2 normalises only after them).
void pre_norm(const Stack& s, int w, int b, int64_t rows, const float* x, float* h) {
  const int64_t C = s.config->hidden_size;
  if (w < 0) {
    std::copy_n(x, rows * C, h);
    return;
  }
  norm_forward(s.norm(), rows, C, x, C, s.p(w).data(), s.data_or_null(b), h, C);
}

// dx += the gradient through pre_norm of dh [rows, C] at its input x.
void pre_norm_backward(const Stack& s, int w, int b, int64_t rows, const float* x, const float* dh, float* dx,
                       std::vector<Tensor>& grads) {
  const int64_t C = s.config->hidden_size;
  if (w < 0) {
    add_into(dx, dh, rows * C);
    return;
  }
  norm_backward(s.norm(), rows, C, x, s.p(w).data(), dh, dx, grad_or_null(grads, w), grad_or_null(grads, b));
}

void block_forward(const Stack& s, int64_t layer, float* x, const BlockRun& run) {
  const LayerRefs& L = s.layers[static_cast<size_t>(layer)];
  const NormSpec ns = s.norm();
  const int64_t C = s.config->hidden_size, rows = run.B * run.T;
  BlockTape* tape = run.tape;
  if (tape) tape->x_in = copy_of(x, rows, C);
  Tensor h({rows, C}), a({rows, C});  // [rows, C]
  profile::Scope phase(profile::Phase::norm);
  pre_norm(s, L.norm1_w, L.norm1_b, rows, x, h.data());
  phase.stop();  // (attention_forward times its own phases)
  attention_forward(s, layer, h.data(), a.data(), run);
  if (tape) tape->a = L.post_norm1_w >= 0 ? copy_of(a.data(), rows, C) : a;
  phase.next(profile::Phase::norm);
  if (L.post_norm1_w >= 0) norm_forward(ns, rows, C, a.data(), C, s.p(L.post_norm1_w).data(), nullptr, a.data(), C);
  phase.next(profile::Phase::residual);
  add_into(x, a.data(), rows * C);
  if (tape) {
    tape->h1 = std::move(h);
    tape->x_mid = copy_of(x, rows, C);
    h = Tensor({rows, C});
  }
  phase.next(profile::Phase::norm);
  pre_norm(s, L.norm2_w, L.norm2_b, rows, x, h.data());
  phase.stop();
  Tensor& m = a;  // [rows, C], reused
  mlp_forward(s, L, rows, h.data(), m.data(), tape);
  phase.next(profile::Phase::norm);
  if (L.post_norm2_w >= 0) {
    if (tape) tape->m = copy_of(m.data(), rows, C);
    norm_forward(ns, rows, C, m.data(), C, s.p(L.post_norm2_w).data(), nullptr, m.data(), C);
  }
  phase.next(profile::Phase::residual);
  add_into(x, m.data(), rows * C);
  if (tape) tape->h2 = std::move(h);
}

void block_backward(const Stack& s, int64_t layer, const BlockTape& t, int64_t B, int64_t T, const RopeTable& rope,
                    float* dx, std::vector<Tensor>& grads) {
  const LayerRefs& L = s.layers[static_cast<size_t>(layer)];
  const NormSpec ns = s.norm();
  const int64_t C = s.config->hidden_size, rows = B * T;
  // x_out = x_mid + post_norm₂(mlp(norm₂(x_mid)))
  Tensor dpost;  // [rows, C] the gradient before a post norm
  const float* dm = dx;
  if (L.post_norm2_w >= 0) {
    dpost = Tensor({rows, C});
    norm_backward(ns, rows, C, t.m.data(), s.p(L.post_norm2_w).data(), dx, dpost.data(),
                  grad_or_null(grads, L.post_norm2_w), nullptr);
    dm = dpost.data();
  }
  Tensor dh({rows, C});
  mlp_backward(s, L, t, rows, dm, dh.data(), grads);
  pre_norm_backward(s, L.norm2_w, L.norm2_b, rows, t.x_mid.data(), dh.data(), dx, grads);
  // x_mid = x_in + post_norm₁(attention(norm₁(x_in)))
  const float* da = dx;
  if (L.post_norm1_w >= 0) {
    std::fill_n(dpost.data(), dpost.numel(), 0.0f);
    norm_backward(ns, rows, C, t.a.data(), s.p(L.post_norm1_w).data(), dx, dpost.data(),
                  grad_or_null(grads, L.post_norm1_w), nullptr);
    da = dpost.data();
  }
  attention_backward(s, layer, t, B, T, rope, da, dh.data(), grads);
  pre_norm_backward(s, L.norm1_w, L.norm1_b, rows, t.x_in.data(), dh.data(), dx, grads);
}

// ---- the stack -------------------------------------------------------------------------------

std::vector<HalfPart> half_parts(const Stack& s) {
  std::vector<HalfPart> parts;
  const auto add = [&](const LinearRef& l) {
    if (l.w >= 0) parts.push_back({l.w, l.layout == Layout::in_out});
  };
  for (const LayerRefs& r : s.layers)
    for (const LinearRef* l : {&r.qkv, &r.q, &r.k, &r.v, &r.o, &r.fc, &r.proj, &r.gate, &r.up, &r.down}) add(*l);
  parts.push_back({s.embed, false});
  if (s.head >= 0) parts.push_back({s.head, false});
  return parts;
}

RopeTable rope_positions(const Stack& s, int64_t rows, int64_t T, int64_t pos0) {
  return s.config->positions == PositionKind::rotary ? rope_table(s.rope, rows, T, pos0) : RopeTable();
}

void embed_forward(const Stack& s, std::span<const int32_t> ids, int64_t T, int64_t pos0, float* x, bool positions) {
  const profile::Scope phase(profile::Phase::embed);
  const auto rows = static_cast<int64_t>(ids.size());
  const Tensor* wpe = positions && s.pos >= 0 ? &s.p(s.pos) : nullptr;
  const float scale = s.config->embedding_scale;
  if (const HalfMatrix* w16 = s.p16(s.embed)) return embedding_forward(rows, T, pos0, ids.data(), *w16, wpe, scale, x);
  if (const Q8Matrix* w8 = s.p8(s.embed)) return embedding_forward(rows, T, pos0, ids.data(), *w8, wpe, scale, x);
  if (const Q4Matrix* w4 = s.p4(s.embed)) return embedding_forward(rows, T, pos0, ids.data(), *w4, wpe, scale, x);
  if (const BlockedMatrix* wb = s.pb(s.embed)) return embedding_forward(rows, T, pos0, ids.data(), *wb, wpe, scale, x);
  embedding_forward(rows, T, pos0, ids.data(), s.p(s.embed), wpe, scale, x);
}

namespace {

// logits [rows, V] of the final norm of x [rows, C] (rows ldx apart).
void final_logits(const Stack& s, int64_t rows, const float* x, int64_t ldx, float* logits) {
  const profile::Scope phase(profile::Phase::head);
  const ModelConfig& c = *s.config;
  const int64_t C = c.hidden_size;
  Tensor h({rows, C});
  norm_forward(s.norm(), rows, C, x, ldx, s.p(s.final_norm_w).data(), s.data_or_null(s.final_norm_b), h.data(), C);
  if (const HalfMatrix* w16 = s.output_matrix16())
    lm_head_forward(rows, h.data(), C, *w16, c.final_logit_softcap, logits);
  else if (const Q8Matrix* w8 = s.output_matrix8())
    lm_head_forward(rows, h.data(), C, *w8, c.final_logit_softcap, logits);
  else if (const Q4Matrix* w4 = s.output_matrix4())
    lm_head_forward(rows, h.data(), C, *w4, c.final_logit_softcap, logits);
  else if (const BlockedMatrix* wb = s.output_matrix_blocked())
    lm_head_forward(rows, h.data(), C, *wb, c.final_logit_softcap, logits);
  else
    lm_head_forward(rows, h.data(), C, s.output_matrix(), c.final_logit_softcap, logits);
}

}  // namespace

namespace {

// The last block's output [B, T, C] (stack_forward's, before the final norm).
Tensor blocks_forward(const Stack& s, std::span<const int32_t> ids, int64_t B, int64_t T, std::vector<KVCache>* caches,
                      std::vector<Tensor>* probs) {
  const int64_t C = s.config->hidden_size, rows = B * T;
  const int64_t pos0 = caches ? (*caches)[0].length() : 0;
  Tensor x({B, T, C});
  embed_forward(s, ids, T, pos0, x.data());
  if (probs) probs->assign(s.layers.size(), Tensor());
  const RopeTable rope = rope_positions(s, rows, T, pos0);
  for (size_t l = 0; l < s.layers.size(); ++l) {
    BlockRun run{B, T, &rope, caches ? &(*caches)[l] : nullptr, nullptr, probs ? &(*probs)[l] : nullptr, {}};
    block_forward(s, static_cast<int64_t>(l), x.data(), run);
  }
  return x;
}

}  // namespace

Tensor stack_hidden(const Stack& s, std::span<const int32_t> ids, int64_t B, int64_t T, std::vector<KVCache>* caches) {
  const int64_t C = s.config->hidden_size;
  const Tensor x = blocks_forward(s, ids, B, T, caches, nullptr);
  Tensor h({B, T, C});
  norm_forward(s.norm(), B * T, C, x.data(), C, s.p(s.final_norm_w).data(), s.data_or_null(s.final_norm_b), h.data(), C);
  return h;
}

Tensor stack_forward(const Stack& s, std::span<const int32_t> ids, int64_t B, int64_t T, std::vector<KVCache>* caches,
                     bool last_only, std::vector<Tensor>* probs) {
  const ModelConfig& c = *s.config;
  const int64_t C = c.hidden_size, V = c.vocab_size, rows = B * T;
  const Tensor x = blocks_forward(s, ids, B, T, caches, probs);
  // Final norm and logits, for every row or only each sequence's last.
  Tensor logits({B, last_only ? 1 : T, V});
  final_logits(s, last_only ? B : rows, x.data() + (last_only ? (T - 1) * C : 0), last_only ? T * C : C, logits.data());
  return logits;
}

Tensor stack_step(const Stack& s, std::span<const SeqStep> seqs) {
  const ModelConfig& c = *s.config;
  const int64_t C = c.hidden_size;
  std::vector<PositionRun> runs;  // each sequence's positions
  int64_t rows = 0;
  for (const SeqStep& q : seqs) {
    runs.push_back({q.paged ? q.paged->length : (*q.caches)[0].length(), static_cast<int64_t>(q.ids.size())});
    rows += runs.back().rows;
  }
  Tensor x({rows, C});  // every sequence's rows, one after another
  int64_t r0 = 0;
  for (size_t i = 0; i < seqs.size(); r0 += runs[i++].rows)
    embed_forward(s, seqs[i].ids, runs[i].rows, runs[i].pos0, x.data() + r0 * C);
  const RopeTable rope = c.positions == PositionKind::rotary ? rope_table(s.rope, runs) : RopeTable();
  std::vector<SeqRows> layer_seqs(seqs.size());
  for (size_t l = 0; l < s.layers.size(); ++l) {
    for (size_t i = 0; i < seqs.size(); ++i)
      layer_seqs[i] = {seqs[i].paged ? nullptr : &(*seqs[i].caches)[l], runs[i].rows, seqs[i].paged};
    BlockRun run{1, rows, &rope, nullptr, nullptr, nullptr, layer_seqs};
    block_forward(s, static_cast<int64_t>(l), x.data(), run);
  }
  for (size_t i = 0; i < seqs.size(); ++i)
    if (seqs[i].paged) seqs[i].paged->length += runs[i].rows;
  int64_t out_rows = 0;
  for (const SeqStep& q : seqs) out_rows += q.logit_rows;
  Tensor last({out_rows, C});  // each sequence's last logit_rows rows
  r0 = 0;
  int64_t o0 = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    r0 += runs[i].rows;
    std::copy_n(x.data() + (r0 - seqs[i].logit_rows) * C, seqs[i].logit_rows * C, last.data() + o0 * C);
    o0 += seqs[i].logit_rows;
  }
  Tensor logits({out_rows, 1, c.vocab_size});
  final_logits(s, out_rows, last.data(), C, logits.data());
  return logits;
}

namespace {

// Marks layer r's parameters in done, its LoRA adapters' too.
void mark_layer(const Stack& s, const LayerRefs& r, std::vector<char>& done) {
  for (int i : {r.norm1_w, r.norm1_b, r.post_norm1_w, r.qkv.w, r.qkv.b, r.q.w, r.q.b, r.k.w, r.k.b, r.v.w, r.v.b,
                r.q_norm, r.k_norm, r.o.w, r.o.b, r.norm2_w, r.norm2_b, r.post_norm2_w, r.fc.w, r.fc.b, r.proj.w,
                r.proj.b, r.gate.w, r.gate.b, r.up.w, r.up.b, r.down.w, r.down.b})
    if (i >= 0) {
      done[static_cast<size_t>(i)] = 1;
      if (const Stack::Lora* ad = s.adapter(i)) done[static_cast<size_t>(ad->a)] = done[static_cast<size_t>(ad->b)] = 1;
    }
}

// Tells on_final the longest run of done parameters that ends the list, when it grew.
void report_final(const std::vector<char>& done, size_t& first, const std::function<void(size_t)>& on_final) {
  size_t f = first;
  while (f > 0 && done[f - 1]) --f;
  if (f < first && on_final) on_final(f);
  first = f;
}

}  // namespace

double stack_loss(const Stack& s, std::span<const int32_t> ids, std::span<const int32_t> targets, int64_t B, int64_t T,
                  int64_t counted, std::vector<Tensor>* grads, const std::function<void(size_t)>& on_final) {
  const ModelConfig& c = *s.config;
  const int64_t C = c.hidden_size, rows = B * T;
  for (size_t i = 0; grads && i < s.half.size(); ++i)  // bf16 training has master weights; a bf16 model none
    if (s.half[i] && !s.params[i]->defined() && (*grads)[i].defined())  // (a frozen one needs none)
      detail::fail("stack_loss", "grads", "float32 weights (16-bit weights are for inference only)",
                   s.half[i]->format == HalfFormat::f16 ? "f16 weights" : "bf16 weights");
  if (grads && !s.q4.empty())
    detail::fail("stack_loss", "grads", "float32 weights (4-bit weights are for inference only)", "q4_k weights");
  if (grads && !s.q8.empty())
    detail::fail("stack_loss", "grads", "float32 weights (8-bit weights are for inference only)", "q8_0 weights");
  std::vector<BlockTape> tapes(grads ? s.layers.size() : 0);
  Tensor x({B, T, C});
  embed_forward(s, ids, T, 0, x.data());
  const RopeTable rope = rope_positions(s, rows, T, 0);
  for (size_t l = 0; l < s.layers.size(); ++l)
    block_forward(s, static_cast<int64_t>(l), x.data(),
                  BlockRun{B, T, &rope, nullptr, grads ? &tapes[l] : nullptr, nullptr, {}});
  Tensor hf({rows, C});
  norm_forward(s.norm(), rows, C, x.data(), C, s.p(s.final_norm_w).data(), s.data_or_null(s.final_norm_b), hf.data(), C);
  Tensor dhf = grads ? Tensor({rows, C}) : Tensor();
  Tensor* dw = grads ? grad_of(*grads, s.head >= 0 ? s.head : s.embed) : nullptr;
  const HalfMatrix* w16 = s.output_matrix16();
  if (w16 && !grads) return lm_head_loss(rows, hf.data(), *w16, c.final_logit_softcap, targets.data(), counted);
  if (const Q8Matrix* w8 = s.output_matrix8())
    return lm_head_loss(rows, hf.data(), *w8, c.final_logit_softcap, targets.data(), counted);
  if (const Q4Matrix* w4 = s.output_matrix4())
    return lm_head_loss(rows, hf.data(), *w4, c.final_logit_softcap, targets.data(), counted);
  if (const BlockedMatrix* wb = s.output_matrix_blocked()) {
    if (grads) throw Error("stack_loss: a model blocked for inference has no gradients (load it again to train)");
    return lm_head_loss(rows, hf.data(), *wb, c.final_logit_softcap, targets.data(), counted);
  }
  const double loss = w16 ? lm_head_loss(rows, hf.data(), *w16, c.final_logit_softcap, targets.data(), counted,
                                         dhf.data(), dw)
                          : lm_head_loss(rows, hf.data(), s.output_matrix(), c.final_logit_softcap, targets.data(),
                                         counted, grads ? dhf.data() : nullptr, dw);
  if (!grads) return loss;
  std::vector<char> done(s.params.size());  // parameters whose gradient is final
  size_t first = done.size();
  Tensor dx({rows, C});
  norm_backward(s.norm(), rows, C, x.data(), s.p(s.final_norm_w).data(), dhf.data(), dx.data(),
                grad_or_null(*grads, s.final_norm_w), grad_or_null(*grads, s.final_norm_b));
  for (int i : {s.head, s.final_norm_w, s.final_norm_b})  // a tied head is the embedding: final last
    if (i >= 0) done[static_cast<size_t>(i)] = 1;
  report_final(done, first, on_final);
  for (size_t l = s.layers.size(); l-- > 0;) {
    block_backward(s, static_cast<int64_t>(l), tapes[l], B, T, rope, dx.data(), *grads);
    tapes[l] = BlockTape();  // free this block's activations as soon as they are used
    mark_layer(s, s.layers[l], done);
    report_final(done, first, on_final);
  }
  if (Tensor* dwte = grad_of(*grads, s.embed))  // (a frozen embedding: an adapter's training)
    embedding_backward(rows, T, ids.data(), dx.data(), c.embedding_scale, *dwte, grad_of(*grads, s.pos),
                       c.pad_token_id);
  std::fill(done.begin(), done.end(), 1);
  report_final(done, first, on_final);
  return loss;
}

}  // namespace mhsa::nn
