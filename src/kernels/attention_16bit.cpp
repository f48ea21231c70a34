// kernels/attention_16bit.cpp — the attention entry points for bfloat16 / float16 inputs
// (mhsa/attention.h): widen the 16-bit views into contiguous float32 tensors (exact), run the
// float32 entry point (which validates shapes and options and names the arguments), and round
// out / the gradients back into the caller's 16-bit views (nearest even). The bfloat16 forward
// widens q alone and hands k and v over as they are (the 16-bit KV cache's entry point), marked
// as bfloat16 values: where the CPU has AVX512_BF16 its products run on bfloat16 pairs
// (kernels/flash_attention_bf16.cpp); elsewhere the result is the float32 one on the widened
// inputs, bit for bit. Not a kernel: the copies cost O(B·H·T·D).
#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "kernels/attention_backends.h"
#include "kernels/bf16.h"
#include "kernels/half.h"
#include "mhsa/attention.h"

namespace mhsa {
namespace {

float widen(bfloat16 x) { return kernels::bf16_to_float(x.bits); }
float widen(float16 x) { return kernels::f16_to_float(x.bits); }
void narrow(float x, bfloat16& y) { y.bits = kernels::float_to_bf16(x); }
void narrow(float x, float16& y) { y.bits = kernels::float_to_f16(x); }

// The view's shape padded on the left to 4 dimensions (stride 0 on the added ones).
template <class T>
View<T> as_4d(View<T> v) {
  View<T> r = v;
  const int skip = kMaxDims - v.ndim;
  for (int a = kMaxDims - 1; a >= 0; --a) {
    r.shape[a] = a >= skip ? v.shape[a - skip] : 1;
    r.stride[a] = a >= skip ? v.stride[a - skip] : 0;
  }
  return r;
}

std::vector<int64_t> dims_of(int ndim, const std::array<int64_t, kMaxDims>& shape) {
  return {shape.begin(), shape.begin() + ndim};
}

// A float32 copy of a 16-bit view: same dimensions; undefined for an undefined view, which the
// float32 entry point then reports by name. `what` names it if the copy cannot be made.
template <class T>
Tensor widened(View<const T> v, std::string_view what) {
  if (!v.defined()) return {};
  if (v.numel() > 0 && v.data == nullptr) detail::fail(what, "data", "a pointer", "a null pointer");
  Tensor t(dims_of(v.ndim, v.shape), what);
  const View<const T> w = as_4d(v);
  float* dst = t.data();
  for (int64_t a = 0; a < w.shape[0]; ++a)
    for (int64_t b = 0; b < w.shape[1]; ++b)
      for (int64_t c = 0; c < w.shape[2]; ++c)
        for (int64_t d = 0; d < w.shape[3]; ++d) *dst++ = widen(w.at(a, b, c, d));
  return t;
}

// An output's float32 stand-in: zeros of the view's dimensions (the float32 call checks them).
template <class T>
Tensor stand_in(View<T> v, std::string_view what) {
  return v.defined() ? Tensor(dims_of(v.ndim, v.shape), what) : Tensor{};
}

template <class T>
void round_into(const Tensor& t, View<T> v) {
  if (!v.defined()) return;
  const View<T> w = as_4d(v);
  const float* src = t.data();
  for (int64_t a = 0; a < w.shape[0]; ++a)
    for (int64_t b = 0; b < w.shape[1]; ++b)
      for (int64_t c = 0; c < w.shape[2]; ++c)
        for (int64_t d = 0; d < w.shape[3]; ++d) narrow(*src++, w.at(a, b, c, d));
}

ConstTensorView view_or_none(const Tensor& t) { return t.defined() ? t.view() : ConstTensorView{}; }
TensorView view_or_none(Tensor& t) { return t.defined() ? t.view() : TensorView{}; }

}  // namespace

template <Float16Element T>
void scaled_dot_product_attention(View<const T> q, View<const T> k, View<const T> v, View<T> out,
                                  const AttentionOptions& options, TensorView lse) {
  constexpr std::string_view fn = "scaled_dot_product_attention";
  const Tensor q32 = widened(q, "scaled_dot_product_attention: q");
  Tensor out32 = stand_in(out, "scaled_dot_product_attention: out");
  if (out.numel() > 0 && out.data == nullptr) detail::fail(fn, "out", "a pointer", "a null pointer");
  if constexpr (std::is_same_v<T, bfloat16>) {  // k and v read as they are (and checked by name there)
    detail::scaled_dot_product_attention_bf16_values(view_or_none(q32), k, v, view_or_none(out32), options, lse);
  } else {
    const Tensor k32 = widened(k, "scaled_dot_product_attention: k"), v32 = widened(v, "scaled_dot_product_attention: v");
    scaled_dot_product_attention(view_or_none(q32), view_or_none(k32), view_or_none(v32), view_or_none(out32),
                                 options, lse);
  }
  round_into(out32, out);
}

template <Float16Element T>
void scaled_dot_product_attention_backward(View<const T> dout, View<const T> q, View<const T> k, View<const T> v,
                                           View<const T> out, ConstTensorView lse, View<T> dq, View<T> dk,
                                           View<T> dv, const AttentionOptions& options) {
  constexpr std::string_view fn = "scaled_dot_product_attention_backward";
  const Tensor dout32 = widened(dout, "scaled_dot_product_attention_backward: dout"),
               q32 = widened(q, "scaled_dot_product_attention_backward: q"),
               k32 = widened(k, "scaled_dot_product_attention_backward: k"),
               v32 = widened(v, "scaled_dot_product_attention_backward: v"),
               out32 = widened(out, "scaled_dot_product_attention_backward: out");
  Tensor dq32 = stand_in(dq, "scaled_dot_product_attention_backward: dq"),
         dk32 = stand_in(dk, "scaled_dot_product_attention_backward: dk"),
         dv32 = stand_in(dv, "scaled_dot_product_attention_backward: dv");
  for (const auto& [name, g] : {std::pair{"dq", &dq}, std::pair{"dk", &dk}, std::pair{"dv", &dv}})
    if (g->numel() > 0 && g->data == nullptr) detail::fail(fn, name, "a pointer", "a null pointer");
  if (!options.sinks.empty())
    detail::fail(fn, "options.sinks", "none in the 16-bit backward (it has no dsinks output; use float32)",
                 detail::message(options.sinks.size(), " sinks"));
  // bfloat16 inputs may take the bfloat16 dot-product backward; float16 ones the float32 one.
  if constexpr (std::is_same_v<T, bfloat16>)
    detail::scaled_dot_product_attention_backward_bf16_values(
        view_or_none(dout32), view_or_none(q32), view_or_none(k32), view_or_none(v32), view_or_none(out32), lse,
        view_or_none(dq32), view_or_none(dk32), view_or_none(dv32), options);
  else
    scaled_dot_product_attention_backward(view_or_none(dout32), view_or_none(q32), view_or_none(k32),
                                          view_or_none(v32), view_or_none(out32), lse, view_or_none(dq32),
                                          view_or_none(dk32), view_or_none(dv32), options);
  round_into(dq32, dq);
  round_into(dk32, dk);
  round_into(dv32, dv);
}

#define MHSA_ATTENTION_16BIT(T)                                                                                 \
  template void scaled_dot_product_attention<T>(View<const T>, View<const T>, View<const T>, View<T>,         \
                                                const AttentionOptions&, TensorView);                          \
  template void scaled_dot_product_attention_backward<T>(View<const T>, View<const T>, View<const T>,          \
                                                         View<const T>, View<const T>, ConstTensorView, View<T>, \
                                                         View<T>, View<T>, const AttentionOptions&);
MHSA_ATTENTION_16BIT(bfloat16)
MHSA_ATTENTION_16BIT(float16)
#undef MHSA_ATTENTION_16BIT

}  // namespace mhsa
