// tests/cpp/test_backward.cpp — scaled_dot_product_attention_backward on every kernel against a
// float64 oracle that materialises P and dS whole, over odd sizes, masks, key lengths, grouped
// heads and strides; fully masked rows; determinism across thread counts; rows whose float32 lse is
// too coarse for exp(s − lse) (every score equal at 5.9e5; lse near 28 under every option).
#include <omp.h>

#include <cstring>

#include "kernels/attention_backends.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

struct Grads {
  std::vector<double> dq, dk, dv;
};

// dV = Pᵀ dO, dS = P ∘ (dO Vᵀ − rowsum(P ∘ dO Vᵀ)) ∘ cap', dQ = σ dS K, dK = σ dSᵀ Q, summed over
// groups (cap' = 1 − tanh² with soft-capping, from the oracle's forward).
Grads naive_backward(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                     const ConstTensorView& dout, const Oracle& fwd, double scale) {
  const std::vector<double>& probs = fwd.probs;
  const int64_t B = q.shape[0], Hq = q.shape[1], Tq = q.shape[2], D = q.shape[3];
  const int64_t Hkv = k.shape[1], Tk = k.shape[2], Dv = v.shape[3];
  Grads g{std::vector<double>(static_cast<size_t>(B * Hq * Tq * D)), std::vector<double>(static_cast<size_t>(B * Hkv * Tk * D)),
          std::vector<double>(static_cast<size_t>(B * Hkv * Tk * Dv))};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h * Hkv / Hq;
      for (int64_t i = 0; i < Tq; ++i) {
        const double* p = probs.data() + ((b * Hq + h) * Tq + i) * Tk;
        std::vector<double> dp(static_cast<size_t>(Tk));
        double rowsum = 0.0;
        for (int64_t j = 0; j < Tk; ++j) {
          for (int64_t d = 0; d < Dv; ++d) dp[j] += double(dout.at(b, h, i, d)) * v.at(b, hk, j, d);
          rowsum += p[j] * dp[j];
        }
        for (int64_t j = 0; j < Tk; ++j) {
          const double ds = p[j] * (dp[j] - rowsum) * fwd.dcap[static_cast<size_t>(((b * Hq + h) * Tq + i) * Tk + j)];
          for (int64_t d = 0; d < D; ++d) {
            g.dq[((b * Hq + h) * Tq + i) * D + d] += scale * ds * k.at(b, hk, j, d);
            g.dk[((b * Hkv + hk) * Tk + j) * D + d] += scale * ds * q.at(b, h, i, d);
          }
          for (int64_t d = 0; d < Dv; ++d) g.dv[((b * Hkv + hk) * Tk + j) * Dv + d] += p[j] * dout.at(b, h, i, d);
        }
      }
    }
  return g;
}

struct Case {
  int64_t B, Hq, Hkv, Tq, Tk, D, Dv;
  bool causal, masked, lengths, strided;
  Variant var = {};
};

std::string case_name(const Case& c) {
  return "B" + std::to_string(c.B) + "_Hq" + std::to_string(c.Hq) + "_Hkv" + std::to_string(c.Hkv) + "_Tq" +
         std::to_string(c.Tq) + "_Tk" + std::to_string(c.Tk) + "_D" + std::to_string(c.D) + "_Dv" + std::to_string(c.Dv) +
         (c.causal ? "_causal" : "") + (c.masked ? "_mask" : "") + (c.lengths ? "_lengths" : "") +
         (c.strided ? "_strided" : "") + c.var.name();
}
void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

class BackwardGrid : public ::testing::TestWithParam<Case> {};

TEST_P(BackwardGrid, MatchesFloat64Oracle) {
  const Case c = GetParam();
  auto gen = test_rng();
  const Tensor q = random_tensor(gen, {c.B, c.Hq, c.Tq, c.D}), k = random_tensor(gen, {c.B, c.Hkv, c.Tk, c.D});
  const Tensor v = random_tensor(gen, {c.B, c.Hkv, c.Tk, c.Dv}), dout = random_tensor(gen, {c.B, c.Hq, c.Tq, c.Dv});
  Tensor mask = c.masked ? random_tensor(gen, {1, c.Hq, c.Tq, c.Tk}) : Tensor();
  for (int64_t i = 0; c.masked && i < mask.numel(); i += 7) mask.data()[i] = -INFINITY;
  std::vector<int64_t> lengths;
  for (int64_t b = 0; c.lengths && b < c.B; ++b) lengths.push_back(b == 1 ? 0 : c.Tk - 2 * b);
  AttentionOptions opt;
  opt.causal = c.causal;
  opt.attn_mask = mask.defined() ? mask.view() : ConstTensorView{};
  opt.kv_lengths = lengths;
  opt.backend = Backend::reference;
  c.var.apply(opt);
  const double scale = 1.0 / std::sqrt(double(c.D));
  const AttentionResult fwd = scaled_dot_product_attention(q.view(), k.view(), v.view(), opt);
  const Oracle o = naive_attention(q.view(), k.view(), v.view(), c.causal, scale, opt.attn_mask, lengths, c.var);
  const Grads want = naive_backward(q.view(), k.view(), v.view(), dout.view(), o, scale);

  StridedCopy qs = strided_copy(q, {0, 2, 1, 3}, 3), ks = strided_copy(k, {1, 0, 2, 3}, 0, 2),
              gs = strided_copy(dout, {2, 0, 1, 3}, 1);
  const ConstTensorView qv = c.strided ? qs.view : q.view(), kv = c.strided ? ks.view : k.view();
  const ConstTensorView gv = c.strided ? gs.view : dout.view();
  AttentionGrads got{Tensor({c.B, c.Hq, c.Tq, c.D}), Tensor({c.B, c.Hkv, c.Tk, c.D}), Tensor({c.B, c.Hkv, c.Tk, c.Dv})};
  std::vector<std::optional<cpu::Isa>> kernels = {std::nullopt};
  for (cpu::Isa isa : cpu::usable_isas()) kernels.emplace_back(isa);
  for (const auto& isa : kernels) {
    SCOPED_TRACE(isa ? std::string(cpu::isa_name(*isa)) : std::string("reference"));
    const double tol = isa ? 1e-5 : 1e-6;  // float64 sums in the reference, float32 in the fast kernels
    detail::scaled_dot_product_attention_backward_on(isa, gv, qv, kv, v.view(), fwd.out.view(), fwd.lse.view(),
                                                     got.dq.view(), got.dk.view(), got.dv.view(), opt);
    EXPECT_LE(rel_l2(got.dq.data(), want.dq), tol) << "dq";
    EXPECT_LE(rel_l2(got.dk.data(), want.dk), tol) << "dk";
    EXPECT_LE(rel_l2(got.dv.data(), want.dv), tol) << "dv";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, BackwardGrid,
    ::testing::Values(Case{1, 2, 2, 1, 1, 40, 40, false, false, false, false},
                      Case{2, 3, 3, 97, 97, 64, 64, true, false, false, false},
                      Case{1, 2, 2, 97, 97, 80, 80, false, false, false, false},
                      Case{2, 4, 2, 33, 70, 96, 96, true, false, true, false},
                      Case{2, 6, 3, 19, 41, 40, 72, false, true, true, true},
                      Case{1, 1, 1, 300, 300, 128, 128, true, false, false, true},
                      Case{2, 8, 1, 5, 129, 64, 64, true, true, false, false},
                      Case{1, 2, 2, 40, 7, 1, 3, true, false, false, false},
                      Case{1, 1, 1, 1025, 1025, 40, 40, true, false, false, false},
                      // Sliding windows, soft-capping, top-left alignment (D 40, 80, 96; T 1, 97, 1025;
                      // grouped heads, masks, key lengths; decode shapes, whose scores come from decode_dot).
                      Case{1, 2, 2, 1, 1, 40, 40, true, false, false, false, {0, -1, false, 3.0f}},
                      Case{2, 3, 3, 97, 97, 80, 80, true, false, false, false, {13, -1}},
                      Case{1, 2, 2, 97, 97, 96, 96, false, false, false, false, {7, 11, false, 2.5f}},
                      Case{2, 4, 2, 33, 70, 40, 40, true, true, true, false, {20, -1, true, 4.0f}},
                      Case{2, 6, 3, 70, 33, 96, 96, true, false, true, true, {-1, -1, true}},
                      Case{2, 6, 3, 19, 41, 40, 72, false, true, true, true, {5, 2, true}},
                      Case{2, 8, 1, 5, 129, 64, 64, true, true, false, false, {40, -1, false, 3.0f}},
                      Case{1, 6, 2, 3, 600, 80, 80, true, false, true, false, {200, -1, true, 5.0f}},
                      Case{1, 1, 1, 1025, 1025, 40, 40, true, false, false, false, {255, -1, false, 5.0f}},
                      Case{1, 2, 1, 1025, 1025, 96, 96, false, false, false, false, {64, 64}}),
    [](const auto& info) { return case_name(info.param); });

TEST(Backward, BitwiseIdenticalForAnyThreadCount) {
  auto gen = test_rng();
  const Tensor q = random_tensor(gen, {2, 6, 150, 40}), k = random_tensor(gen, {2, 3, 150, 40});
  const Tensor v = random_tensor(gen, {2, 3, 150, 40}), dout = random_tensor(gen, {2, 6, 150, 40});
  for (const Variant& var : {Variant{}, Variant{60, -1, false, 5.0f}}) {
    AttentionOptions opt;
    opt.causal = true;
    var.apply(opt);
    const AttentionResult fwd = scaled_dot_product_attention(q.view(), k.view(), v.view(), opt);
    std::vector<AttentionGrads> runs;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      runs.push_back(scaled_dot_product_attention_backward(dout.view(), q.view(), k.view(), v.view(), fwd.out.view(),
                                                           fwd.lse.view(), opt));
    }
    omp_set_num_threads(omp_get_num_procs());
    for (size_t i = 1; i < runs.size(); ++i) {
      EXPECT_EQ(0, std::memcmp(runs[0].dq.data(), runs[i].dq.data(), sizeof(float) * runs[0].dq.numel())) << var.name();
      EXPECT_EQ(0, std::memcmp(runs[0].dk.data(), runs[i].dk.data(), sizeof(float) * runs[0].dk.numel())) << var.name();
      EXPECT_EQ(0, std::memcmp(runs[0].dv.data(), runs[i].dv.data(), sizeof(float) * runs[0].dv.numel())) << var.name();
    }
  }
}

// A row that sees one key (a mask leaving one key at a random position, kv_lengths = 1, or a causal
// window of one key with soft-capping) has P = 1 and dS = 0 exactly: dq = dk = 0 bit for bit, on
// every kernel and both forward paths (the backward recomputes the forward's capped scores exactly).
// A NaN lse (a NaN q row) gives NaN gradients, not zeros.
TEST(Backward, OneVisibleKeyGivesExactlyZeroAndNanGivesNan) {
  auto gen = test_rng();
  for (const auto& [Tq, Tk] : {std::pair<int64_t, int64_t>{4, 50}, {70, 300}}) {
    const int64_t H = 3, D = 40;
    Tensor q = random_tensor(gen, {1, H, Tq, D});
    const Tensor k = random_tensor(gen, {1, H, Tk, D}), v = random_tensor(gen, {1, H, Tk, D});
    const Tensor dout = random_tensor(gen, {1, H, Tq, D});
    Tensor mask({1, H, Tq, Tk});
    for (int64_t r = 0; r < H * Tq; ++r) {
      const int64_t keep = std::uniform_int_distribution<int64_t>(0, Tk - 1)(gen);
      for (int64_t j = 0; j < Tk; ++j) mask.data()[r * Tk + j] = j == keep ? 0.0f : -INFINITY;
    }
    const std::vector<int64_t> one = {1};
    AttentionOptions by_mask, by_length, by_window;
    by_mask.attn_mask = mask.view();
    by_length.kv_lengths = one;
    by_window.causal = true;
    by_window.window.left = 0;
    by_window.softcap = 3.0f;
    const Tensor zeros({1, H, Tq, Tk});  // a mask that keeps every key: the fused cap + mask step
    by_window.attn_mask = zeros.view();
    std::vector<std::optional<cpu::Isa>> kernels = {std::nullopt};
    for (cpu::Isa isa : cpu::usable_isas()) kernels.emplace_back(isa);
    for (const auto& isa : kernels)
      for (const AttentionOptions* opt : {&by_mask, &by_length, &by_window}) {
        SCOPED_TRACE((isa ? std::string(cpu::isa_name(*isa)) : std::string("reference")) + " Tq=" + std::to_string(Tq) +
                     (opt == &by_mask ? " mask" : opt == &by_length ? " kv_lengths" : " window"));
        AttentionResult f{Tensor({1, H, Tq, D}), Tensor({1, H, Tq})};
        detail::scaled_dot_product_attention_on(isa, q.view(), k.view(), v.view(), f.out.view(), *opt, f.lse.view());
        AttentionGrads g{Tensor({1, H, Tq, D}), Tensor({1, H, Tk, D}), Tensor({1, H, Tk, D})};
        detail::scaled_dot_product_attention_backward_on(isa, dout.view(), q.view(), k.view(), v.view(), f.out.view(),
                                                         f.lse.view(), g.dq.view(), g.dk.view(), g.dv.view(), *opt);
        for (int64_t i = 0; i < g.dq.numel(); ++i) ASSERT_EQ(g.dq.data()[i], 0.0f) << "dq " << i;
        for (int64_t i = 0; i < g.dk.numel(); ++i) ASSERT_EQ(g.dk.data()[i], 0.0f) << "dk " << i;
      }
    q.data()[(1 * Tq + 2) * D + 7] = NAN;  // head 1, row 2
    AttentionOptions causal;
    causal.causal = true;
    for (const auto& isa : kernels) {
      SCOPED_TRACE((isa ? std::string(cpu::isa_name(*isa)) : std::string("reference")) + " NaN Tq=" + std::to_string(Tq));
      AttentionResult f{Tensor({1, H, Tq, D}), Tensor({1, H, Tq})};
      detail::scaled_dot_product_attention_on(isa, q.view(), k.view(), v.view(), f.out.view(), causal, f.lse.view());
      ASSERT_TRUE(std::isnan(f.lse.data()[Tq + 2]));
      AttentionGrads g{Tensor({1, H, Tq, D}), Tensor({1, H, Tk, D}), Tensor({1, H, Tk, D})};
      detail::scaled_dot_product_attention_backward_on(isa, dout.view(), q.view(), k.view(), v.view(), f.out.view(),
                                                       f.lse.view(), g.dq.view(), g.dk.view(), g.dv.view(), causal);
      for (int64_t d = 0; d < D; ++d) EXPECT_TRUE(std::isnan(g.dq.data()[(Tq + 2) * D + d]));
      EXPECT_TRUE(std::isnan(g.dk.data()[Tk * D])) << "key 0 of head 1";
      EXPECT_TRUE(std::isnan(g.dv.data()[Tk * D])) << "key 0 of head 1";
      EXPECT_FALSE(std::isnan(g.dq.data()[(Tq + 3) * D])) << "another row";
    }
  }
}

// A PyTorch edge case: every score equal, at 5.9e5 (B1 H32 T23 D80). The float32 lse's ulp there is
// 0.0625, and P recomputed as exp(s − lse) was off by up to 3% (dq, dk, dv 1e-2 from the oracle);
// the fast backwards recompute such a row's max and sum (lse_too_coarse), the reference divides by
// its own sum. q·k comes from dim 0 (q large, k 1); dims 40-59 vary in q only, 60-79 in k only, so
// every score is exactly equal and no gradient is zero. Each kernel's own forward gives out and lse.
TEST(Backward, AllScoresEqualAtLargeMagnitude) {
  auto gen = test_rng();
  const int64_t B = 1, H = 32, T = 23, D = 80;
  const double scale = 1.0 / std::sqrt(double(D));
  Tensor q({B, H, T, D}), k({B, H, T, D});
  const Tensor qr = random_tensor(gen, {B, H, T, D}), kr = random_tensor(gen, {B, H, T, D});
  for (int64_t r = 0; r < B * H * T; ++r)
    for (int64_t d = 0; d < D; ++d) {
      q.data()[r * D + d] = d == 0 ? static_cast<float>(5.9e5 / scale) : d >= 40 && d < 60 ? qr.data()[r * D + d] : 0.0f;
      k.data()[r * D + d] = d == 0 ? 1.0f : d >= 60 ? kr.data()[r * D + d] : 0.0f;
    }
  const Tensor v = random_tensor(gen, {B, H, T, D}), dout = random_tensor(gen, {B, H, T, D});
  const AttentionOptions opt;
  const Oracle o = naive_attention(q.view(), k.view(), v.view(), false, scale, {}, {});
  const Grads want = naive_backward(q.view(), k.view(), v.view(), dout.view(), o, scale);
  std::vector<std::optional<cpu::Isa>> kernels = {std::nullopt};
  for (cpu::Isa isa : cpu::usable_isas()) kernels.emplace_back(isa);
  for (const auto& isa : kernels) {
    SCOPED_TRACE(isa ? std::string(cpu::isa_name(*isa)) : std::string("reference"));
    AttentionResult f{Tensor({B, H, T, D}), Tensor({B, H, T})};
    detail::scaled_dot_product_attention_on(isa, q.view(), k.view(), v.view(), f.out.view(), opt, f.lse.view());
    ASSERT_NEAR(f.lse.data()[0], 5.9e5 + std::log(23.0), 0.1);
    AttentionGrads g{Tensor({B, H, T, D}), Tensor({B, H, T, D}), Tensor({B, H, T, D})};
    detail::scaled_dot_product_attention_backward_on(isa, dout.view(), q.view(), k.view(), v.view(), f.out.view(),
                                                     f.lse.view(), g.dq.view(), g.dk.view(), g.dv.view(), opt);
    const double tol = isa ? 1e-6 : 1e-7;  // measured 1.7e-7 (fast) against PyTorch fp32's 1.9e-7
    EXPECT_LE(rel_l2(g.dq.data(), want.dq), tol) << "dq";
    EXPECT_LE(rel_l2(g.dk.data(), want.dk), tol) << "dk";
    EXPECT_LE(rel_l2(g.dv.data(), want.dv), tol) << "dv";
  }
}

// Rows whose lse is past 16 take the recomputed max and sum (lse_too_coarse) under every option: a
// float mask of N(24, 1) (every 7th key −∞) puts each lse near 28, on the blocked and the decode
// shapes, with causal, window, top-left, soft-capping and key-length limits; against the oracle as
// in the grid. A mask keeping one key at +24 still gives dq = dk = 0 exactly (P = 1).
TEST(Backward, LargeLseRowsMatchTheOracleUnderEveryOption) {
  auto gen = test_rng();
  struct LargeCase {
    int64_t Tq, Tk;
    bool causal, lengths;
    Variant var;
  };
  const int64_t B = 2, Hq = 4, Hkv = 2, D = 40;
  const double scale = 1.0 / std::sqrt(double(D));
  for (const LargeCase& c : {LargeCase{97, 97, true, false, {}}, LargeCase{3, 300, true, true, {100, -1, false, 5.0f}},
                             LargeCase{70, 33, true, true, {-1, -1, true}}, LargeCase{40, 200, false, false, {20, 7}},
                             LargeCase{300, 300, false, true, {-1, -1, false, 3.0f}}}) {
    const Tensor q = random_tensor(gen, {B, Hq, c.Tq, D}), k = random_tensor(gen, {B, Hkv, c.Tk, D});
    const Tensor v = random_tensor(gen, {B, Hkv, c.Tk, D}), dout = random_tensor(gen, {B, Hq, c.Tq, D});
    Tensor mask = random_tensor(gen, {1, Hq, c.Tq, c.Tk});
    for (int64_t i = 0; i < mask.numel(); ++i) mask.data()[i] = i % 7 == 3 ? -INFINITY : mask.data()[i] + 24.0f;
    std::vector<int64_t> lengths;
    for (int64_t b = 0; c.lengths && b < B; ++b) lengths.push_back(c.Tk - 5 * b);
    AttentionOptions opt;
    opt.causal = c.causal;
    opt.attn_mask = mask.view();
    opt.kv_lengths = lengths;
    c.var.apply(opt);
    const Oracle o = naive_attention(q.view(), k.view(), v.view(), c.causal, scale, opt.attn_mask, lengths, c.var);
    const Grads want = naive_backward(q.view(), k.view(), v.view(), dout.view(), o, scale);
    std::vector<std::optional<cpu::Isa>> kernels = {std::nullopt};
    for (cpu::Isa isa : cpu::usable_isas()) kernels.emplace_back(isa);
    for (const auto& isa : kernels) {
      SCOPED_TRACE((isa ? std::string(cpu::isa_name(*isa)) : std::string("reference")) + " Tq=" + std::to_string(c.Tq) +
                   " Tk=" + std::to_string(c.Tk) + c.var.name());
      AttentionResult f{Tensor({B, Hq, c.Tq, D}), Tensor({B, Hq, c.Tq})};
      detail::scaled_dot_product_attention_on(isa, q.view(), k.view(), v.view(), f.out.view(), opt, f.lse.view());
      ASSERT_GT(f.lse.data()[0], 16.0f);
      AttentionGrads g{Tensor({B, Hq, c.Tq, D}), Tensor({B, Hkv, c.Tk, D}), Tensor({B, Hkv, c.Tk, D})};
      detail::scaled_dot_product_attention_backward_on(isa, dout.view(), q.view(), k.view(), v.view(), f.out.view(),
                                                       f.lse.view(), g.dq.view(), g.dk.view(), g.dv.view(), opt);
      const double tol = isa ? 1e-5 : 1e-6;
      EXPECT_LE(rel_l2(g.dq.data(), want.dq), tol) << "dq";
      EXPECT_LE(rel_l2(g.dk.data(), want.dk), tol) << "dk";
      EXPECT_LE(rel_l2(g.dv.data(), want.dv), tol) << "dv";
    }
    // One key kept, at +24: P = 1 and dS = 0 exactly on the recomputed path too.
    for (int64_t r = 0; r < Hq * c.Tq; ++r) {
      const int64_t keep = std::uniform_int_distribution<int64_t>(0, c.Tk - 1)(gen);
      for (int64_t j = 0; j < c.Tk; ++j) mask.data()[r * c.Tk + j] = j == keep ? 24.0f : -INFINITY;
    }
    AttentionOptions one;
    one.attn_mask = mask.view();
    if (c.var.softcap > 0.0f) one.softcap = c.var.softcap;
    for (const auto& isa : kernels) {
      SCOPED_TRACE((isa ? std::string(cpu::isa_name(*isa)) : std::string("reference")) + " one key, Tq=" +
                   std::to_string(c.Tq));
      AttentionResult f{Tensor({B, Hq, c.Tq, D}), Tensor({B, Hq, c.Tq})};
      detail::scaled_dot_product_attention_on(isa, q.view(), k.view(), v.view(), f.out.view(), one, f.lse.view());
      AttentionGrads g{Tensor({B, Hq, c.Tq, D}), Tensor({B, Hkv, c.Tk, D}), Tensor({B, Hkv, c.Tk, D})};
      detail::scaled_dot_product_attention_backward_on(isa, dout.view(), q.view(), k.view(), v.view(), f.out.view(),
                                                       f.lse.view(), g.dq.view(), g.dk.view(), g.dv.view(), one);
      for (int64_t i = 0; i < g.dq.numel(); ++i) ASSERT_EQ(g.dq.data()[i], 0.0f) << "dq " << i;
      for (int64_t i = 0; i < g.dk.numel(); ++i) ASSERT_EQ(g.dk.data()[i], 0.0f) << "dk " << i;
    }
  }
}

TEST(Backward, RejectsMismatchedShapes) {
  const Tensor q({1, 2, 3, 4}), k({1, 2, 5, 4}), v({1, 2, 5, 4}), out({1, 2, 3, 4}), lse({1, 2, 3}), dout({1, 2, 3, 5});
  expect_error([&] { scaled_dot_product_attention_backward(dout.view(), q.view(), k.view(), v.view(), out.view(), lse.view()); },
               {"scaled_dot_product_attention_backward: dout: expected shape [1, 2, 3, 4] [B, Hq, Tq, Dv], got [1, 2, 3, 5]"});
  const Tensor lse_bad({1, 2, 4});
  expect_error([&] { scaled_dot_product_attention_backward(out.view(), q.view(), k.view(), v.view(), out.view(), lse_bad.view()); },
               {"lse: expected shape [1, 2, 3] [B, Hq, Tq], got [1, 2, 4]"});
}

}  // namespace
}  // namespace mhsa::test
