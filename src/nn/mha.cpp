// nn/mha.cpp — MultiHeadAttention (see mha.h): projections through kernels::gemm, heads as
// strided views of the projected buffers (no split or concat copies), attention through the
// public scaled_dot_product_attention.
#include "mhsa/mha.h"

#include <cmath>
#include <random>

#include "core/check.h"
#include "kernels/dispatch.h"
#include "kernels/gemm.h"
#include "nn/linear.h"

namespace mhsa {
namespace {

using nn::add_weight_grads;
using nn::times_transposed;
using nn::transposed;

using detail::check_dim;
using detail::check_tensor;
using detail::fail;
using detail::message;

// A [rows, cols] matrix for the GEMM: the view itself when its rows are evenly spaced and its
// columns contiguous, otherwise a contiguous copy.
struct Rows {
  const float* data;
  int64_t ld;
  Tensor copy;
};

Rows as_rows(const ConstTensorView& x) {  // x [B, T, C]
  const int64_t B = x.shape[0], T = x.shape[1], C = x.shape[2];
  if ((x.stride[2] == 1 || C <= 1) && (x.stride[0] == T * x.stride[1] || B <= 1) && x.stride[1] >= C)
    return {x.data, x.stride[1], {}};
  Tensor copy = contiguous(x);
  return {copy.data(), C, std::move(copy)};
}

// Heads of a [B, T, width] buffer as a [B, H, T, D] view starting at column `col`.
ConstTensorView heads_view(const float* base, int64_t B, int64_t T, int64_t width, int64_t col,
                           int64_t H, int64_t D) {
  return {base + col, {B, H, T, D}, {T * width, D, width, 1}};
}

// x [B, T, K] · w[:, col : col + n] + b[col : col + n]  ->  [B, T, n]   (b may be undefined), on
// the reference GEMM for Backend::reference and the fast one otherwise.
Tensor linear(const Rows& x, int64_t B, int64_t T, const Tensor& w, int64_t col, int64_t n, const Tensor& b,
              Backend backend) {
  Tensor y({B, T, n});
  const auto gemm = backend == Backend::reference ? &kernels::gemm_ref : kernels::kernels().gemm;
  gemm(B * T, n, w.dim(0), x.data, x.ld, w.data() + col, w.dim(1), b.defined() ? b.data() + col : nullptr, y.data(),
       n);
  return y;
}

Rows check_input(const MultiHeadAttention& m, std::string_view fn, std::string_view arg, const ConstTensorView& x) {
  check_tensor(fn, arg, x, 3, "[B, T, C]");
  check_dim(fn, arg, x, 2, m.embed_dim(), "C, the layer's embed_dim");
  return as_rows(x);
}

void check_cache(const MultiHeadAttention& m, std::string_view fn, std::string_view arg, const KVCache& cache,
                 int64_t batch) {
  if (cache.batch() != batch) fail(fn, arg, message("batch ", batch, " (as x)"), message("batch ", cache.batch()));
  if (cache.kv_heads() != m.num_kv_heads() || cache.head_dim() != m.head_dim() || cache.v_head_dim() != m.head_dim())
    fail(fn, arg, message(m.num_kv_heads(), " kv heads of size ", m.head_dim(), " (this layer's)"),
         message(cache.kv_heads(), " kv heads of size ", cache.head_dim(), "/", cache.v_head_dim()));
  if (cache.type() != KVType::f32)  // the layer's caches (new_cache, project_memory) are float32
    fail(fn, arg, "a float32 cache (KVType f32)", message("a ", kv_type_name(cache.type()), " cache"));
}

void record(MhaTape& tape, const MhaOptions& o, const ConstTensorView& x, const ConstTensorView& memory, Tensor qkv,
            Tensor kv) {
  tape.cross = memory.defined();
  tape.x = contiguous(x);
  tape.memory = memory.defined() ? contiguous(memory) : Tensor();
  tape.qkv = std::move(qkv);
  tape.kv = std::move(kv);
  tape.causal = o.causal;
  tape.causal_alignment = o.causal_alignment;
  tape.window = o.window;
  tape.softcap = o.softcap;
  tape.kv_lengths.assign(o.kv_lengths.begin(), o.kv_lengths.end());
  tape.attn_mask = o.attn_mask.defined() ? contiguous(o.attn_mask) : Tensor();
}

AttentionOptions attention_options(const MhaOptions& o) {
  AttentionOptions a;
  a.causal = o.causal;
  a.causal_alignment = o.causal_alignment;
  a.window = o.window;
  a.softcap = o.softcap;
  a.kv_lengths = o.kv_lengths;
  a.attn_mask = o.attn_mask;
  a.backend = o.backend;
  return a;
}

}  // namespace

// Attention of q [B, H, T, D] over k, v [B, Hkv, S, D] into the concatenated heads, then the
// output projection: y [B, T, C]. Fills *weights [B, H, T, S] when it is given.
Tensor MultiHeadAttention::attend(ConstTensorView q, ConstTensorView k, ConstTensorView v,
                                  const AttentionOptions& options, Tensor* weights, MhaTape* tape) const {
  const int64_t B = q.shape[0], H = q.shape[1], T = q.shape[2], D = q.shape[3], C = embed_dim_;
  Tensor ctx({B, T, C});  // heads concatenated: [B, T, H·D]
  const TensorView ctx_heads{ctx.data(), {B, H, T, D}, {T * C, D, C, 1}};
  Tensor lse = weights || tape ? Tensor({B, H, T}) : Tensor();  // [B, H, T]
  scaled_dot_product_attention(q, k, v, ctx_heads, options, lse.defined() ? lse.view() : TensorView{});
  if (weights) *weights = attention_probabilities(q, k, lse.view(), options);
  Tensor y = linear({ctx.data(), C, {}}, B, T, w_o_, 0, C, b_o_, options.backend);
  if (tape) {
    tape->ctx = std::move(ctx);
    tape->lse = std::move(lse);
  }
  return y;
}

MultiHeadAttention::MultiHeadAttention(int64_t embed_dim, int64_t num_heads, int64_t num_kv_heads,
                                       bool bias, uint64_t seed)
    : embed_dim_(embed_dim), num_heads_(num_heads), num_kv_heads_(num_kv_heads == 0 ? num_heads : num_kv_heads) {
  constexpr std::string_view fn = "MultiHeadAttention";
  if (embed_dim <= 0) fail(fn, "embed_dim", "a size > 0", std::to_string(embed_dim));
  if (num_heads <= 0 || embed_dim % num_heads != 0)
    fail(fn, "num_heads", message("a count > 0 dividing embed_dim = ", embed_dim), std::to_string(num_heads));
  if (num_kv_heads_ <= 0 || num_heads % num_kv_heads_ != 0)
    fail(fn, "num_kv_heads", message("a count > 0 dividing num_heads = ", num_heads), std::to_string(num_kv_heads));
  const int64_t C = embed_dim_;
  w_o_ = Tensor({C, C}, "MultiHeadAttention: w_o [C, C]");  // first: C·C fits, so N below cannot overflow
  const int64_t N = C + 2 * kv_dim();
  w_qkv_ = Tensor({C, N}, "MultiHeadAttention: w_qkv [C, C + 2*Ckv]");
  if (bias) {
    b_qkv_ = Tensor({N});
    b_o_ = Tensor({C});
  }
  init_parameters(seed);
}

void MultiHeadAttention::init_parameters(uint64_t seed) {
  std::mt19937_64 gen(seed);
  const auto fill = [&gen](Tensor& t, double bound) {
    std::uniform_real_distribution<double> dist(-bound, bound);
    for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<float>(dist(gen));
  };
  const auto C = static_cast<double>(embed_dim_);
  fill(w_qkv_, std::sqrt(6.0 / (C + static_cast<double>(w_qkv_.dim(1)))));
  fill(w_o_, 1.0 / std::sqrt(C));
  if (has_bias()) {
    fill(b_qkv_, 0.0);
    fill(b_o_, 0.0);
  }
}

const Tensor& MultiHeadAttention::parameter(std::string_view name) const {
  const Tensor* t = name == "w_qkv"   ? &w_qkv_
                    : name == "b_qkv" ? &b_qkv_
                    : name == "w_o"   ? &w_o_
                    : name == "b_o"   ? &b_o_
                                      : nullptr;
  if (!t) fail("MultiHeadAttention::parameter", "name", "one of w_qkv, b_qkv, w_o, b_o", message("'", name, "'"));
  if (!t->defined())
    fail("MultiHeadAttention::parameter", "name", "a parameter this layer has (it was built with bias=false)",
         message("'", name, "'"));
  return *t;
}

Tensor& MultiHeadAttention::parameter(std::string_view name) {
  return const_cast<Tensor&>(static_cast<const MultiHeadAttention*>(this)->parameter(name));
}

void MultiHeadAttention::set_parameter(std::string_view name, ConstTensorView value) {
  Tensor& t = parameter(name);
  const std::string arg(name);
  const auto nd = static_cast<int>(t.shape().size());
  const std::string wanted = shape_string(ConstTensorView(nullptr, t.shape()));
  if (!value.defined() || value.ndim != nd) fail("MultiHeadAttention::set_parameter", arg, wanted, shape_string(value));
  for (int i = 0; i < nd; ++i)
    if (value.shape[i] != t.dim(i)) fail("MultiHeadAttention::set_parameter", arg, wanted, shape_string(value));
  if (nd == 1)
    for (int64_t i = 0; i < t.dim(0); ++i) t.data()[i] = value.data[i * value.stride[0]];
  else
    for (int64_t r = 0; r < t.dim(0); ++r)
      for (int64_t c = 0; c < t.dim(1); ++c) t.data()[r * t.dim(1) + c] = value.data[r * value.stride[0] + c * value.stride[1]];
}

Tensor MultiHeadAttention::forward(ConstTensorView x, const MhaOptions& options) const {
  const Rows xr = check_input(*this, "MultiHeadAttention::forward", "x", x);
  const int64_t B = x.shape[0], T = x.shape[1], C = embed_dim_, D = head_dim(), Ckv = kv_dim(), N = C + 2 * Ckv;
  Tensor qkv = linear(xr, B, T, w_qkv_, 0, N, b_qkv_, options.backend);  // [B, T, C | Ckv | Ckv]
  Tensor y = attend(heads_view(qkv.data(), B, T, N, 0, num_heads_, D),
                    heads_view(qkv.data(), B, T, N, C, num_kv_heads_, D),
                    heads_view(qkv.data(), B, T, N, C + Ckv, num_kv_heads_, D), attention_options(options),
                    options.weights, options.tape);
  if (options.tape) record(*options.tape, options, x, {}, std::move(qkv), {});
  return y;
}

Tensor MultiHeadAttention::forward(ConstTensorView x, ConstTensorView memory, const MhaOptions& options) const {
  constexpr std::string_view fn = "MultiHeadAttention::forward";
  const Rows xr = check_input(*this, fn, "x", x);
  const Rows mr = check_input(*this, fn, "memory", memory);
  if (memory.shape[0] != x.shape[0])
    fail(fn, "memory.shape[0]", message(x.shape[0], " (B, as x.shape[0])"), std::to_string(memory.shape[0]));
  const int64_t B = x.shape[0], T = x.shape[1], S = memory.shape[1], C = embed_dim_, D = head_dim(), Ckv = kv_dim();
  Tensor q = linear(xr, B, T, w_qkv_, 0, C, b_qkv_, options.backend);             // [B, T, C]
  Tensor kv = linear(mr, B, S, w_qkv_, C, 2 * Ckv, b_qkv_, options.backend);      // [B, S, Ckv | Ckv]
  Tensor y = attend(heads_view(q.data(), B, T, C, 0, num_heads_, D), heads_view(kv.data(), B, S, 2 * Ckv, 0, num_kv_heads_, D),
                    heads_view(kv.data(), B, S, 2 * Ckv, Ckv, num_kv_heads_, D), attention_options(options),
                    options.weights, options.tape);
  if (options.tape) record(*options.tape, options, x, memory, std::move(q), std::move(kv));
  return y;
}

KVCache MultiHeadAttention::project_memory(ConstTensorView memory) const {
  const Rows mr = check_input(*this, "MultiHeadAttention::project_memory", "memory", memory);
  const int64_t B = memory.shape[0], S = memory.shape[1], C = embed_dim_, D = head_dim(), Ckv = kv_dim();
  const Tensor kv = linear(mr, B, S, w_qkv_, C, 2 * Ckv, b_qkv_, Backend::automatic);  // [B, S, Ckv | Ckv]
  KVCache cache(B, num_kv_heads_, S, D, D);
  cache.append(heads_view(kv.data(), B, S, 2 * Ckv, 0, num_kv_heads_, D),
               heads_view(kv.data(), B, S, 2 * Ckv, Ckv, num_kv_heads_, D));
  return cache;
}

Tensor MultiHeadAttention::forward(ConstTensorView x, const KVCache& memory, const MhaOptions& options) const {
  constexpr std::string_view fn = "MultiHeadAttention::forward";
  const Rows xr = check_input(*this, fn, "x", x);
  check_cache(*this, fn, "memory", memory, x.shape[0]);
  const int64_t B = x.shape[0], T = x.shape[1], C = embed_dim_;
  const Tensor q = linear(xr, B, T, w_qkv_, 0, C, b_qkv_, options.backend);  // [B, T, C]
  if (options.tape)
    fail(fn, "options.tape", "no tape with a projected memory (pass the memory array to train)", "a tape");
  return attend(heads_view(q.data(), B, T, C, 0, num_heads_, head_dim()), memory.keys(), memory.values(),
                attention_options(options), options.weights, nullptr);
}

KVCache MultiHeadAttention::new_cache(int64_t batch, int64_t max_tokens) const {
  return KVCache(batch, num_kv_heads_, max_tokens, head_dim(), head_dim());
}

Tensor MultiHeadAttention::step(ConstTensorView x, KVCache& cache) const {
  constexpr std::string_view fn = "MultiHeadAttention::step";
  const Rows xr = check_input(*this, fn, "x", x);
  check_cache(*this, fn, "cache", cache, x.shape[0]);
  cache.check_room(x.shape[1], "x.shape[1]");
  const int64_t B = x.shape[0], T = x.shape[1], C = embed_dim_, D = head_dim(), Ckv = kv_dim(), N = C + 2 * Ckv;
  const Tensor qkv = linear(xr, B, T, w_qkv_, 0, N, b_qkv_, Backend::automatic);  // [B, T, C | Ckv | Ckv]
  cache.append(heads_view(qkv.data(), B, T, N, C, num_kv_heads_, D),
               heads_view(qkv.data(), B, T, N, C + Ckv, num_kv_heads_, D));
  AttentionOptions causal;
  causal.causal = true;  // the new rows are the last T of the cached sequence: bottom-right alignment
  return attend(heads_view(qkv.data(), B, T, N, 0, num_heads_, D), cache.keys(), cache.values(), causal, nullptr, nullptr);
}

MhaGradients MultiHeadAttention::zero_gradients() const {
  MhaGradients g{Tensor(w_qkv_.shape()), has_bias() ? Tensor(b_qkv_.shape()) : Tensor(), Tensor(w_o_.shape()),
                 has_bias() ? Tensor(b_o_.shape()) : Tensor()};
  return g;
}

// y = ctx Wo + bo;  ctx = attention(q, k, v);  [q | k | v] = x Wqkv + bqkv (cross: q from x, k, v from memory)
MhaInputGradients MultiHeadAttention::backward(const MhaTape& tape, ConstTensorView dy, MhaGradients& grads) const {
  constexpr std::string_view fn = "MultiHeadAttention::backward";
  if (!tape.x.defined() || !tape.ctx.defined()) fail(fn, "tape", "the tape of a forward with options.tape set", "an empty tape");
  const int64_t B = tape.x.dim(0), T = tape.x.dim(1), C = embed_dim_, H = num_heads_, Hkv = num_kv_heads_;
  const int64_t D = head_dim(), Ckv = kv_dim(), N = C + 2 * Ckv, S = tape.cross ? tape.memory.dim(1) : T;
  check_tensor(fn, "dy", dy, 3, "[B, T, C]");
  check_dim(fn, "dy", dy, 0, B, "B of the recorded forward");
  check_dim(fn, "dy", dy, 1, T, "T of the recorded forward");
  check_dim(fn, "dy", dy, 2, C, "C, the layer's embed_dim");
  if (grads.w_qkv.shape() != w_qkv_.shape() || grads.w_o.shape() != w_o_.shape() ||
      grads.b_qkv.defined() != has_bias() || grads.b_o.defined() != has_bias())
    fail(fn, "grads", "gradients shaped like this layer's parameters (zero_gradients())", "other shapes");
  const Tensor dy_rows = contiguous(dy);  // [B, T, C]
  // Output projection.
  add_weight_grads(tape.ctx.data(), B * T, C, dy_rows.data(), C, grads.w_o, 0, grads.b_o);
  const Tensor dctx = times_transposed(dy_rows.data(), B, T, C, w_o_, 0);  // [B, T, C]
  // Attention: gradients written straight into the projection layouts.
  AttentionOptions aopt;
  aopt.causal = tape.causal;
  aopt.causal_alignment = tape.causal_alignment;
  aopt.window = tape.window;
  aopt.softcap = tape.softcap;
  aopt.kv_lengths = tape.kv_lengths;
  aopt.attn_mask = tape.attn_mask.defined() ? tape.attn_mask.view() : ConstTensorView{};
  const ConstTensorView ctx_heads{tape.ctx.data(), {B, H, T, D}, {T * C, D, C, 1}};
  const ConstTensorView dctx_heads{dctx.data(), {B, H, T, D}, {T * C, D, C, 1}};
  MhaInputGradients out;
  if (!tape.cross) {
    Tensor dqkv({B, T, N});  // [B, T, C | Ckv | Ckv]
    const auto grad_heads = [&](int64_t col, int64_t heads) {  // a [B, heads, T, D] view of dqkv
      return TensorView{dqkv.data() + col, {B, heads, T, D}, {T * N, D, N, 1}};
    };
    scaled_dot_product_attention_backward(dctx_heads, heads_view(tape.qkv.data(), B, T, N, 0, H, D),
                                          heads_view(tape.qkv.data(), B, T, N, C, Hkv, D),
                                          heads_view(tape.qkv.data(), B, T, N, C + Ckv, Hkv, D), ctx_heads,
                                          tape.lse.view(), grad_heads(0, H), grad_heads(C, Hkv),
                                          grad_heads(C + Ckv, Hkv), aopt);
    add_weight_grads(tape.x.data(), B * T, C, dqkv.data(), N, grads.w_qkv, 0, grads.b_qkv);
    out.dx = times_transposed(dqkv.data(), B, T, N, w_qkv_, 0);
  } else {
    Tensor dq({B, T, C}), dkv({B, S, 2 * Ckv});
    scaled_dot_product_attention_backward(
        dctx_heads, heads_view(tape.qkv.data(), B, T, C, 0, H, D), heads_view(tape.kv.data(), B, S, 2 * Ckv, 0, Hkv, D),
        heads_view(tape.kv.data(), B, S, 2 * Ckv, Ckv, Hkv, D), ctx_heads, tape.lse.view(),
        TensorView{dq.data(), {B, H, T, D}, {T * C, D, C, 1}},
        TensorView{dkv.data(), {B, Hkv, S, D}, {S * 2 * Ckv, D, 2 * Ckv, 1}},
        TensorView{dkv.data() + Ckv, {B, Hkv, S, D}, {S * 2 * Ckv, D, 2 * Ckv, 1}}, aopt);
    add_weight_grads(tape.x.data(), B * T, C, dq.data(), C, grads.w_qkv, 0, grads.b_qkv);
    add_weight_grads(tape.memory.data(), B * S, C, dkv.data(), 2 * Ckv, grads.w_qkv, C, grads.b_qkv);
    out.dx = times_transposed(dq.data(), B, T, C, w_qkv_, 0);
    out.dmemory = times_transposed(dkv.data(), B, S, 2 * Ckv, w_qkv_, C);
  }
  return out;
}

}  // namespace mhsa
