// nn/mha.cpp — MultiHeadAttention (see mha.h): projections through kernels::gemm, heads as
// strided views of the projected buffers (no split or concat copies), attention through the
// public scaled_dot_product_attention.
#include "mhsa/mha.h"

#include <cmath>
#include <random>

#include "core/check.h"
#include "kernels/dispatch.h"
#include "kernels/gemm.h"

namespace mhsa {
namespace {

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
  Tensor copy({B, T, C});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) copy.data()[(b * T + t) * C + c] = x.at(b, t, c, 0);
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
}

AttentionOptions attention_options(const MhaOptions& o) {
  AttentionOptions a;
  a.causal = o.causal;
  a.kv_lengths = o.kv_lengths;
  a.attn_mask = o.attn_mask;
  a.backend = o.backend;
  return a;
}

}  // namespace

// Attention of q [B, H, T, D] over k, v [B, Hkv, S, D] into the concatenated heads, then the
// output projection: y [B, T, C]. Fills *weights [B, H, T, S] when it is given.
Tensor MultiHeadAttention::attend(ConstTensorView q, ConstTensorView k, ConstTensorView v,
                                  const AttentionOptions& options, Tensor* weights) const {
  const int64_t B = q.shape[0], H = q.shape[1], T = q.shape[2], D = q.shape[3], C = embed_dim_;
  Tensor ctx({B, T, C});  // heads concatenated: [B, T, H·D]
  const TensorView ctx_heads{ctx.data(), {B, H, T, D}, {T * C, D, C, 1}};
  Tensor lse = weights ? Tensor({B, H, T}) : Tensor();  // [B, H, T]
  scaled_dot_product_attention(q, k, v, ctx_heads, options, weights ? lse.view() : TensorView{});
  if (weights) *weights = attention_probabilities(q, k, lse.view(), options);
  return linear({ctx.data(), C, {}}, B, T, w_o_, 0, C, b_o_, options.backend);
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
  const int64_t C = embed_dim_, N = C + 2 * kv_dim();
  w_qkv_ = Tensor({C, N});
  w_o_ = Tensor({C, C});
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
  const Tensor qkv = linear(xr, B, T, w_qkv_, 0, N, b_qkv_, options.backend);  // [B, T, C | Ckv | Ckv]
  return attend(heads_view(qkv.data(), B, T, N, 0, num_heads_, D), heads_view(qkv.data(), B, T, N, C, num_kv_heads_, D),
                heads_view(qkv.data(), B, T, N, C + Ckv, num_kv_heads_, D), attention_options(options),
                options.weights);
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
  return attend(heads_view(q.data(), B, T, C, 0, num_heads_, head_dim()), memory.keys(), memory.values(),
                attention_options(options), options.weights);
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
  return attend(heads_view(qkv.data(), B, T, N, 0, num_heads_, D), cache.keys(), cache.values(), causal, nullptr);
}

}  // namespace mhsa
