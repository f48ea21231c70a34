// tests/cpp/test_attention_16bit.cpp — attention on bfloat16 and float16 inputs (mhsa/attention.h's
// Float16Element overloads): on strided views with grouped heads, causal top-left and bottom-right,
// a window, a mask and kv_lengths, the forward's lse and the backward's gradients equal, bit for
// bit, the float32 entry point run on the widened inputs with its results rounded to nearest even;
// the rounding itself is checked against the float64 value (at most half a unit in the last
// place); bad shapes are named as in float32. Where the CPU has AVX512_BF16, the bfloat16 forward
// runs on its dot product with P rounded to bfloat16 (kernels/flash_attention_bf16.cpp): there it
// is checked against the float64 reference within that rounding, on these cases and on a grid of
// head sizes, lengths and options; so is the bfloat16 backward there, with P and dS rounded to
// bfloat16 (kernels/flash_backward_bf16.cpp), and it is bitwise identical for any thread count.
// ctest runs this file again with MHSA_BF16_DOT=0 for the bitwise contract.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/bf16.h"
#include "kernels/dispatch.h"
#include "kernels/half.h"
#include "mhsa/attention.h"
#include "mhsa/error.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

float widen(bfloat16 x) { return kernels::bf16_to_float(x.bits); }
float widen(float16 x) { return kernels::f16_to_float(x.bits); }
template <class T>
T narrow(float x) {
  if constexpr (std::is_same_v<T, bfloat16>) return {kernels::float_to_bf16(x)};
  else return {kernels::float_to_f16(x)};
}

// A logical [d0, d1, d2, d3] tensor of 16-bit values stored as [d0, d2, d1, d3] (heads and rows
// swapped, as a [B, T, H, D] projection output is), with its exact float32 twin (contiguous).
template <class T>
struct Input {
  std::vector<T> storage;
  View<const T> view;
  Tensor wide;
};
template <class T>
Input<T> random_input(std::mt19937_64& gen, std::array<int64_t, 4> d, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  Input<T> in;
  in.storage.resize(static_cast<size_t>(d[0] * d[1] * d[2] * d[3]));
  in.view = View<const T>(in.storage.data(), {d[0], d[1], d[2], d[3]},
                          {d[1] * d[2] * d[3], d[3], d[1] * d[3], 1});
  in.wide = Tensor({d[0], d[1], d[2], d[3]});
  for (int64_t a = 0; a < d[0]; ++a)
    for (int64_t b = 0; b < d[1]; ++b)
      for (int64_t c = 0; c < d[2]; ++c)
        for (int64_t e = 0; e < d[3]; ++e) {
          const T x = narrow<T>(normal(gen));
          const_cast<T&>(in.view.at(a, b, c, e)) = x;
          in.wide.view().at(a, b, c, e) = widen(x);
        }
  return in;
}

template <class T>
void expect_rounded(const std::vector<T>& got, const Tensor& wide, const char* what) {
  ASSERT_EQ(static_cast<int64_t>(got.size()), wide.numel()) << what;
  for (int64_t i = 0; i < wide.numel(); ++i) {
    ASSERT_EQ(got[i].bits, narrow<T>(wide.data()[i]).bits) << what << " element " << i << " float32 " << wide.data()[i];
    // Nearest: no 16-bit neighbour is closer to the float32 value.
    const double x = wide.data()[i], err = std::fabs(widen(got[i]) - x);
    for (int step : {-1, 1}) {
      T n = got[i];
      n.bits = static_cast<uint16_t>(n.bits + step);
      if (std::isfinite(widen(n))) ASSERT_LE(err, std::fabs(widen(n) - x)) << what << " element " << i;
    }
  }
}

// Whether a bfloat16 forward of this shape runs on AVX512_BF16's dot product (the blocked path:
// more than 8 query rows; the decode path stays float32).
template <class T>
bool dot_forward(int64_t Tq) {
  return std::is_same_v<T, bfloat16> && kernels::kernels().attention_forward_bf16_dot && Tq > 8;
}

// out and lse of the dot-product forward against the float64 reference on the same (widened)
// inputs: lse within float32 sums' error, out within P's rounding to bfloat16 (2^-9 of the values
// averaged, vmax) and out's own (2^-9 of it), with room for two units.
template <class T>
void expect_near_reference(const std::vector<T>& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                           const Tensor& v, const AttentionOptions& options) {
  AttentionOptions ref_options = options;
  ref_options.backend = Backend::reference;
  Tensor ref({q.dim(0), q.dim(1), q.dim(2), v.dim(3)}), ref_lse({q.dim(0), q.dim(1), q.dim(2)});
  scaled_dot_product_attention(q.view(), k.view(), v.view(), ref.view(), ref_options, ref_lse.view());
  for (int64_t i = 0; i < lse.numel(); ++i) {
    const double want = ref_lse.data()[i];
    if (std::isinf(want)) ASSERT_EQ(lse.data()[i], want) << "lse " << i;
    else ASSERT_NEAR(lse.data()[i], want, 2e-5 * (1 + std::fabs(want))) << "lse " << i;
  }
  double vmax = 0, sq_err = 0, sq_ref = 0;
  for (int64_t i = 0; i < v.numel(); ++i) vmax = std::max(vmax, double{std::fabs(v.data()[i])});
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double want = ref.data()[i], err = std::fabs(widen(out[i]) - want);
    ASSERT_LE(err, 0x1p-8 * (vmax + std::fabs(want))) << "out " << i;
    sq_err += err * err;
    sq_ref += want * want;
  }
  EXPECT_LE(std::sqrt(sq_err / std::max(sq_ref, 1e-30)), 4e-3) << "out: relative L2";
}

// The bfloat16 backward through the 16-bit entry point: dq, dk, dv into 16-bit buffers.
struct Grads16 {
  std::vector<bfloat16> dq, dk, dv;
};
Grads16 backward_bf16(const Input<bfloat16>& dout, const Input<bfloat16>& q, const Input<bfloat16>& k,
                      const Input<bfloat16>& v, const std::vector<bfloat16>& out, const Tensor& lse,
                      const AttentionOptions& options) {
  const int64_t B = q.wide.dim(0), Hq = q.wide.dim(1), Tq = q.wide.dim(2), D = q.wide.dim(3);
  const int64_t Hkv = k.wide.dim(1), Tk = k.wide.dim(2), Dv = v.wide.dim(3);
  Grads16 g{std::vector<bfloat16>(static_cast<size_t>(B * Hq * Tq * D)),
            std::vector<bfloat16>(static_cast<size_t>(B * Hkv * Tk * D)),
            std::vector<bfloat16>(static_cast<size_t>(B * Hkv * Tk * Dv))};
  scaled_dot_product_attention_backward<bfloat16>(
      dout.view, q.view, k.view, v.view, View<const bfloat16>(out.data(), {B, Hq, Tq, Dv}), lse.view(),
      View<bfloat16>(g.dq.data(), {B, Hq, Tq, D}), View<bfloat16>(g.dk.data(), {B, Hkv, Tk, D}),
      View<bfloat16>(g.dv.data(), {B, Hkv, Tk, Dv}), options);
  return g;
}

// The dot-product backward's gradients against the float64 reference backward on the same widened
// inputs (and the same out and lse). dv = Pᵀ dO: within P's rounding to bfloat16 (2^-9 of
// Σ_r P|dO|, which is the reference's dv for |dout|) and dv's own (2^-9 of it), with room for two
// units. dq = dS K and dk = dSᵀ Q: dS's rounding summed where the terms cancel (a row of dS sums
// to 0) has no such per-element bound; within 1% relative L2 (measured 0.24-0.25%, PyTorch's bf16
// kernel 0.25-0.56%, on the Python test's shapes).
void expect_backward_near_reference(const Grads16& g, const Input<bfloat16>& dout, const Input<bfloat16>& q,
                                    const Input<bfloat16>& k, const Input<bfloat16>& v,
                                    const std::vector<bfloat16>& out, const Tensor& lse,
                                    const AttentionOptions& options) {
  AttentionOptions ref_options = options;
  ref_options.backend = Backend::reference;
  Tensor out_wide({q.wide.dim(0), q.wide.dim(1), q.wide.dim(2), v.wide.dim(3)}), abs_dout(out_wide.shape());
  for (int64_t i = 0; i < out_wide.numel(); ++i) {
    out_wide.data()[i] = widen(out[static_cast<size_t>(i)]);
    abs_dout.data()[i] = std::fabs(dout.wide.data()[i]);
  }
  const AttentionGrads ref = scaled_dot_product_attention_backward(dout.wide.view(), q.wide.view(), k.wide.view(),
                                                                   v.wide.view(), out_wide.view(), lse.view(),
                                                                   ref_options);
  const AttentionGrads bound = scaled_dot_product_attention_backward(abs_dout.view(), q.wide.view(), k.wide.view(),
                                                                     v.wide.view(), out_wide.view(), lse.view(),
                                                                     ref_options);
  for (int64_t i = 0; i < ref.dv.numel(); ++i) {
    const double want = ref.dv.data()[i], err = std::fabs(widen(g.dv[static_cast<size_t>(i)]) - want);
    ASSERT_LE(err, 0x1p-8 * (bound.dv.data()[i] + std::fabs(want)) + 1e-30) << "dv " << i;
  }
  for (const auto& [name, got, want] : {std::tuple{"dq", &g.dq, &ref.dq}, std::tuple{"dk", &g.dk, &ref.dk},
                                        std::tuple{"dv", &g.dv, &ref.dv}}) {
    double sq_err = 0, sq_ref = 0;
    for (int64_t i = 0; i < want->numel(); ++i) {
      const double x = widen((*got)[static_cast<size_t>(i)]), y = want->data()[i];
      ASSERT_TRUE(std::isfinite(x)) << name << " " << i;
      sq_err += (x - y) * (x - y);
      sq_ref += y * y;
    }
    EXPECT_LE(std::sqrt(sq_err / std::max(sq_ref, 1e-30)), 1e-2) << name << ": relative L2";
  }
}

template <class T>
void check_case(const AttentionOptions& options, int64_t Tq, int64_t Tk) {
  auto gen = test_rng();
  const int64_t B = 2, Hq = 4, Hkv = 2, D = 40, Dv = 24;
  const auto q = random_input<T>(gen, {B, Hq, Tq, D}, 1.0f), k = random_input<T>(gen, {B, Hkv, Tk, D}, 1.0f),
             v = random_input<T>(gen, {B, Hkv, Tk, Dv}, 1.0f), dout = random_input<T>(gen, {B, Hq, Tq, Dv}, 1.0f);

  std::vector<T> out(static_cast<size_t>(B * Hq * Tq * Dv));
  Tensor lse({B, Hq, Tq});
  scaled_dot_product_attention<T>(q.view, k.view, v.view, View<T>(out.data(), {B, Hq, Tq, Dv}), options, lse.view());
  Tensor out32({B, Hq, Tq, Dv}), lse32({B, Hq, Tq});
  scaled_dot_product_attention(q.wide.view(), k.wide.view(), v.wide.view(), out32.view(), options, lse32.view());
  if (dot_forward<T>(Tq)) {
    expect_near_reference(out, lse, q.wide, k.wide, v.wide, options);
  } else {
    ASSERT_EQ(std::memcmp(lse.data(), lse32.data(), sizeof(float) * lse.numel()), 0) << "lse";
    expect_rounded(out, out32, "out");
  }

  // The backward from the 16-bit out (as a caller has it), against float32 on its widened copy.
  const View<const T> out_view(out.data(), {B, Hq, Tq, Dv});
  Tensor out_wide({B, Hq, Tq, Dv});
  for (int64_t i = 0; i < out_wide.numel(); ++i) out_wide.data()[i] = widen(out[i]);
  if constexpr (std::is_same_v<T, bfloat16>) {
    if (dot_forward<T>(Tq)) {  // the backward takes the forward's shapes onto the dot product
      const Grads16 g = backward_bf16(dout, q, k, v, out, lse, options);
      expect_backward_near_reference(g, dout, q, k, v, out, lse, options);
      if (options.causal && options.causal_alignment == CausalAlignment::top_left && !options.attn_mask.defined())
        for (int64_t b = 0; b < B; ++b)  // row 0 sees key 0 alone: P = 1, dS = 0, dq = 0 exactly
          for (int64_t h = 0; h < Hq; ++h)
            for (int64_t d = 0; d < D; ++d)
              ASSERT_EQ(g.dq[static_cast<size_t>(((b * Hq + h) * Tq) * D + d)].bits, 0) << b << "," << h << "," << d;
      return;
    }
  }
  std::vector<T> dq(static_cast<size_t>(B * Hq * Tq * D)), dk(static_cast<size_t>(B * Hkv * Tk * D)),
      dv(static_cast<size_t>(B * Hkv * Tk * Dv));
  scaled_dot_product_attention_backward<T>(dout.view, q.view, k.view, v.view, out_view, lse.view(),
                                           View<T>(dq.data(), {B, Hq, Tq, D}), View<T>(dk.data(), {B, Hkv, Tk, D}),
                                           View<T>(dv.data(), {B, Hkv, Tk, Dv}), options);
  const AttentionGrads g = scaled_dot_product_attention_backward(dout.wide.view(), q.wide.view(), k.wide.view(),
                                                                 v.wide.view(), out_wide.view(), lse.view(), options);
  expect_rounded(dq, g.dq, "dq");
  expect_rounded(dk, g.dk, "dk");
  expect_rounded(dv, g.dv, "dv");
}

template <class T>
void check_all() {
  AttentionOptions causal;
  causal.causal = true;
  check_case<T>(causal, 37, 53);
  causal.causal_alignment = CausalAlignment::top_left;
  check_case<T>(causal, 37, 53);
  AttentionOptions window;
  window.causal = true;
  window.window = {5, -1};
  window.softcap = 7.0f;
  check_case<T>(window, 29, 29);
  AttentionOptions padded;
  const std::vector<int64_t> lengths{1, 17};
  padded.kv_lengths = lengths;
  Tensor mask({29, 31});
  auto gen = test_rng();
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < mask.numel(); ++i) mask.data()[i] = i % 7 == 3 ? -INFINITY : normal(gen);
  padded.attn_mask = mask.view();
  check_case<T>(padded, 29, 31);
  AttentionOptions single;  // one query row, one key (T = 1)
  check_case<T>(single, 1, 1);
}

TEST(Attention16Bit, BFloat16EqualsFloat32OnWidenedInputsRounded) { check_all<bfloat16>(); }
TEST(Attention16Bit, Float16EqualsFloat32OnWidenedInputsRounded) { check_all<float16>(); }

// The bfloat16 forward on a grid of head sizes (odd pairs: D 40 and Dv 24 are whole, D 97 is not),
// lengths (one key block and several; Tq ≠ Tk) and options, against the float64 reference: on
// AVX512_BF16 the dot-product kernel (within P's rounding), elsewhere the float32 kernels (which
// meet the same bound). On AVX512_BF16 the dot-product backward too (within P's and dS's rounding),
// with one thread and with all, bitwise alike.
TEST(Attention16Bit, BFloat16ForwardMatchesTheReferenceOnAGrid) {
  auto gen = test_rng();
  struct Case {
    int64_t D, Dv, Tq, Tk;
    AttentionOptions options;
  };
  AttentionOptions plain, causal, top_left, window, capped, padded, dropped;
  causal.causal = true;
  top_left.causal = true;
  top_left.causal_alignment = CausalAlignment::top_left;
  window.causal = true;
  window.window = {100, -1};
  capped.softcap = 5.0f;
  const std::vector<int64_t> lengths{0, 7};  // a batch with no key: out 0, lse −∞, no gradient
  padded.kv_lengths = lengths;
  dropped.causal = true;
  dropped.dropout = {0.2f, 7};
  const std::vector<Case> cases = {{64, 64, 97, 97, causal},      {40, 24, 300, 300, plain},
                                   {80, 80, 97, 1025, top_left},  {96, 96, 1025, 1025, window},
                                   {97, 33, 50, 300, capped},     {128, 128, 300, 300, padded},
                                   {64, 64, 9, 513, causal},      {64, 48, 200, 300, dropped}};
  for (const Case& c : cases) {
    const int64_t B = 2, Hq = 4, Hkv = 2;
    const auto q = random_input<bfloat16>(gen, {B, Hq, c.Tq, c.D}, 1.0f),
               k = random_input<bfloat16>(gen, {B, Hkv, c.Tk, c.D}, 1.0f),
               v = random_input<bfloat16>(gen, {B, Hkv, c.Tk, c.Dv}, 1.0f);
    std::vector<bfloat16> out(static_cast<size_t>(B * Hq * c.Tq * c.Dv));
    Tensor lse({B, Hq, c.Tq});
    scaled_dot_product_attention<bfloat16>(q.view, k.view, v.view, View<bfloat16>(out.data(), {B, Hq, c.Tq, c.Dv}),
                                           c.options, lse.view());
    SCOPED_TRACE("D=" + std::to_string(c.D) + " Dv=" + std::to_string(c.Dv) + " Tq=" + std::to_string(c.Tq) +
                 " Tk=" + std::to_string(c.Tk));
    expect_near_reference(out, lse, q.wide, k.wide, v.wide, c.options);
    // Without the dot product, or on the decode path, the backward is the float32 one, tested bitwise.
    if (!kernels::kernels().attention_backward_bf16_dot || c.Tq <= 8) continue;
    const auto dout = random_input<bfloat16>(gen, {B, Hq, c.Tq, c.Dv}, 1.0f);
    const Grads16 g = backward_bf16(dout, q, k, v, out, lse, c.options);
    expect_backward_near_reference(g, dout, q, k, v, out, lse, c.options);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const Grads16 one = backward_bf16(dout, q, k, v, out, lse, c.options);
    omp_set_num_threads(saved);
    for (const auto& [name, a, b] : {std::tuple{"dq", &g.dq, &one.dq}, std::tuple{"dk", &g.dk, &one.dk},
                                     std::tuple{"dv", &g.dv, &one.dv}})
      ASSERT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(bfloat16)), 0) << name << ": 1 thread";
  }
}

// The bfloat16 backward with every score equal at 5.9e5 (B1 H32 T23 D80, the float32 test's case in
// test_backward.cpp): P recomputed as exp(s − lse) from the float32 lse (ulp 0.0625) was off by up
// to 3%, past P's own bfloat16 rounding; such rows' max and sum are recomputed (lse_too_coarse).
// On AVX512_BF16 the dot-product backward, elsewhere the float32 one (which meets the same bound).
TEST(Attention16Bit, BFloat16BackwardWithAllScoresEqualAtLargeMagnitude) {
  auto gen = test_rng();
  const int64_t B = 1, H = 32, T = 23, D = 80;
  const double scale = 1.0 / std::sqrt(double(D));
  auto q = random_input<bfloat16>(gen, {B, H, T, D}, 1.0f), k = random_input<bfloat16>(gen, {B, H, T, D}, 1.0f);
  const auto v = random_input<bfloat16>(gen, {B, H, T, D}, 1.0f), dout = random_input<bfloat16>(gen, {B, H, T, D}, 1.0f);
  for (int64_t h = 0; h < H; ++h)  // q·k from dim 0; dims 40-59 vary in q only, 60-79 in k only
    for (int64_t t = 0; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) {
        const bool in_q = d >= 40 && d < 60, in_k = d >= 60;
        const bfloat16 x = narrow<bfloat16>(d == 0 ? static_cast<float>(5.9e5 / scale) : in_q ? widen(q.view.at(0, h, t, d)) : 0.0f);
        const bfloat16 y = narrow<bfloat16>(d == 0 ? 1.0f : in_k ? widen(k.view.at(0, h, t, d)) : 0.0f);
        const_cast<bfloat16&>(q.view.at(0, h, t, d)) = x;
        const_cast<bfloat16&>(k.view.at(0, h, t, d)) = y;
        q.wide.view().at(0, h, t, d) = widen(x);
        k.wide.view().at(0, h, t, d) = widen(y);
      }
  std::vector<bfloat16> out(static_cast<size_t>(B * H * T * D));
  Tensor lse({B, H, T});
  const AttentionOptions options;
  scaled_dot_product_attention<bfloat16>(q.view, k.view, v.view, View<bfloat16>(out.data(), {B, H, T, D}), options,
                                         lse.view());
  ASSERT_NEAR(lse.data()[0], 5.9e5 + std::log(23.0), 4e3);  // bfloat16's q: 5.9e5 to within 2^-9
  const Grads16 g = backward_bf16(dout, q, k, v, out, lse, options);
  expect_backward_near_reference(g, dout, q, k, v, out, lse, options);
}

// The bfloat16 forward's edge rows (on AVX512_BF16 the dot-product kernel's): a NaN in one query
// row makes that row's out and lse NaN and no other; a NaN in one key makes NaN every row that sees
// that key (one NaN score among finite ones: the softmax's exp must keep it); a batch with no
// visible key (kv_lengths 0) gives out 0 and lse −∞; a clean batch matches the float64 reference.
TEST(Attention16Bit, BFloat16ForwardKeepsNaNRowsAndEmptyRows) {
  auto gen = test_rng();
  const int64_t B = 3, H = 2, Tq = 40, Tk = 300, D = 64, nan_key = 270;  // causal: rows from 10 see key 270
  auto q = random_input<bfloat16>(gen, {B, H, Tq, D}, 1.0f), k = random_input<bfloat16>(gen, {B, H, Tk, D}, 1.0f);
  const auto v = random_input<bfloat16>(gen, {B, H, Tk, D}, 1.0f);
  const_cast<bfloat16&>(q.view.at(1, 1, 17, 5)) = narrow<bfloat16>(NAN);
  q.wide.view().at(1, 1, 17, 5) = NAN;
  const_cast<bfloat16&>(k.view.at(1, 0, nan_key, 3)) = narrow<bfloat16>(NAN);
  k.wide.view().at(1, 0, nan_key, 3) = NAN;
  AttentionOptions options;
  options.causal = true;
  const std::vector<int64_t> lengths{0, Tk, Tk};
  options.kv_lengths = lengths;
  std::vector<bfloat16> out(static_cast<size_t>(B * H * Tq * D));
  Tensor lse({B, H, Tq});
  scaled_dot_product_attention<bfloat16>(q.view, k.view, v.view, View<bfloat16>(out.data(), {B, H, Tq, D}), options,
                                         lse.view());
  const auto o = [&](int64_t b, int64_t h, int64_t i, int64_t d) { return widen(out[static_cast<size_t>(((b * H + h) * Tq + i) * D + d)]); };
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < Tq; ++i) {
      const bool nan = h == 1 ? i == 17 : i + (Tk - Tq) >= nan_key;
      ASSERT_EQ(lse.view().at(0, h, i, 0), -INFINITY) << h << "," << i;
      ASSERT_EQ(std::isnan(lse.view().at(1, h, i, 0)), nan) << h << "," << i;
      for (int64_t d = 0; d < D; ++d) {
        ASSERT_EQ(o(0, h, i, d), 0.0f);
        ASSERT_EQ(std::isnan(o(1, h, i, d)), nan) << h << "," << i << "," << d;
      }
    }
  Tensor ref({B, H, Tq, D}), ref_lse({B, H, Tq});
  options.backend = Backend::reference;
  scaled_dot_product_attention(q.wide.view(), k.wide.view(), v.wide.view(), ref.view(), options, ref_lse.view());
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < Tq; ++i) {
      const float want = ref_lse.view().at(2, h, i, 0);
      EXPECT_NEAR(lse.view().at(2, h, i, 0), want, 2e-5 * (1 + std::fabs(want)));
      for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(o(2, h, i, d), ref.view().at(2, h, i, d), 0.05);
    }
}

TEST(Attention16Bit, BadShapesAreNamed) {
  std::vector<bfloat16> q(2 * 3 * 5 * 8), k(2 * 3 * 4 * 7), v(2 * 3 * 4 * 8), out(2 * 3 * 5 * 8);
  try {
    scaled_dot_product_attention<bfloat16>(View<const bfloat16>(q.data(), {2, 3, 5, 8}),
                                           View<const bfloat16>(k.data(), {2, 3, 4, 7}),
                                           View<const bfloat16>(v.data(), {2, 3, 4, 8}),
                                           View<bfloat16>(out.data(), {2, 3, 5, 8}));
    FAIL() << "no error for a key width of 7 against queries of 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k"), std::string::npos) << e.what();
  }
  EXPECT_THROW(scaled_dot_product_attention<float16>(View<const float16>(nullptr, {2, 3, 5, 8}),
                                                     View<const float16>(nullptr, {2, 3, 4, 8}),
                                                     View<const float16>(nullptr, {2, 3, 4, 8}),
                                                     View<float16>(nullptr, {2, 3, 5, 8})),
               Error);
}

}  // namespace
}  // namespace mhsa::test
