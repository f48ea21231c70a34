// Attention sinks (gpt-oss): a learned logit per query head in every row's softmax sum. The fast
// kernels take them as a pass over out and lse after the kernel (kernels/attention_sinks.cpp);
// the reference kernels as one more key. Checked here: fast against reference (forward, backward
// and dsinks) on fresh random inputs at odd sizes, grouped heads, causal, window and padding, and
// with sinks large enough that the backward recomputes rows whose float lse is too coarse; paged
// and batched calls bit for bit the contiguous one; a fully masked row; a sink far below every
// score changes nothing; bad sinks are named. PyTorch checks the same in float64
// (tests/python/test_sinks.py).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "mhsa/mhsa.h"
#include "test_util.h"

namespace mhsa {
namespace {

struct Case {
  int64_t B, Hq, Hkv, Tq, Tk, D;
  bool causal;
  int64_t window_left;
  bool padded;
  float sink_center;  // sinks drawn around this logit
};

void expect_close(const Tensor& got, const Tensor& want, double tol, const char* what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  double worst = 0.0, scale = 1e-30;
  for (int64_t i = 0; i < want.numel(); ++i) {
    worst = std::max(worst, std::abs(double(got.data()[i]) - double(want.data()[i])));
    scale = std::max(scale, std::abs(double(want.data()[i])));
  }
  EXPECT_LE(worst, tol * scale) << what << ": max |got - want| " << worst << " against max |want| " << scale;
}

TEST(AttentionSinks, FastEqualsReferenceForwardAndBackward) {
  auto gen = test::test_rng();
  const Case cases[] = {
      {2, 4, 2, 97, 97, 40, true, -1, false, 0.0f},   // prefill, grouped heads
      {1, 6, 2, 1, 1025, 80, true, -1, false, 1.0f},  // decode over a long cache
      {2, 3, 3, 33, 70, 96, false, 20, true, -2.0f},  // window and padding, not causal
      {1, 2, 1, 64, 64, 64, true, -1, false, 25.0f},  // sinks dominate: |lse| >= 16 in every row
      {1, 2, 2, 1, 1, 40, false, -1, false, 0.5f},    // one key
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "B " << c.B << " Hq " << c.Hq << " Hkv " << c.Hkv << " Tq " << c.Tq << " Tk "
                                    << c.Tk << " D " << c.D << " sinks ~" << c.sink_center);
    const Tensor q = test::random_tensor(gen, {c.B, c.Hq, c.Tq, c.D});
    const Tensor k = test::random_tensor(gen, {c.B, c.Hkv, c.Tk, c.D});
    const Tensor v = test::random_tensor(gen, {c.B, c.Hkv, c.Tk, c.D});
    const Tensor dout = test::random_tensor(gen, {c.B, c.Hq, c.Tq, c.D});
    std::normal_distribution<float> normal(c.sink_center, 1.0f);
    std::vector<float> sinks(static_cast<size_t>(c.Hq));
    for (float& s : sinks) s = normal(gen);
    std::vector<int64_t> lengths;
    for (int64_t b = 0; b < c.B; ++b) lengths.push_back(c.padded ? c.Tk - 7 * b - 3 : c.Tk);
    AttentionOptions o;
    o.causal = c.causal;
    o.window.left = c.window_left;
    if (c.padded) o.kv_lengths = lengths;
    o.sinks = sinks;
    Tensor out[2], lse[2];
    AttentionGrads g[2];
    for (int r = 0; r < 2; ++r) {
      o.backend = r == 0 ? Backend::automatic : Backend::reference;
      AttentionResult f = scaled_dot_product_attention(q.view(), k.view(), v.view(), o);
      g[r] = scaled_dot_product_attention_backward(dout.view(), q.view(), k.view(), v.view(), f.out.view(),
                                                   f.lse.view(), o);
      out[r] = std::move(f.out);
      lse[r] = std::move(f.lse);
    }
    expect_close(out[0], out[1], 2e-5, "out");
    expect_close(lse[0], lse[1], 2e-6, "lse");
    expect_close(g[0].dq, g[1].dq, 1e-4, "dq");
    expect_close(g[0].dk, g[1].dk, 1e-4, "dk");
    expect_close(g[0].dv, g[1].dv, 1e-4, "dv");
    ASSERT_EQ(g[0].dsinks.numel(), c.Hq);
    expect_close(g[0].dsinks, g[1].dsinks, 1e-4, "dsinks");
  }
}

// A sink far below every score adds nothing a float can hold: the fast kernels' results are those
// of the call without sinks, bit for bit.
TEST(AttentionSinks, AFarNegativeSinkChangesNothing) {
  auto gen = test::test_rng();
  const Tensor q = test::random_tensor(gen, {1, 4, 50, 64}), k = test::random_tensor(gen, {1, 2, 50, 64}),
               v = test::random_tensor(gen, {1, 2, 50, 64});
  const std::vector<float> sinks(4, -300.0f);
  AttentionOptions plain;
  plain.causal = true;
  AttentionOptions with = plain;
  with.sinks = sinks;
  const AttentionResult a = scaled_dot_product_attention(q.view(), k.view(), v.view(), plain);
  const AttentionResult b = scaled_dot_product_attention(q.view(), k.view(), v.view(), with);
  for (int64_t i = 0; i < a.out.numel(); ++i) ASSERT_EQ(a.out.data()[i], b.out.data()[i]) << i;
  for (int64_t i = 0; i < a.lse.numel(); ++i) ASSERT_EQ(a.lse.data()[i], b.lse.data()[i]) << i;
}

// kv_lengths 0: no key at all. The row is all sink: out = 0 and lse = the sink, on both backends,
// and the backward gives zero gradients and a zero dsinks (dO·out = 0).
TEST(AttentionSinks, ARowWithoutKeysIsAllSink) {
  auto gen = test::test_rng();
  const Tensor q = test::random_tensor(gen, {1, 2, 3, 40}), k = test::random_tensor(gen, {1, 2, 5, 40}),
               v = test::random_tensor(gen, {1, 2, 5, 40}), dout = test::random_tensor(gen, {1, 2, 3, 40});
  const std::vector<float> sinks = {0.75f, -1.5f};
  const std::vector<int64_t> none = {0};
  for (Backend backend : {Backend::automatic, Backend::reference}) {
    AttentionOptions o;
    o.kv_lengths = none;
    o.sinks = sinks;
    o.backend = backend;
    const AttentionResult f = scaled_dot_product_attention(q.view(), k.view(), v.view(), o);
    for (int64_t i = 0; i < f.out.numel(); ++i) ASSERT_EQ(f.out.data()[i], 0.0f);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 3; ++i) ASSERT_EQ(f.lse.data()[h * 3 + i], sinks[static_cast<size_t>(h)]);
    const AttentionGrads g =
        scaled_dot_product_attention_backward(dout.view(), q.view(), k.view(), v.view(), f.out.view(), f.lse.view(), o);
    for (const Tensor* t : {&g.dq, &g.dk, &g.dv, &g.dsinks})
      for (int64_t i = 0; i < t->numel(); ++i) ASSERT_EQ(t->data()[i], 0.0f);
  }
}

// The paged call and the batched call apply the sinks exactly as the contiguous call does.
TEST(AttentionSinks, PagedAndBatchedCallsAreTheContiguousCall) {
  auto gen = test::test_rng();
  const int64_t Hq = 4, Hkv = 2, D = 32, bs = 16;
  const std::vector<float> sinks = {0.5f, -0.25f, 2.0f, 1.0f};
  for (const auto [Tq, Tk] : {std::pair<int64_t, int64_t>{1, 70}, {9, 41}}) {
    SCOPED_TRACE(testing::Message() << "Tq " << Tq << " Tk " << Tk);
    const Tensor q = test::random_tensor(gen, {1, Hq, Tq, D});
    const Tensor k = test::random_tensor(gen, {1, Hkv, Tk, D}), v = test::random_tensor(gen, {1, Hkv, Tk, D});
    const test::PagedCopy blocks = test::paged_copy(k, v, bs, &gen);
    AttentionOptions o;
    o.causal = true;
    o.sinks = sinks;
    Tensor want({1, Hq, Tq, D}), paged({1, Hq, Tq, D}), batched({1, Hq, Tq, D});
    scaled_dot_product_attention(q.view(), k.view(), v.view(), want.view(), o);
    const PagedKV kv{blocks.k_blocks, blocks.v_blocks, bs, Tk, Hkv, D, D};
    scaled_dot_product_attention(q.view(), kv, paged.view(), o);
    AttentionBatchItem<float> items[2];
    items[0].q = q.view();
    items[0].k = k.view();
    items[0].v = v.view();
    items[0].out = batched.view();
    Tensor second({1, Hq, Tq, D});
    items[1].q = q.view();
    items[1].paged = &kv;
    items[1].out = second.view();
    scaled_dot_product_attention<float>(std::span<const AttentionBatchItem<float>>(items), o);
    for (int64_t i = 0; i < want.numel(); ++i) {
      ASSERT_EQ(paged.data()[i], want.data()[i]) << i;
      ASSERT_EQ(batched.data()[i], want.data()[i]) << i;
      ASSERT_EQ(second.data()[i], want.data()[i]) << i;
    }
  }
}

TEST(AttentionSinks, BadSinksAreNamed) {
  auto gen = test::test_rng();
  const Tensor q = test::random_tensor(gen, {1, 4, 3, 8}), k = test::random_tensor(gen, {1, 2, 3, 8}),
               v = test::random_tensor(gen, {1, 2, 3, 8});
  const auto message_of = [&](const std::vector<float>& sinks) {
    AttentionOptions o;
    o.sinks = sinks;
    try {
      scaled_dot_product_attention(q.view(), k.view(), v.view(), o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message_of({1, 2, 3}).find("sinks: expected 4 logits (one per query head, Hq = q.shape[1]), got 3 logits"),
            std::string::npos)
      << message_of({1, 2, 3});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(message_of({0, nan, 0, 0}).find("sinks[1]: expected a finite logit"), std::string::npos)
      << message_of({0, nan, 0, 0});
  // dsinks without sinks, and sinks in the 16-bit backward (which has no dsinks output).
  const AttentionResult f = scaled_dot_product_attention(q.view(), k.view(), v.view());
  Tensor dq({1, 4, 3, 8}), dk({1, 2, 3, 8}), dv({1, 2, 3, 8}), ds({4});
  EXPECT_THROW(scaled_dot_product_attention_backward(f.out.view(), q.view(), k.view(), v.view(), f.out.view(),
                                                     f.lse.view(), dq.view(), dk.view(), dv.view(), {}, ds.view()),
               Error);
}

}  // namespace
}  // namespace mhsa
