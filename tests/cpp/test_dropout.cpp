// tests/cpp/test_dropout.cpp — dropout on the attention probabilities: the keep mask's rate and
// independence, the forward and backward of every kernel against a float64 oracle that applies
// the same mask (out = (P∘Z) V; dV = (P∘Z)ᵀ dO, dS = P∘(Z∘dP − D)), bitwise determinism over
// thread counts, p = 0 being no dropout at all, and the option's validation.
#include <omp.h>

#include <cstring>

#include "kernels/attention_backends.h"
#include "kernels/attention_params.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

// The mask of every row, [B, Hq, Tq, Tk], as the kernels draw it.
std::vector<float> dropout_factors(int64_t B, int64_t Hq, int64_t Tq, int64_t Tk, float p, uint64_t seed) {
  kernels::AttentionParams params;
  params.B = B;
  params.Hq = Hq;
  params.Tq = Tq;
  params.dropout = p;
  params.dropout_seed = seed;
  std::vector<float> z(static_cast<size_t>(B * Hq * Tq * Tk));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Tq; ++i)
        kernels::dropout_scales(params, b, h, i, 0, Tk, z.data() + ((b * Hq + h) * Tq + i) * Tk);
  return z;
}

TEST(Dropout, MaskKeepsOneMinusPAndDependsOnSeedAndPosition) {
  const float p = 0.3f;
  const std::vector<float> z = dropout_factors(2, 3, 50, 2000, p, 12345), other = dropout_factors(2, 3, 50, 2000, p, 12346);
  double kept = 0, same = 0, same_as_next_row = 0;
  for (size_t n = 0; n < z.size(); ++n) {
    ASSERT_TRUE(z[n] == 0.0f || z[n] == 1.0f / (1.0f - p)) << z[n];
    kept += z[n] != 0.0f;
    same += (z[n] != 0.0f) == (other[n] != 0.0f);
    if (n + 2000 < z.size()) same_as_next_row += (z[n] != 0.0f) == (z[n + 2000] != 0.0f);
  }
  const double N = double(z.size()), sigma = std::sqrt(p * (1 - p) / N);
  EXPECT_NEAR(kept / N, 1.0 - p, 6 * sigma);
  // Independent masks agree on a fraction p² + (1 − p)² of the entries.
  const double agree = p * p + (1 - p) * (1 - p);
  EXPECT_NEAR(same / N, agree, 0.01) << "another seed";
  EXPECT_NEAR(same_as_next_row / (N - 2000), agree, 0.01) << "the next row";
  // A slice of a row is the row's slice (blocks of any size see the same mask).
  const std::vector<float> again = dropout_factors(2, 3, 50, 2000, p, 12345);
  EXPECT_EQ(0, std::memcmp(z.data(), again.data(), z.size() * sizeof(float)));
  kernels::AttentionParams params;
  params.B = 2;
  params.Hq = 3;
  params.Tq = 50;
  params.dropout = p;
  params.dropout_seed = 12345;
  std::vector<float> part(77);
  kernels::dropout_scales(params, 1, 2, 49, 1000, 77, part.data());
  EXPECT_EQ(0, std::memcmp(part.data(), z.data() + ((1 * 3 + 2) * 50 + 49) * 2000 + 1000, 77 * sizeof(float)));
}

struct Case {
  int64_t B, Hq, Hkv, Tq, Tk, D;
  bool causal, masked;
  Variant var;
  float p;
};

class DropoutGrid : public ::testing::TestWithParam<Case> {};

TEST_P(DropoutGrid, ForwardAndBackwardMatchFloat64Oracle) {
  const Case c = GetParam();
  auto gen = test_rng();
  const uint64_t seed = gen();
  const Tensor q = random_tensor(gen, {c.B, c.Hq, c.Tq, c.D}), k = random_tensor(gen, {c.B, c.Hkv, c.Tk, c.D});
  const Tensor v = random_tensor(gen, {c.B, c.Hkv, c.Tk, c.D}), dout = random_tensor(gen, {c.B, c.Hq, c.Tq, c.D});
  Tensor mask = c.masked ? random_tensor(gen, {1, c.Hq, c.Tq, c.Tk}) : Tensor();
  for (int64_t i = 0; c.masked && i < mask.numel(); i += 7) mask.data()[i] = -INFINITY;
  AttentionOptions opt;
  opt.causal = c.causal;
  opt.attn_mask = mask.defined() ? mask.view() : ConstTensorView{};
  opt.dropout = {c.p, seed};
  c.var.apply(opt);
  const double scale = 1.0 / std::sqrt(double(c.D));
  const Oracle o = naive_attention(q.view(), k.view(), v.view(), c.causal, scale, opt.attn_mask, {}, c.var);
  const std::vector<float> z = dropout_factors(c.B, c.Hq, c.Tq, c.Tk, c.p, seed);

  // out = (P∘Z) V;  dV = (P∘Z)ᵀ dO;  dP' = Z∘(dO Vᵀ);  dS = P∘(dP' − rowsum(P∘dP'))∘cap'
  const int64_t B = c.B, Hq = c.Hq, Hkv = c.Hkv, Tq = c.Tq, Tk = c.Tk, D = c.D;
  const ConstTensorView qv = q.view(), kv = k.view(), vv = v.view(), gv = dout.view();
  std::vector<double> out(static_cast<size_t>(B * Hq * Tq * D)), dq(out.size()),
      dk(static_cast<size_t>(B * Hkv * Tk * D)), dv(dk.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        const int64_t hk = h * Hkv / Hq, row = (b * Hq + h) * Tq + i;
        const double* prob = o.probs.data() + row * Tk;
        const float* zr = z.data() + row * Tk;
        std::vector<double> dp(static_cast<size_t>(Tk));
        double rowsum = 0.0;
        for (int64_t j = 0; j < Tk; ++j) {
          for (int64_t d = 0; d < D; ++d) {
            out[row * D + d] += prob[j] * zr[j] * vv.at(b, hk, j, d);
            dp[j] += double(gv.at(b, h, i, d)) * vv.at(b, hk, j, d);
          }
          dp[j] *= zr[j];
          rowsum += prob[j] * dp[j];
        }
        for (int64_t j = 0; j < Tk; ++j) {
          const double ds = prob[j] * (dp[j] - rowsum) * o.dcap[static_cast<size_t>(row * Tk + j)] * scale;
          for (int64_t d = 0; d < D; ++d) {
            dq[row * D + d] += ds * kv.at(b, hk, j, d);
            dk[((b * Hkv + hk) * Tk + j) * D + d] += ds * qv.at(b, h, i, d);
            dv[((b * Hkv + hk) * Tk + j) * D + d] += prob[j] * zr[j] * gv.at(b, h, i, d);
          }
        }
      }

  std::vector<std::optional<cpu::Isa>> kernels = {std::nullopt};
  for (cpu::Isa isa : cpu::usable_isas()) kernels.emplace_back(isa);
  for (const auto& isa : kernels) {
    SCOPED_TRACE(isa ? std::string(cpu::isa_name(*isa)) : std::string("reference"));
    const double tol = isa ? 1e-5 : 1e-6;
    AttentionResult fwd{Tensor({B, Hq, Tq, D}), Tensor({B, Hq, Tq})};
    detail::scaled_dot_product_attention_on(isa, q.view(), k.view(), v.view(), fwd.out.view(), opt, fwd.lse.view());
    EXPECT_LE(rel_l2(fwd.out.data(), out), tol) << "out";
    for (size_t r = 0; r < o.lse.size(); ++r)  // the row sums are not dropped; -inf: a fully masked row
      if (std::isinf(o.lse[r])) EXPECT_EQ(fwd.lse.data()[r], o.lse[r]) << "lse row " << r;
      else EXPECT_NEAR(fwd.lse.data()[r], o.lse[r], 1e-5 * (1 + std::abs(o.lse[r]))) << "lse row " << r;
    AttentionGrads g{Tensor({B, Hq, Tq, D}), Tensor({B, Hkv, Tk, D}), Tensor({B, Hkv, Tk, D})};
    detail::scaled_dot_product_attention_backward_on(isa, dout.view(), q.view(), k.view(), v.view(), fwd.out.view(),
                                                     fwd.lse.view(), g.dq.view(), g.dk.view(), g.dv.view(), opt);
    EXPECT_LE(rel_l2(g.dq.data(), dq), tol) << "dq";
    EXPECT_LE(rel_l2(g.dk.data(), dk), tol) << "dk";
    EXPECT_LE(rel_l2(g.dv.data(), dv), tol) << "dv";
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, DropoutGrid,
                         ::testing::Values(Case{1, 2, 2, 1, 1, 40, false, false, {}, 0.1f},
                                           Case{2, 3, 3, 97, 97, 64, true, false, {}, 0.1f},
                                           Case{1, 4, 2, 33, 70, 80, true, true, {20, -1, true, 4.0f}, 0.5f},
                                           Case{2, 6, 3, 3, 300, 96, false, true, {}, 0.2f},  // few queries
                                           Case{1, 2, 1, 1, 700, 40, true, false, {}, 0.9f},  // one query
                                           Case{1, 1, 1, 300, 300, 40, true, false, {64, -1}, 0.25f}),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return "Hq" + std::to_string(c.Hq) + "_Hkv" + std::to_string(c.Hkv) + "_Tq" +
                                  std::to_string(c.Tq) + "_Tk" + std::to_string(c.Tk) + "_D" + std::to_string(c.D) +
                                  (c.causal ? "_causal" : "") + (c.masked ? "_mask" : "") + c.var.name() + "_p" +
                                  std::to_string(static_cast<int>(c.p * 100));
                         });

TEST(Dropout, BitwiseIdenticalForAnyThreadCountAndZeroIsNone) {
  auto gen = test_rng();
  const Tensor q = random_tensor(gen, {2, 4, 203, 40}), k = random_tensor(gen, {2, 2, 203, 40});
  const Tensor v = random_tensor(gen, {2, 2, 203, 40}), dout = random_tensor(gen, {2, 4, 203, 40});
  for (cpu::Isa isa : cpu::usable_isas()) {
    std::vector<Tensor> outs;
    for (const AttentionDropout drop : {AttentionDropout{0.2f, 7}, AttentionDropout{0.2f, 7}, AttentionDropout{0.2f, 7},
                                        AttentionDropout{0.0f, 7}, AttentionDropout{}}) {
      omp_set_num_threads(static_cast<int>(outs.size() % 3) + 1);
      AttentionOptions opt;
      opt.causal = true;
      opt.dropout = drop;
      AttentionResult r{Tensor({2, 4, 203, 40}), Tensor({2, 4, 203})};
      detail::scaled_dot_product_attention_on(isa, q.view(), k.view(), v.view(), r.out.view(), opt, r.lse.view());
      AttentionGrads g{Tensor({2, 4, 203, 40}), Tensor({2, 2, 203, 40}), Tensor({2, 2, 203, 40})};
      detail::scaled_dot_product_attention_backward_on(isa, dout.view(), q.view(), k.view(), v.view(), r.out.view(),
                                                       r.lse.view(), g.dq.view(), g.dk.view(), g.dv.view(), opt);
      outs.push_back(std::move(r.out));
      outs.push_back(std::move(g.dk));
    }
    omp_set_num_threads(omp_get_num_procs());
    const auto same = [&](size_t a, size_t b) {
      return 0 == std::memcmp(outs[a].data(), outs[b].data(), sizeof(float) * outs[a].numel());
    };
    for (size_t r : {1u, 2u}) {
      EXPECT_TRUE(same(0, 2 * r)) << cpu::isa_name(isa) << " out, run " << r;
      EXPECT_TRUE(same(1, 2 * r + 1)) << cpu::isa_name(isa) << " dk, run " << r;
    }
    EXPECT_FALSE(same(0, 6)) << "dropout changed nothing";
    EXPECT_TRUE(same(6, 8) && same(7, 9)) << cpu::isa_name(isa) << " p = 0 differs from no dropout";
  }
}

TEST(Dropout, RejectsProbabilitiesOutsideZeroToOne) {
  const Tensor q({1, 1, 2, 8}), k({1, 1, 2, 8}), v({1, 1, 2, 8});
  for (float p : {1.0f, -0.1f, 2.0f, NAN}) {
    AttentionOptions opt;
    opt.dropout.p = p;
    expect_error([&] { scaled_dot_product_attention(q.view(), k.view(), v.view(), opt); },
                 {"scaled_dot_product_attention", "dropout.p", "a probability in [0, 1)"});
  }
}

}  // namespace
}  // namespace mhsa::test
