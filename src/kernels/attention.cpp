// kernels/attention.cpp — the public attention entry points: validate once, fill
// AttentionParams, dispatch to a kernel. No arithmetic lives here.
#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "kernels/attention_backends.h"
#include "kernels/attention_params.h"
#include "kernels/attention_sinks.h"
#include "kernels/dispatch.h"
#include "mhsa/attention.h"

namespace mhsa {
namespace {

using detail::check_dim;
using detail::check_tensor;
using detail::fail;
using detail::message;
using kernels::AttentionParams;
using kernels::Strides4;

Strides4 strides_of(const ConstTensorView& t) { return t.stride; }

// Normalises an additive mask of 2, 3 or 4 dimensions to [B, Hq, Tq, Tk] strides, broadcast
// dimensions getting stride 0, and checks its values (finite or -inf).
void bind_mask(std::string_view fn, const ConstTensorView& mask, AttentionParams& p) {
  const int64_t full[4] = {p.B, p.Hq, p.Tq, p.Tk};
  const std::string wanted = message("a shape broadcastable to [B=", p.B, ", Hq=", p.Hq, ", Tq=", p.Tq,
                                     ", Tk=", p.Tk, "]: [Tq, Tk], [Hq|1, Tq, Tk] or [B|1, Hq|1, Tq, Tk]");
  if (mask.ndim < 2 || mask.ndim > 4) fail(fn, "attn_mask", wanted, shape_string(mask));
  const int skip = 4 - mask.ndim;
  Strides4 stride{0, 0, 0, 0};
  for (int a = 0; a < mask.ndim; ++a) {
    const int axis = a + skip;
    const bool broadcast = axis < 2 && mask.shape[a] == 1;
    if (mask.shape[a] != full[axis] && !broadcast) fail(fn, "attn_mask", wanted, shape_string(mask));
    stride[axis] = broadcast ? 0 : mask.stride[a];
  }
  if (mask.numel() > 0 && mask.data == nullptr) fail(fn, "attn_mask", "data", "a null pointer");
  int64_t idx[4] = {0, 0, 0, 0};
  int64_t dims[4] = {1, 1, 1, 1};
  for (int a = 0; a < mask.ndim; ++a) dims[a + skip] = mask.shape[a];
  for (idx[0] = 0; idx[0] < dims[0]; ++idx[0])
    for (idx[1] = 0; idx[1] < dims[1]; ++idx[1])
      for (idx[2] = 0; idx[2] < dims[2]; ++idx[2])
        for (idx[3] = 0; idx[3] < dims[3]; ++idx[3]) {
          const float m = mask.data[idx[0] * stride[0] + idx[1] * stride[1] + idx[2] * stride[2] +
                                    idx[3] * stride[3]];
          if (std::isnan(m) || m == INFINITY)
            fail(fn, "attn_mask", "finite values or -inf",
                 message(m, " at broadcast index [b, h, i, j] = [", idx[0], ", ", idx[1], ", ", idx[2],
                         ", ", idx[3], "]"));
        }
  p.mask = mask.data;
  p.mask_stride = stride;
}

template <class T>
constexpr kernels::KVElement kv_element_of() {
  if constexpr (std::is_same_v<T, bfloat16>) return kernels::KVElement::bf16;
  if constexpr (std::is_same_v<T, float16>) return kernels::KVElement::f16;
  if constexpr (std::is_same_v<T, BlockQ8_0>) return kernels::KVElement::q8_0;
  return kernels::KVElement::f32;
}

// The head size of k or v (arg) of elements T: its last dimension, or for Q8_0 blocks 32 values a
// block, checked to be a multiple of 32 (`size`: q's head size D for the keys, which must then be
// whole blocks) and to lie contiguous in each row.
template <class T>
void check_head_dim(std::string_view fn, std::string_view arg, const View<const T>& t, int64_t size,
                    std::string_view what) {
  if constexpr (std::is_same_v<T, BlockQ8_0>) {
    if (size % 32 != 0)
      fail(fn, message(arg, " (q8_0)"), message(what, " a multiple of 32 (q8_0 blocks of 32 values)"),
           std::to_string(size));
    check_dim(fn, arg, t, 3, size / 32, message(what, " / 32 q8_0 blocks"));
    if (t.shape[3] > 1 && t.stride[3] != 1)
      fail(fn, message(arg, ".stride[3]"), "1 (a row's q8_0 blocks contiguous)", std::to_string(t.stride[3]));
  } else {
    check_dim(fn, arg, t, 3, size, what);
  }
}
template <class T>
constexpr int64_t values_per_element() {
  return std::is_same_v<T, BlockQ8_0> ? 32 : 1;
}

// Validates q, k, (v) and the options; fills every input field of the params. K, V: the keys' and
// values' element types (float, or bfloat16 / float16 / BlockQ8_0 for a 16-bit or q8_0 KV cache).
template <class K, class V = K>
AttentionParams make_params(std::string_view fn, const ConstTensorView& q, const View<const K>& k,
                            const View<const V>* v, const AttentionOptions& opt) {
  check_tensor(fn, "q", q, 4, "[B, Hq, Tq, D]");
  check_tensor(fn, "k", k, 4, "[B, Hkv, Tk, D]");
  AttentionParams p;
  p.B = q.shape[0];
  p.Hq = q.shape[1];
  p.Tq = q.shape[2];
  p.D = q.shape[3];
  p.Hkv = k.shape[1];
  p.Tk = k.shape[2];
  check_dim(fn, "k", k, 0, p.B, "B, as q.shape[0]");
  if (p.Hkv == 0 || p.Hq % p.Hkv != 0)
    fail(fn, "k.shape[1]", message("Hkv dividing Hq = q.shape[1] = ", p.Hq, " (grouped heads)"),
         std::to_string(p.Hkv));
  check_head_dim(fn, "k", k, p.D, "head size D, as q.shape[3]");
  p.q = q.data;
  p.q_stride = strides_of(q);
  p.k_element = kv_element_of<K>();
  p.v_element = kv_element_of<V>();
  p.k = k.data;
  p.k_stride = k.stride;
  if (v) {
    check_tensor(fn, "v", *v, 4, "[B, Hkv, Tk, Dv]");
    check_dim(fn, "v", *v, 0, p.B, "B, as q.shape[0]");
    check_dim(fn, "v", *v, 1, p.Hkv, "Hkv, as k.shape[1]");
    check_dim(fn, "v", *v, 2, p.Tk, "Tk, as k.shape[2]");
    p.Dv = v->shape[3] * values_per_element<V>();
    check_head_dim(fn, "v", *v, p.Dv, "value head size Dv");
    p.v = v->data;
    p.v_stride = v->stride;
  }
  if (opt.scale) {
    const float s = *opt.scale;
    if (!std::isfinite(s) || !(s > 0.0f)) fail(fn, "scale", "a finite number > 0", message(s));
    p.scale = s;
  } else {
    p.scale = p.D > 0 ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.D))) : 1.0f;
  }
  if (opt.softcap) {
    const float c = *opt.softcap;
    if (!std::isfinite(c) || !(c > 0.0f)) fail(fn, "softcap", "a finite number > 0 (or none)", message(c));
    p.softcap = c;
  }
  if (!(opt.dropout.p >= 0.0f && opt.dropout.p < 1.0f))
    fail(fn, "dropout.p", "a probability in [0, 1)", message(opt.dropout.p));
  p.dropout = opt.dropout.p;
  p.dropout_seed = opt.dropout.seed;
  p.causal = opt.causal;
  p.query_offset = opt.causal_alignment == CausalAlignment::top_left ? 0 : p.Tk - p.Tq;
  // A window is meaningful without causal too (bidirectional local attention); with causal its
  // right limit is moot. Limits past Tq + Tk are unlimited in effect and stored clamped.
  const auto window_limit = [&](std::string_view side, int64_t w) -> int64_t {
    if (w < -1) fail(fn, side, "a key count >= 0, or -1 for unlimited", std::to_string(w));
    return w < 0 ? -1 : std::min(w, p.Tq + p.Tk);
  };
  p.window_left = window_limit("window.left", opt.window.left);
  p.window_right = window_limit("window.right", opt.window.right);
  if (!opt.kv_lengths.empty()) {
    if (static_cast<int64_t>(opt.kv_lengths.size()) != p.B)
      fail(fn, "kv_lengths", message(p.B, " entries (one per batch, B = q.shape[0])"),
           message(opt.kv_lengths.size(), " entries"));
    for (int64_t b = 0; b < p.B; ++b) {
      const int64_t len = opt.kv_lengths[static_cast<size_t>(b)];
      if (len < 0 || len > p.Tk)
        fail(fn, message("kv_lengths[", b, "]"), message("a length in [0, Tk = ", p.Tk, "]"),
             std::to_string(len));
    }
    p.kv_lengths = opt.kv_lengths.data();
  }
  if (opt.attn_mask.defined()) bind_mask(fn, opt.attn_mask, p);
  if (!opt.sinks.empty()) {
    if (static_cast<int64_t>(opt.sinks.size()) != p.Hq)
      fail(fn, "sinks", message(p.Hq, " logits (one per query head, Hq = q.shape[1])"),
           message(opt.sinks.size(), " logits"));
    for (size_t h = 0; h < opt.sinks.size(); ++h)
      if (!std::isfinite(opt.sinks[h])) fail(fn, message("sinks[", h, "]"), "a finite logit", message(opt.sinks[h]));
    p.sinks = opt.sinks.data();
  }
  return p;
}

void check_output(std::string_view fn, std::string_view arg, const TensorView& t,
                  const std::vector<int64_t>& want) {
  // (the message is built only on failure: these checks run on every decode step's attention)
  const auto wrong = [&] { fail(fn, arg, message("shape ", shape_string(ConstTensorView(nullptr, want))), shape_string(t)); };
  if (t.ndim != static_cast<int>(want.size())) wrong();
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] != want[static_cast<size_t>(i)]) wrong();
  if (t.numel() > 0 && t.data == nullptr) fail(fn, arg, "data", "a null pointer");
  detail::check_no_self_overlap(fn, arg, t);
}

// A given input tensor of exactly the shape `want`.
void check_input(std::string_view fn, std::string_view arg, const ConstTensorView& t, const std::vector<int64_t>& want,
                 std::string_view dims) {
  check_tensor(fn, arg, t, static_cast<int>(want.size()), dims);
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] != want[static_cast<size_t>(i)])
      fail(fn, arg, message("shape ", shape_string(ConstTensorView(nullptr, want)), " ", dims), shape_string(t));
}

Strides4 lse_strides(const ConstTensorView& lse) { return {lse.stride[0], lse.stride[1], lse.stride[2], 0}; }

// The reference kernel for Backend::reference, otherwise the fast kernels of the best ISA.
std::optional<cpu::Isa> kernel_choice(Backend backend) {
  if (backend == Backend::reference) return std::nullopt;
  return cpu::best_isa();
}

// The fast kernels take sinks only through out and lse (kernels/attention_sinks.cpp); the
// reference kernels as one more key.
void run_backward(const AttentionParams& p, std::optional<cpu::Isa> isa) {
  if (isa) {
    const kernels::KernelTable& k = kernels::kernels_for(*isa);
    if (!(p.bf16_values && k.attention_backward_bf16_dot && k.attention_backward_bf16_dot(p))) k.attention_backward(p);
    if (p.dsinks) kernels::sinks_backward(p);
  } else {
    kernels::attention_backward_ref(p);
  }
}

// With sinks, p.lse must be bound (apply_sinks reads it).
void run_forward(const AttentionParams& p, std::optional<cpu::Isa> isa) {
  if (isa) {
    const kernels::KernelTable& k = kernels::kernels_for(*isa);
    if (!(p.bf16_values && k.attention_forward_bf16_dot && k.attention_forward_bf16_dot(p))) k.attention_forward(&p, 1);
    if (p.sinks) kernels::apply_sinks(p);
  } else {
    kernels::attention_forward_ref(p);
  }
}

// Checks out and lse against p's shapes, binds them and runs the forward.
void forward_into(std::string_view fn, AttentionParams& p, const TensorView& out, const TensorView& lse,
                  std::optional<cpu::Isa> isa) {
  check_output(fn, "out", out, {p.B, p.Hq, p.Tq, p.Dv});
  p.out = out.data;
  p.out_stride = out.stride;
  Tensor own_lse;  // sinks rescale each row by its lse, wanted or not
  if (lse.defined()) {
    check_output(fn, "lse", lse, {p.B, p.Hq, p.Tq});
    p.lse = lse.data;
    p.lse_stride = lse_strides(lse);
  } else if (p.sinks && isa) {
    own_lse = Tensor({p.B, p.Hq, p.Tq});
    p.lse = own_lse.data();
    p.lse_stride = lse_strides(own_lse.view());
  }
  run_forward(p, isa);
}

}  // namespace

namespace detail {

void scaled_dot_product_attention_on(std::optional<cpu::Isa> isa, ConstTensorView q, ConstTensorView k,
                                     ConstTensorView v, TensorView out, const AttentionOptions& options,
                                     TensorView lse) {
  constexpr std::string_view fn = "scaled_dot_product_attention";
  AttentionParams p = make_params(fn, q, k, &v, options);
  forward_into(fn, p, out, lse, isa);
}

void scaled_dot_product_attention_bf16_values(ConstTensorView q, View<const bfloat16> k, View<const bfloat16> v,
                                              TensorView out, const AttentionOptions& options, TensorView lse) {
  constexpr std::string_view fn = "scaled_dot_product_attention";
  AttentionParams p = make_params(fn, q, k, &v, options);
  p.bf16_values = true;
  forward_into(fn, p, out, lse, kernel_choice(options.backend));
}

void scaled_dot_product_attention_backward_on(std::optional<cpu::Isa> isa, ConstTensorView dout, ConstTensorView q,
                                              ConstTensorView k, ConstTensorView v, ConstTensorView out,
                                              ConstTensorView lse, TensorView dq, TensorView dk, TensorView dv,
                                              const AttentionOptions& options, bool bf16_values,
                                              TensorView dsinks) {
  constexpr std::string_view fn = "scaled_dot_product_attention_backward";
  AttentionParams p = make_params(fn, q, k, &v, options);
  if (dsinks.defined()) {
    if (!p.sinks) fail(fn, "dsinks", "none without options.sinks", "a tensor");
    check_output(fn, "dsinks", dsinks, {p.Hq});
    if (dsinks.stride[0] != 1) fail(fn, "dsinks", "a contiguous [Hq] tensor", message("stride ", dsinks.stride[0]));
    p.dsinks = dsinks.data;
  }
  check_input(fn, "dout", dout, {p.B, p.Hq, p.Tq, p.Dv}, "[B, Hq, Tq, Dv]");
  check_input(fn, "out", out, {p.B, p.Hq, p.Tq, p.Dv}, "[B, Hq, Tq, Dv]");
  check_input(fn, "lse", lse, {p.B, p.Hq, p.Tq}, "[B, Hq, Tq]");
  check_output(fn, "dq", dq, {p.B, p.Hq, p.Tq, p.D});
  check_output(fn, "dk", dk, {p.B, p.Hkv, p.Tk, p.D});
  check_output(fn, "dv", dv, {p.B, p.Hkv, p.Tk, p.Dv});
  p.out = const_cast<float*>(out.data);  // read only: backward kernels never write out or lse
  p.out_stride = out.stride;
  p.lse = const_cast<float*>(lse.data);
  p.lse_stride = lse_strides(lse);
  p.dout = dout.data;
  p.dout_stride = dout.stride;
  p.dq = dq.data;
  p.dq_stride = dq.stride;
  p.dk = dk.data;
  p.dk_stride = dk.stride;
  p.dv = dv.data;
  p.dv_stride = dv.stride;
  p.bf16_values = bf16_values;
  run_backward(p, isa);
}

void scaled_dot_product_attention_backward_bf16_values(ConstTensorView dout, ConstTensorView q, ConstTensorView k,
                                                       ConstTensorView v, ConstTensorView out, ConstTensorView lse,
                                                       TensorView dq, TensorView dk, TensorView dv,
                                                       const AttentionOptions& options) {
  scaled_dot_product_attention_backward_on(kernel_choice(options.backend), dout, q, k, v, out, lse, dq, dk, dv, options,
                                           true);
}

}  // namespace detail

void scaled_dot_product_attention_backward(ConstTensorView dout, ConstTensorView q, ConstTensorView k,
                                           ConstTensorView v, ConstTensorView out, ConstTensorView lse,
                                           TensorView dq, TensorView dk, TensorView dv,
                                           const AttentionOptions& options, TensorView dsinks) {
  detail::scaled_dot_product_attention_backward_on(kernel_choice(options.backend), dout, q, k, v, out, lse, dq, dk,
                                                   dv, options, false, dsinks);
}

AttentionGrads scaled_dot_product_attention_backward(ConstTensorView dout, ConstTensorView q, ConstTensorView k,
                                                     ConstTensorView v, ConstTensorView out, ConstTensorView lse,
                                                     const AttentionOptions& options) {
  constexpr std::string_view fn = "scaled_dot_product_attention_backward";
  check_tensor(fn, "q", q, 4, "[B, Hq, Tq, D]");
  check_tensor(fn, "k", k, 4, "[B, Hkv, Tk, D]");
  check_tensor(fn, "v", v, 4, "[B, Hkv, Tk, Dv]");
  AttentionGrads g{Tensor({q.shape[0], q.shape[1], q.shape[2], q.shape[3]}),
                   Tensor({k.shape[0], k.shape[1], k.shape[2], k.shape[3]}),
                   Tensor({v.shape[0], v.shape[1], v.shape[2], v.shape[3]}), Tensor()};
  if (!options.sinks.empty()) g.dsinks = Tensor({q.shape[1]});
  scaled_dot_product_attention_backward(dout, q, k, v, out, lse, g.dq.view(), g.dk.view(), g.dv.view(), options,
                                        options.sinks.empty() ? TensorView{} : g.dsinks.view());
  return g;
}

void scaled_dot_product_attention(ConstTensorView q, ConstTensorView k, ConstTensorView v,
                                  TensorView out, const AttentionOptions& options, TensorView lse) {
  detail::scaled_dot_product_attention_on(kernel_choice(options.backend), q, k, v, out, options, lse);
}

namespace detail {

template <class K, class V>
  requires NarrowKV<K, V>
void scaled_dot_product_attention_on(std::optional<cpu::Isa> isa, ConstTensorView q, View<const K> k, View<const V> v,
                                     TensorView out, const AttentionOptions& options, TensorView lse) {
  constexpr std::string_view fn = "scaled_dot_product_attention";
  AttentionParams p = make_params(fn, q, k, &v, options);
  forward_into(fn, p, out, lse, isa);
}

// Validates a paged sequence's q, blocks and the options; fills every input field of the params.
template <KVElementType K, KVElementType V>
AttentionParams paged_params(std::string_view fn, const ConstTensorView& q, const PagedKVOf<K, V>& kv,
                             const AttentionOptions& options) {
  const auto positive = [&](std::string_view arg, int64_t n) {
    if (n <= 0) fail(fn, arg, "a count > 0", std::to_string(n));
  };
  if (kv.block_tokens <= 0 || !std::has_single_bit(static_cast<uint64_t>(kv.block_tokens)))
    fail(fn, "kv.block_tokens", "a power of two (1, 2, 4, ..., 16, ...)", std::to_string(kv.block_tokens));
  positive("kv.kv_heads", kv.kv_heads);
  positive("kv.head_dim", kv.head_dim);
  positive("kv.v_head_dim", kv.v_head_dim);
  if (kv.length < 0) fail(fn, "kv.length", "a count >= 0", std::to_string(kv.length));
  const auto blocks = static_cast<size_t>((kv.length + kv.block_tokens - 1) / kv.block_tokens);
  const auto check_list = [&](const auto& list, const char* arg) {
    if (list.size() < blocks) fail(fn, arg, message(blocks, " blocks at least (for ", kv.length, " keys)"), message(list.size()));
    for (size_t i = 0; i < blocks; ++i)
      if (list[i] == nullptr) fail(fn, message(arg, "[", i, "]"), "a block", "a null pointer");
  };
  check_list(kv.k_blocks, "kv.k_blocks");
  check_list(kv.v_blocks, "kv.v_blocks");
  const auto whole_blocks = [&](std::string_view arg, int64_t dim, bool q8) {
    if (q8 && dim % 32 != 0)
      fail(fn, arg, "a multiple of 32 (q8_0 blocks of 32 values)", std::to_string(dim));
    return q8 ? dim / 32 : dim;
  };
  const int64_t dk = whole_blocks("kv.head_dim", kv.head_dim, std::is_same_v<K, BlockQ8_0>);
  const int64_t dv = whole_blocks("kv.v_head_dim", kv.v_head_dim, std::is_same_v<V, BlockQ8_0>);
  check_tensor(fn, "q", q, 4, "[B, Hq, Tq, D]");
  check_dim(fn, "q", q, 0, 1, "1 (one sequence)");
  // k and v described as their first block's rows; the kernels read them through the block lists.
  // (in elements of K and V: a q8_0 row is its blocks)
  const K* k0 = blocks ? kv.k_blocks[0] : reinterpret_cast<const K*>(q.data);  // any non-null pointer
  const V* v0 = blocks ? kv.v_blocks[0] : reinterpret_cast<const V*>(q.data);
  const View<const K> k(k0, {1, kv.kv_heads, kv.length, dk}, {0, kv.block_tokens * dk, dk, 1});
  const View<const V> v(v0, {1, kv.kv_heads, kv.length, dv}, {0, kv.block_tokens * dv, dv, 1});
  AttentionParams p = make_params(fn, q, k, &v, options);
  p.k_pages = kv.k_blocks.data();
  p.v_pages = kv.v_blocks.data();
  p.page_shift = std::countr_zero(static_cast<uint64_t>(kv.block_tokens));
  p.page_mask = kv.block_tokens - 1;
  return p;
}

template <KVElementType K, KVElementType V>
void scaled_dot_product_attention_on(std::optional<cpu::Isa> isa, ConstTensorView q, const PagedKVOf<K, V>& kv,
                                     TensorView out, const AttentionOptions& options, TensorView lse) {
  constexpr std::string_view fn = "scaled_dot_product_attention";
  AttentionParams p = paged_params(fn, q, kv, options);
  forward_into(fn, p, out, lse, isa);
}

template <KVElementType K, KVElementType V>
void scaled_dot_product_attention_on(std::optional<cpu::Isa> isa, std::span<const AttentionBatchItem<K, V>> batch,
                                     const AttentionOptions& options) {
  constexpr std::string_view fn = "scaled_dot_product_attention";
  if (options.attn_mask.defined())
    fail(fn, "options.attn_mask", "none in a batched call (each item's keys are its own)", "a mask");
  if (!options.kv_lengths.empty())
    fail(fn, "options.kv_lengths", "none in a batched call (each item's keys are its own)",
         message(options.kv_lengths.size(), " lengths"));
  std::vector<AttentionParams> ps;
  ps.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const AttentionBatchItem<K, V>& item = batch[i];
    const auto checked = [&](std::string_view name) {
      AttentionParams p = item.paged ? paged_params(name, item.q, *item.paged, options)
                                     : make_params(name, item.q, item.k, &item.v, options);
      check_output(name, "out", item.out, {p.B, p.Hq, p.Tq, p.Dv});
      return p;
    };
    // The item's name is written only for an error: its checks, which depend on the item alone,
    // run again under that name and throw the same error naming it (none is built per step).
    AttentionParams p;
    try {
      p = checked(fn);
    } catch (const Error&) {
      checked(message(fn, " (batch[", i, "])"));
      throw;
    }
    p.out = item.out.data;
    p.out_stride = item.out.stride;
    ps.push_back(p);
  }
  if (ps.empty()) return;
  if (isa) {
    std::vector<float> lses;  // sinks rescale each row by its lse: one [B, Hq, Tq] per item
    if (!options.sinks.empty()) {
      size_t rows = 0;
      for (const AttentionParams& p : ps) rows += static_cast<size_t>(p.B * p.Hq * p.Tq);
      lses.resize(rows);
      size_t at = 0;
      for (AttentionParams& p : ps) {
        p.lse = lses.data() + at;
        p.lse_stride = {p.Hq * p.Tq, p.Tq, 1, 0};
        at += static_cast<size_t>(p.B * p.Hq * p.Tq);
      }
    }
    kernels::kernels_for(*isa).attention_forward(ps.data(), static_cast<int64_t>(ps.size()));
    if (!options.sinks.empty())
      for (const AttentionParams& p : ps) kernels::apply_sinks(p);
  } else {
    for (const AttentionParams& p : ps) kernels::attention_forward_ref(p);
  }
}

}  // namespace detail

template <class K, class V>
  requires NarrowKV<K, V>
void scaled_dot_product_attention(ConstTensorView q, View<const K> k, View<const V> v, TensorView out,
                                  const AttentionOptions& options, TensorView lse) {
  detail::scaled_dot_product_attention_on(kernel_choice(options.backend), q, k, v, out, options, lse);
}

template <KVElementType K, KVElementType V>
void scaled_dot_product_attention(ConstTensorView q, const PagedKVOf<K, V>& kv, TensorView out,
                                  const AttentionOptions& options, TensorView lse) {
  detail::scaled_dot_product_attention_on(kernel_choice(options.backend), q, kv, out, options, lse);
}

template <KVElementType K, KVElementType V>
void scaled_dot_product_attention(std::span<const AttentionBatchItem<K, V>> batch, const AttentionOptions& options) {
  detail::scaled_dot_product_attention_on<K, V>(kernel_choice(options.backend), batch, options);
}

// Every pair of key and value element types: float32, bfloat16, float16 and Q8_0 blocks.
#define MHSA_ATTENTION_PAGED(K, V)                                                                           \
  template void scaled_dot_product_attention<K, V>(std::span<const AttentionBatchItem<K, V>>,              \
                                                   const AttentionOptions&);                               \
  template void detail::scaled_dot_product_attention_on<K, V>(std::optional<cpu::Isa>,                     \
                                                              std::span<const AttentionBatchItem<K, V>>,   \
                                                              const AttentionOptions&);                    \
  template void scaled_dot_product_attention<K, V>(ConstTensorView, const PagedKVOf<K, V>&, TensorView,    \
                                                   const AttentionOptions&, TensorView);                   \
  template void detail::scaled_dot_product_attention_on<K, V>(std::optional<cpu::Isa>, ConstTensorView,   \
                                                              const PagedKVOf<K, V>&, TensorView,          \
                                                              const AttentionOptions&, TensorView);
#define MHSA_ATTENTION_NARROW(K, V)                                                                          \
  template void scaled_dot_product_attention<K, V>(ConstTensorView, View<const K>, View<const V>, TensorView, \
                                                   const AttentionOptions&, TensorView);                   \
  template void detail::scaled_dot_product_attention_on<K, V>(std::optional<cpu::Isa>, ConstTensorView,   \
                                                              View<const K>, View<const V>, TensorView,    \
                                                              const AttentionOptions&, TensorView);
#define MHSA_ATTENTION_KV(K, V) MHSA_ATTENTION_PAGED(K, V) MHSA_ATTENTION_NARROW(K, V)
#define MHSA_ATTENTION_KV_ANY(K) \
  MHSA_ATTENTION_KV(K, bfloat16) MHSA_ATTENTION_KV(K, float16) MHSA_ATTENTION_KV(K, BlockQ8_0)
MHSA_ATTENTION_PAGED(float, float)
MHSA_ATTENTION_NARROW(float, bfloat16)
MHSA_ATTENTION_NARROW(float, float16)
MHSA_ATTENTION_NARROW(float, BlockQ8_0)
MHSA_ATTENTION_PAGED(float, bfloat16)
MHSA_ATTENTION_PAGED(float, float16)
MHSA_ATTENTION_PAGED(float, BlockQ8_0)
MHSA_ATTENTION_KV_ANY(bfloat16)
MHSA_ATTENTION_KV_ANY(float16)
MHSA_ATTENTION_KV_ANY(BlockQ8_0)
MHSA_ATTENTION_KV(bfloat16, float)
MHSA_ATTENTION_KV(float16, float)
MHSA_ATTENTION_KV(BlockQ8_0, float)
#undef MHSA_ATTENTION_KV_ANY
#undef MHSA_ATTENTION_KV
#undef MHSA_ATTENTION_NARROW
#undef MHSA_ATTENTION_PAGED

AttentionResult scaled_dot_product_attention(ConstTensorView q, ConstTensorView k,
                                             ConstTensorView v, const AttentionOptions& options) {
  constexpr std::string_view fn = "scaled_dot_product_attention";
  check_tensor(fn, "q", q, 4, "[B, Hq, Tq, D]");
  check_tensor(fn, "v", v, 4, "[B, Hkv, Tk, Dv]");
  AttentionResult r{Tensor({q.shape[0], q.shape[1], q.shape[2], v.shape[3]}),
                    Tensor({q.shape[0], q.shape[1], q.shape[2]})};
  scaled_dot_product_attention(q, k, v, r.out.view(), options, r.lse.view());
  return r;
}

void attention_probabilities(ConstTensorView q, ConstTensorView k, ConstTensorView lse,
                             TensorView probs, const AttentionOptions& options,
                             std::span<const int64_t> heads) {
  constexpr std::string_view fn = "attention_probabilities";
  AttentionParams p = make_params<float, float>(fn, q, k, nullptr, options);
  std::vector<int64_t> all_heads;
  if (heads.empty()) {
    for (int64_t h = 0; h < p.Hq; ++h) all_heads.push_back(h);
    heads = all_heads;
  }
  for (size_t i = 0; i < heads.size(); ++i)
    if (heads[i] < 0 || heads[i] >= p.Hq)
      fail(fn, message("heads[", i, "]"), message("a query head in [0, Hq = ", p.Hq, ")"),
           std::to_string(heads[i]));
  const auto n_heads = static_cast<int64_t>(heads.size());
  check_output(fn, "probs", probs, {p.B, n_heads, p.Tq, p.Tk});
  Tensor own_lse;
  if (lse.defined()) {
    check_tensor(fn, "lse", lse, 3, "[B, Hq, Tq]");
    check_dim(fn, "lse", lse, 0, p.B, "B, as q.shape[0]");
    check_dim(fn, "lse", lse, 1, p.Hq, "Hq, as q.shape[1]");
    check_dim(fn, "lse", lse, 2, p.Tq, "Tq, as q.shape[2]");
    p.lse = const_cast<float*>(lse.data);  // read only: the probabilities kernel never writes lse
    p.lse_stride = {lse.stride[0], lse.stride[1], lse.stride[2], 0};
  } else {
    own_lse = Tensor({p.B, p.Hq, p.Tq});
    p.lse = own_lse.data();
    p.lse_stride = lse_strides(own_lse.view());
    run_forward(p, kernel_choice(options.backend));  // p.out is null: computes lse only
  }
  kernels::attention_probabilities_ref(p, heads.data(), n_heads, probs.data, probs.stride);
}

Tensor attention_probabilities(ConstTensorView q, ConstTensorView k, ConstTensorView lse,
                               const AttentionOptions& options, std::span<const int64_t> heads) {
  constexpr std::string_view fn = "attention_probabilities";
  check_tensor(fn, "q", q, 4, "[B, Hq, Tq, D]");
  check_tensor(fn, "k", k, 4, "[B, Hkv, Tk, D]");
  const auto n_heads = heads.empty() ? q.shape[1] : static_cast<int64_t>(heads.size());
  Tensor probs({q.shape[0], n_heads, q.shape[2], k.shape[2]});
  attention_probabilities(q, k, lse, probs.view(), options, heads);
  return probs;
}

double attention_flops(int64_t B, int64_t Hq, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv,
                       bool causal) {
  const double full = 2.0 * static_cast<double>(B) * static_cast<double>(Hq) * static_cast<double>(Tq) *
                      static_cast<double>(Tk) * static_cast<double>(D + Dv);
  return causal && Tq == Tk ? full / 2 : full;
}

double attention_flops(int64_t B, int64_t Hq, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv,
                       const AttentionOptions& options) {
  AttentionParams p;  // only the fields key_range reads
  p.B = B;
  p.Tq = Tq;
  p.Tk = Tk;
  p.causal = options.causal;
  p.query_offset = options.causal_alignment == CausalAlignment::top_left ? 0 : Tk - Tq;
  p.window_left = options.window.left < 0 ? -1 : std::min(options.window.left, Tq + Tk);
  p.window_right = options.window.right < 0 ? -1 : std::min(options.window.right, Tq + Tk);
  const bool lengths = static_cast<int64_t>(options.kv_lengths.size()) == B;
  if (lengths) p.kv_lengths = options.kv_lengths.data();
  double pairs = 0.0;
  for (int64_t b = 0; b < (lengths ? B : 1); ++b)
    for (int64_t i = 0; i < Tq; ++i) {
      const kernels::KeyRange r = kernels::key_range(p, b, i);
      pairs += static_cast<double>(r.end - r.begin);
    }
  if (!lengths) pairs *= static_cast<double>(B);
  return 2.0 * pairs * static_cast<double>(Hq) * static_cast<double>(D + Dv);
}

}  // namespace mhsa
