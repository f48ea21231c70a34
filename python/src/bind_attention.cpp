// python/src/bind_attention.cpp — mhsa.scaled_dot_product_attention, its backward and
// attention_probabilities: PyTorch's names and keywords (attn_mask, is_causal, scale, enable_gqa)
// plus mhsa's own (kv_lengths, window, softcap, causal_alignment, return_lse, dropout_seed). Not the layer
// (MultiHeadAttention is bound in bindings.cpp).
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <utility>

#include "arrays16.h"
#include "call_options.h"
#include "core/check.h"
#include "io/json.h"
#include "mhsa/mhsa.h"

namespace mhsa::python {

using namespace pybind11::literals;

CallOptions call_options(std::string_view fn, const py::object& attn_mask, bool is_causal,
                         const std::optional<float>& scale, const py::object& kv_lengths) {
  CallOptions c;
  c.options.causal = is_causal;
  c.options.scale = scale;
  if (!kv_lengths.is_none()) {
    c.kv_lengths = int_vector(kv_lengths, fn, "kv_lengths");
    c.options.kv_lengths = c.kv_lengths;
  }
  if (!attn_mask.is_none()) {
    c.mask = mask_array(attn_mask, fn);
    c.options.attn_mask = c.mask.view;
  }
  return c;
}

namespace {

using Window = std::optional<std::pair<int64_t, int64_t>>;

// The options only the functional API takes: window (left, right), softcap, causal_alignment.
void add_variants(std::string_view fn, CallOptions& c, const Window& window, std::optional<float> softcap,
                  const std::string& alignment) {
  if (window) c.options.window = {window->first, window->second};
  c.options.softcap = softcap;
  if (alignment == "top_left") {
    c.options.causal_alignment = CausalAlignment::top_left;
  } else if (alignment != "bottom_right") {
    detail::fail(fn, "causal_alignment", "\"bottom_right\" or \"top_left\"",
                 "\"" + alignment.substr(0, 40) + (alignment.size() > 40 ? "...\"" : "\""));
  }
}

// Attention sinks: a float32 [Hq] array (its size and values checked by the library), or None.
void add_sinks(std::string_view fn, CallOptions& c, const py::object& sinks) {
  if (sinks.is_none()) return;
  c.sinks = float_array(sinks, fn, "sinks", 1, "[Hq]");
  if (c.sinks.view.stride[0] != 1 && c.sinks.view.shape[0] > 1)
    detail::fail(fn, "sinks", "a contiguous [Hq] array", detail::message("stride ", c.sinks.view.stride[0]));
  c.options.sinks = {c.sinks.view.data, static_cast<size_t>(c.sinks.view.shape[0])};
}

// Dropout on the probabilities: p in [0, 1) (checked by the library), the mask a function of the seed.
void add_dropout(CallOptions& c, float p, uint64_t seed) { c.options.dropout = {p, seed}; }

// PyTorch refuses Hq != Hkv unless enable_gqa=True; mhsa's grouped heads are always on, so only
// that refusal is kept.
void check_gqa(std::string_view fn, bool enable_gqa, int64_t Hq, int64_t Hkv) {
  if (!enable_gqa && Hq != Hkv)
    detail::fail(fn, "k.shape[1]", detail::message("Hkv = Hq = ", Hq, " with enable_gqa=False"), std::to_string(Hkv));
}

// The float16 / bfloat16 forward: q, k and v of one dtype, out of that dtype, lse float32.
template <class T>
py::object sdpa16(std::string_view fn, const py::object& q_obj, const py::object& k_obj, const py::object& v_obj,
                  bool enable_gqa, CallOptions& c, bool return_lse) {
  const py::dtype dtype = py::reinterpret_borrow<py::array>(q_obj).dtype();
  const auto q = half_array<T>(q_obj, fn, "q", 4, "[B, Hq, Tq, D]", dtype);
  const auto k = half_array<T>(k_obj, fn, "k", 4, "[B, Hkv, Tk, D]", dtype);
  const auto v = half_array<T>(v_obj, fn, "v", 4, "[B, Hkv, Tk, Dv]", dtype);
  check_gqa(fn, enable_gqa, q.view.shape[1], k.view.shape[1]);
  const auto [B, Hq, Tq] = std::tuple(q.view.shape[0], q.view.shape[1], q.view.shape[2]);
  auto out = new_half_array<T>({B, Hq, Tq, v.view.shape[3]}, dtype, "scaled_dot_product_attention: out [B, Hq, Tq, Dv]");
  OutputArray lse = new_array({B, Hq, Tq}, "scaled_dot_product_attention: lse [B, Hq, Tq]");
  {
    GilReleased unlocked;
    scaled_dot_product_attention<T>(q.view, k.view, v.view, out.view, c.options, lse.view);
  }
  if (return_lse) return py::make_tuple(out.array, lse.array);
  return out.array;
}

// The float16 / bfloat16 backward: dout, q, k, v and out of q's dtype, lse float32; gradients of q's dtype.
template <class T>
py::tuple sdpa_backward16(std::string_view fn, const py::object& dout_obj, const py::object& q_obj,
                          const py::object& k_obj, const py::object& v_obj, const py::object& out_obj,
                          const py::object& lse_obj, bool enable_gqa, CallOptions& c) {
  const py::dtype dtype = py::reinterpret_borrow<py::array>(q_obj).dtype();
  const auto dout = half_array<T>(dout_obj, fn, "dout", 4, "[B, Hq, Tq, Dv]", dtype);
  const auto q = half_array<T>(q_obj, fn, "q", 4, "[B, Hq, Tq, D]", dtype);
  const auto k = half_array<T>(k_obj, fn, "k", 4, "[B, Hkv, Tk, D]", dtype);
  const auto v = half_array<T>(v_obj, fn, "v", 4, "[B, Hkv, Tk, Dv]", dtype);
  const auto out = half_array<T>(out_obj, fn, "out", 4, "[B, Hq, Tq, Dv]", dtype);
  const InputArray lse = float_array(lse_obj, fn, "lse", 3, "[B, Hq, Tq]");
  check_gqa(fn, enable_gqa, q.view.shape[1], k.view.shape[1]);
  const auto shape = [](const auto& t) {
    return std::vector<int64_t>{t.shape[0], t.shape[1], t.shape[2], t.shape[3]};
  };
  auto dq = new_half_array<T>(shape(q.view), dtype, "scaled_dot_product_attention_backward: dq");
  auto dk = new_half_array<T>(shape(k.view), dtype, "scaled_dot_product_attention_backward: dk");
  auto dv = new_half_array<T>(shape(v.view), dtype, "scaled_dot_product_attention_backward: dv");
  {
    GilReleased unlocked;
    scaled_dot_product_attention_backward<T>(dout.view, q.view, k.view, v.view, out.view, lse.view, dq.view, dk.view,
                                             dv.view, c.options);
  }
  return py::make_tuple(dq.array, dk.array, dv.array);
}

// f(T{}) with T the element type of a KV cache of `type`.
template <class F>
void with_kv_element(KVType type, F&& f) {
  switch (type) {
    case KVType::bf16: return f(bfloat16{});
    case KVType::f16: return f(float16{});
    case KVType::q8_0: return f(BlockQ8_0{});
    case KVType::f32: break;
  }
  f(0.0f);
}

// Attention over k and v stored as a KV cache of `types` stores them (rounded or quantised as
// appended), read by the kernels as they are: what a model's attention over such a cache computes.
void sdpa_over_cache(KVTypes types, const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                     const TensorView& out, const TensorView& lse, const AttentionOptions& options) {
  KVCache cache(k.shape[0], k.shape[1], k.shape[2], k.shape[3], v.shape[3], types);
  cache.append(k, v);
  with_kv_element(types.key, [&](auto key) {
    with_kv_element(types.value, [&](auto value) {
      using K = decltype(key);
      using V = decltype(value);
      if constexpr (std::is_same_v<K, float> && std::is_same_v<V, float>)
        scaled_dot_product_attention(q, cache.keys(), cache.values(), out, options, lse);
      else
        scaled_dot_product_attention(q, cache.keys_as<K>(), cache.values_as<V>(), out, options, lse);
    });
  });
}

py::object sdpa(const py::object& q_obj, const py::object& k_obj, const py::object& v_obj, const py::object& attn_mask,
                bool is_causal, std::optional<float> scale, const py::object& kv_lengths, bool return_lse,
                const Window& window, std::optional<float> softcap, const std::string& causal_alignment,
                bool enable_gqa, float dropout_p, uint64_t dropout_seed, const std::string& kv_dtype,
                const py::object& sinks) {
  constexpr std::string_view fn = "scaled_dot_product_attention";
  const KVTypes kv_types = parse_kv_types(kv_dtype, "scaled_dot_product_attention: kv_dtype");
  if (const Precision p = precision_of(q_obj); p != Precision::f32) {
    if (kv_types != KVType::f32)
      detail::fail(fn, "kv_dtype", "\"f32\" for float16 / bfloat16 arrays (a KV cache's type is for float32 ones)",
                   detail::quote(kv_dtype));
    CallOptions c = call_options(fn, attn_mask, is_causal, scale, kv_lengths);
    add_variants(fn, c, window, softcap, causal_alignment);
    add_dropout(c, dropout_p, dropout_seed);
    add_sinks(fn, c, sinks);
    return p == Precision::bf16 ? sdpa16<bfloat16>(fn, q_obj, k_obj, v_obj, enable_gqa, c, return_lse)
                                : sdpa16<float16>(fn, q_obj, k_obj, v_obj, enable_gqa, c, return_lse);
  }
  const InputArray q = float_array(q_obj, fn, "q", 4, "[B, Hq, Tq, D]");
  const InputArray k = float_array(k_obj, fn, "k", 4, "[B, Hkv, Tk, D]");
  const InputArray v = float_array(v_obj, fn, "v", 4, "[B, Hkv, Tk, Dv]");
  check_gqa(fn, enable_gqa, q.view.shape[1], k.view.shape[1]);
  CallOptions c = call_options(fn, attn_mask, is_causal, scale, kv_lengths);
  add_variants(fn, c, window, softcap, causal_alignment);
  add_dropout(c, dropout_p, dropout_seed);
  add_sinks(fn, c, sinks);
  const auto [B, Hq, Tq] = std::tuple(q.view.shape[0], q.view.shape[1], q.view.shape[2]);
  OutputArray out = new_array({B, Hq, Tq, v.view.shape[3]}, "scaled_dot_product_attention: out [B, Hq, Tq, Dv]");
  OutputArray lse = new_array({B, Hq, Tq}, "scaled_dot_product_attention: lse [B, Hq, Tq]");
  {
    GilReleased unlocked;
    if (kv_types == KVType::f32)
      scaled_dot_product_attention(q.view, k.view, v.view, out.view, c.options, lse.view);
    else
      sdpa_over_cache(kv_types, q.view, k.view, v.view, out.view, lse.view, c.options);
  }
  if (return_lse) return py::make_tuple(out.array, lse.array);
  return out.array;
}

py::tuple sdpa_backward(const py::object& dout_obj, const py::object& q_obj, const py::object& k_obj,
                        const py::object& v_obj, const py::object& out_obj, const py::object& lse_obj,
                        const py::object& attn_mask, bool is_causal, std::optional<float> scale,
                        const py::object& kv_lengths, const Window& window, std::optional<float> softcap,
                        const std::string& causal_alignment, bool enable_gqa, float dropout_p,
                        uint64_t dropout_seed, const py::object& sinks) {
  constexpr std::string_view fn = "scaled_dot_product_attention_backward";
  if (const Precision p = precision_of(q_obj); p != Precision::f32) {
    CallOptions c = call_options(fn, attn_mask, is_causal, scale, kv_lengths);
    add_variants(fn, c, window, softcap, causal_alignment);
    add_dropout(c, dropout_p, dropout_seed);
    add_sinks(fn, c, sinks);
    return p == Precision::bf16
               ? sdpa_backward16<bfloat16>(fn, dout_obj, q_obj, k_obj, v_obj, out_obj, lse_obj, enable_gqa, c)
               : sdpa_backward16<float16>(fn, dout_obj, q_obj, k_obj, v_obj, out_obj, lse_obj, enable_gqa, c);
  }
  const InputArray dout = float_array(dout_obj, fn, "dout", 4, "[B, Hq, Tq, Dv]");
  const InputArray q = float_array(q_obj, fn, "q", 4, "[B, Hq, Tq, D]");
  const InputArray k = float_array(k_obj, fn, "k", 4, "[B, Hkv, Tk, D]");
  const InputArray v = float_array(v_obj, fn, "v", 4, "[B, Hkv, Tk, Dv]");
  const InputArray out = float_array(out_obj, fn, "out", 4, "[B, Hq, Tq, Dv]");
  const InputArray lse = float_array(lse_obj, fn, "lse", 3, "[B, Hq, Tq]");
  check_gqa(fn, enable_gqa, q.view.shape[1], k.view.shape[1]);
  CallOptions c = call_options(fn, attn_mask, is_causal, scale, kv_lengths);
  add_variants(fn, c, window, softcap, causal_alignment);
  add_dropout(c, dropout_p, dropout_seed);
  add_sinks(fn, c, sinks);
  const auto shape = [](const ConstTensorView& t) {
    return std::vector<int64_t>{t.shape[0], t.shape[1], t.shape[2], t.shape[3]};
  };
  OutputArray dq = new_array(shape(q.view), "scaled_dot_product_attention_backward: dq");
  OutputArray dk = new_array(shape(k.view), "scaled_dot_product_attention_backward: dk");
  OutputArray dv = new_array(shape(v.view), "scaled_dot_product_attention_backward: dv");
  const bool with_sinks = !c.options.sinks.empty();
  OutputArray dsinks;
  if (with_sinks) dsinks = new_array({q.view.shape[1]}, "scaled_dot_product_attention_backward: dsinks");
  {
    GilReleased unlocked;
    scaled_dot_product_attention_backward(dout.view, q.view, k.view, v.view, out.view, lse.view, dq.view, dk.view,
                                          dv.view, c.options, with_sinks ? dsinks.view : TensorView{});
  }
  if (with_sinks) return py::make_tuple(dq.array, dk.array, dv.array, dsinks.array);
  return py::make_tuple(dq.array, dk.array, dv.array);
}

py::array probabilities(const py::object& q_obj, const py::object& k_obj, const py::object& attn_mask, bool is_causal,
                        std::optional<float> scale, const py::object& kv_lengths, const Window& window,
                        std::optional<float> softcap, const std::string& causal_alignment, const py::object& sinks) {
  constexpr std::string_view fn = "attention_probabilities";
  const InputArray q = float_array(q_obj, fn, "q", 4, "[B, Hq, Tq, D]");
  const InputArray k = float_array(k_obj, fn, "k", 4, "[B, Hkv, Tk, D]");
  CallOptions c = call_options(fn, attn_mask, is_causal, scale, kv_lengths);
  add_variants(fn, c, window, softcap, causal_alignment);
  add_sinks(fn, c, sinks);
  OutputArray probs = new_array({q.view.shape[0], q.view.shape[1], q.view.shape[2], k.view.shape[2]},
                                "attention_probabilities: probs [B, Hq, Tq, Tk]");
  GilReleased unlocked;
  attention_probabilities(q.view, k.view, ConstTensorView{}, probs.view, c.options);
  return probs.array;
}

}  // namespace

void bind_attention(py::module_& m) {
  m.def("scaled_dot_product_attention", &sdpa, "q"_a, "k"_a, "v"_a, "attn_mask"_a = py::none(), "is_causal"_a = false,
        "scale"_a = py::none(), "kv_lengths"_a = py::none(), "return_lse"_a = false, py::kw_only(),
        "window"_a = py::none(), "softcap"_a = py::none(), "causal_alignment"_a = "bottom_right",
        "enable_gqa"_a = true, "dropout_p"_a = 0.0f, "dropout_seed"_a = 0, "kv_dtype"_a = "f32", "sinks"_a = py::none(),
        R"(Attention of q [B, Hq, Tq, D] over k [B, Hkv, Tk, D] and v [B, Hkv, Tk, Dv] -> out [B, Hq, Tq, Dv].

float32 arrays with any strides; or float16 / bfloat16 (ml_dtypes) arrays, all three of one dtype:
computed in float32 from the exact values, out rounded to that dtype, lse float32. Hq % Hkv == 0 (grouped-query heads, always on; enable_gqa=False
only refuses Hq != Hkv, as PyTorch does). attn_mask: additive float32 or bool (True = attend) of shape
[Tq, Tk], [Hq|1, Tq, Tk] or [B|1, Hq|1, Tq, Tk]. scale: default 1/sqrt(D). kv_lengths: [B] valid keys
per batch. softcap: scores become softcap*tanh(score/softcap) after the scale, before the mask (Gemma 2).
The causal and window limits put query i at key position p = i + Tk - Tq with
causal_alignment="bottom_right" (the default; right for a KV cache) or p = i with "top_left" (what
torch's is_causal=True means when Tq != Tk). is_causal: query i sees keys j <= p. window=(left, right):
keys p - left <= j <= p + right (-1 = unlimited); Hugging Face's sliding_window W is
is_causal=True, window=(W - 1, -1). A row with no visible key gives 0. dropout_p in [0, 1): each
probability kept with chance 1 - dropout_p and scaled by 1/(1 - dropout_p), the mask a hash of
dropout_seed and the position (the backward regenerates it from the same seed). With return_lse,
returns (out, lse [B, Hq, Tq]). kv_dtype (float32 arrays, forward only): "bf16", "f16" or "q8_0" (or
"KEY/VALUE", e.g. "q8_0/f16") stores k and v as a KV cache of that type stores them — rounded to
16 bits, or quantised to GGUF Q8_0 blocks of 32 along the head dimension (D and Dv multiples of
32) — and attends over them as the kernels read such a cache: the float32 result on the stored values.
sinks: a float32 [Hq] array of attention-sink logits (gpt-oss), one per query head, each in every
row's softmax sum as a key without a value: out shrinks by the sink's share, lse includes it.)");
  m.def("scaled_dot_product_attention_backward", &sdpa_backward, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a,
        "attn_mask"_a = py::none(), "is_causal"_a = false, "scale"_a = py::none(), "kv_lengths"_a = py::none(),
        py::kw_only(), "window"_a = py::none(), "softcap"_a = py::none(), "causal_alignment"_a = "bottom_right",
        "enable_gqa"_a = true, "dropout_p"_a = 0.0f, "dropout_seed"_a = 0, "sinks"_a = py::none(),
        R"(Gradients (dq, dk, dv) of scaled_dot_product_attention from dout [B, Hq, Tq, Dv] and the forward's
inputs, out and lse (from return_lse=True), with the forward's options. float16 / bfloat16 inputs (dout,
q, k, v and out of one dtype) give gradients of that dtype. dk and dv sum over the query heads
of a group; rows with no visible key get zero gradients. With sinks (float32 only), returns
(dq, dk, dv, dsinks [Hq]).)");
  m.def("attention_probabilities", &probabilities, "q"_a, "k"_a, "attn_mask"_a = py::none(), "is_causal"_a = false,
        "scale"_a = py::none(), "kv_lengths"_a = py::none(), py::kw_only(), "window"_a = py::none(),
        "softcap"_a = py::none(), "causal_alignment"_a = "bottom_right", "sinks"_a = py::none(),
        "The exact softmax matrix [B, Hq, Tq, Tk] that scaled_dot_product_attention applies (same options).");
}

}  // namespace mhsa::python
