// tests/cpp/test_attention.cpp — scaled_dot_product_attention and attention_probabilities against
// the float64 oracle over odd sizes and every option of the contract; fully masked rows; strided
// views; determinism across thread counts.
#include <omp.h>

#include <cstring>

#include "kernels/attention_backends.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

enum class MaskKind { none, tk_2d, heads_3d, batch_broadcast_4d, full_4d };

struct Case {
  int64_t B, Hq, Hkv, Tq, Tk, D, Dv;
  bool causal = false;
  MaskKind mask = MaskKind::none;
  bool kv_lengths = false;
  bool strided = false;
  float scale = 0.0f;  // 0: default 1/sqrt(D)
  Variant var = {};    // window, alignment, soft-cap
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string s = "B" + std::to_string(c.B) + "_Hq" + std::to_string(c.Hq) + "_Hkv" + std::to_string(c.Hkv) + "_Tq" +
                  std::to_string(c.Tq) + "_Tk" + std::to_string(c.Tk) + "_D" + std::to_string(c.D) + "_Dv" +
                  std::to_string(c.Dv);
  if (c.causal) s += "_causal";
  if (c.mask != MaskKind::none) s += "_mask" + std::to_string(static_cast<int>(c.mask));
  if (c.kv_lengths) s += "_lengths";
  if (c.strided) s += "_strided";
  if (c.scale != 0.0f) s += "_scaled";
  s += c.var.name();
  return s + "_" + std::to_string(info.index);
}

std::vector<Case> grid() {
  std::vector<Case> cases;
  // Head sizes, each at a few odd lengths (T = 1, 2, 97), self-attention, plain and causal.
  for (int64_t D : {1, 40, 64, 80, 96, 128, 256})
    for (int64_t T : {1, 2, 97})
      for (bool causal : {false, true}) cases.push_back({2, 3, 3, T, T, D, D, causal});
  // Long sequences.
  cases.push_back({1, 1, 1, 1025, 1025, 40, 40, true});
  cases.push_back({1, 2, 1, 1025, 1025, 64, 64, false});
  cases.push_back({1, 1, 1, 1025, 1025, 256, 256, true, MaskKind::none, true});
  cases.push_back({1, 2, 2, 1, 1025, 96, 96, true});  // one decode query against a long cache
  // Tq != Tk, with the causal diagonal bottom-right.
  for (bool causal : {false, true}) {
    cases.push_back({2, 4, 4, 5, 33, 40, 40, causal});
    cases.push_back({1, 2, 2, 33, 5, 80, 80, causal});  // Tq > Tk: the first rows see nothing when causal
    cases.push_back({3, 2, 1, 1, 97, 64, 64, causal});
  }
  // Value head size different from the key head size.
  cases.push_back({1, 2, 2, 17, 23, 40, 72, true});
  // Grouped heads.
  cases.push_back({2, 6, 2, 97, 97, 40, 40, true});
  cases.push_back({1, 6, 3, 19, 41, 96, 96, false, MaskKind::full_4d, true});
  cases.push_back({2, 8, 1, 7, 7, 64, 64, false});
  // Masks in each broadcast form, key lengths, explicit scales, strided views.
  for (MaskKind m : {MaskKind::tk_2d, MaskKind::heads_3d, MaskKind::batch_broadcast_4d, MaskKind::full_4d})
    for (bool causal : {false, true}) cases.push_back({2, 4, 2, 13, 29, 40, 40, causal, m});
  for (bool causal : {false, true}) {
    cases.push_back({3, 2, 2, 31, 31, 80, 80, causal, MaskKind::none, true});
    cases.push_back({2, 4, 2, 31, 47, 96, 96, causal, MaskKind::tk_2d, true, true});
    cases.push_back({2, 3, 3, 97, 97, 40, 40, causal, MaskKind::none, false, true});
    cases.push_back({2, 2, 1, 9, 21, 64, 64, causal, MaskKind::none, false, false, 0.37f});
    cases.push_back({1, 2, 2, 9, 9, 128, 128, causal, MaskKind::heads_3d, true, true, 1.9f});
  }
  // Sliding windows (causal and not, both sides), top-left alignment with Tq != Tk both ways and
  // soft-capping, alone and together, on the lengths 1, 97, 1025 and head sizes 40, 80, 96 (block
  // skipping: a window of 256 keys in 1025; split-K slices skipped on the decode shapes).
  const Variant win{13, -1}, both{7, 11}, cap{-1, -1, false, 2.5f}, top{-1, -1, true};
  for (int64_t D : {40, 80, 96})
    for (int64_t T : {1, 97}) {
      cases.push_back({2, 3, 3, T, T, D, D, true, MaskKind::none, false, false, 0.0f, win});
      cases.push_back({2, 3, 3, T, T, D, D, false, MaskKind::none, false, false, 0.0f, both});
      cases.push_back({2, 3, 3, T, T, D, D, true, MaskKind::none, false, false, 0.0f, cap});
    }
  cases.push_back({1, 1, 1, 1025, 1025, 40, 40, true, MaskKind::none, false, false, 0.0f, {255, -1}});
  cases.push_back({1, 2, 1, 1025, 1025, 80, 80, true, MaskKind::none, false, false, 0.0f, {511, -1, false, 5.0f}});
  cases.push_back({1, 2, 2, 1, 1025, 96, 96, true, MaskKind::none, false, false, 0.0f, {300, -1}});
  cases.push_back({1, 6, 2, 5, 1025, 40, 40, true, MaskKind::none, true, false, 0.0f, {600, -1, false, 4.0f}});
  cases.push_back({1, 2, 2, 1025, 1025, 40, 40, false, MaskKind::none, false, false, 0.0f, {100, 37}});
  for (bool causal : {false, true}) {  // top-left: causal alone, with a window, Tq < Tk and Tq > Tk
    cases.push_back({2, 4, 4, 5, 33, 40, 40, causal, MaskKind::none, false, false, 0.0f, causal ? top : Variant{2, 3, true}});
    cases.push_back({1, 2, 2, 33, 5, 80, 80, causal, MaskKind::none, false, false, 0.0f, causal ? top : Variant{2, 3, true}});
    cases.push_back({2, 4, 2, 13, 29, 40, 40, causal, MaskKind::tk_2d, true, false, 0.0f, {3, 4, true}});
    cases.push_back({2, 6, 3, 19, 41, 96, 96, causal, MaskKind::full_4d, true, true, 0.0f, {9, -1, true, 3.0f}});
    cases.push_back({1, 2, 2, 33, 5, 40, 40, causal, MaskKind::none, true, false, 0.0f, {0, 0}});  // rows with no key
    cases.push_back({2, 2, 1, 9, 21, 64, 64, causal, MaskKind::heads_3d, false, false, 0.37f, {-1, -1, false, 1.5f}});
  }
  return cases;
}

void PrintTo(const Case& c, std::ostream* os) { *os << case_name({c, 0}); }

// Every kernel this machine runs: the reference (no ISA) and each ISA's fast kernels.
std::vector<std::optional<cpu::Isa>> kernels_here() {
  std::vector<std::optional<cpu::Isa>> all = {std::nullopt};
  for (cpu::Isa isa : cpu::usable_isas()) all.emplace_back(isa);
  return all;
}
std::string kernel_name(const std::optional<cpu::Isa>& isa) {
  return isa ? std::string(cpu::isa_name(*isa)) : std::string("reference");
}

class AttentionGrid : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionGrid, MatchesFloat64Oracle) {
  const Case c = GetParam();
  auto gen = test_rng();
  const Tensor q = random_tensor(gen, {c.B, c.Hq, c.Tq, c.D});
  const Tensor k = random_tensor(gen, {c.B, c.Hkv, c.Tk, c.D});
  const Tensor v = random_tensor(gen, {c.B, c.Hkv, c.Tk, c.Dv});

  // The mask is drawn as a 4-D tensor; the kernel gets it in the form under test.
  Tensor mask4;
  ConstTensorView mask_arg;
  if (c.mask != MaskKind::none) {
    const int64_t mb = c.mask == MaskKind::full_4d ? c.B : 1;
    const int64_t mh = c.mask == MaskKind::tk_2d || c.mask == MaskKind::batch_broadcast_4d ? 1 : c.Hq;
    mask4 = random_tensor(gen, {mb, mh, c.Tq, c.Tk}, 2.0f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int64_t i = 0; i < mask4.numel(); ++i)
      if (u(gen) < 0.2f) mask4.data()[i] = -INFINITY;
    if (c.mask == MaskKind::tk_2d) mask_arg = ConstTensorView(mask4.data(), {c.Tq, c.Tk});
    else if (c.mask == MaskKind::heads_3d) mask_arg = ConstTensorView(mask4.data(), {c.Hq, c.Tq, c.Tk});
    else mask_arg = mask4.view();
  }
  std::vector<int64_t> lengths;
  if (c.kv_lengths) {
    std::uniform_int_distribution<int64_t> len(0, c.Tk);
    for (int64_t b = 0; b < c.B; ++b) lengths.push_back(b == 0 ? c.Tk : len(gen));
  }

  AttentionOptions opt;
  opt.causal = c.causal;
  opt.attn_mask = mask_arg;
  opt.kv_lengths = lengths;
  opt.backend = Backend::reference;
  if (c.scale != 0.0f) opt.scale = c.scale;
  c.var.apply(opt);
  const double scale = c.scale != 0.0f ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.D));

  // Strided: q stored [B, Tq, Hq, D] with padded rows, k with T walked backwards, v [Hkv, B, Tk, Dv].
  StridedCopy qs, ks, vs;
  ConstTensorView qv = q.view(), kv = k.view(), vv = v.view();
  if (c.strided) {
    qs = strided_copy(q, {0, 2, 1, 3}, 3);
    ks = strided_copy(k, {0, 1, 2, 3}, 0, 2);
    vs = strided_copy(v, {1, 0, 2, 3}, 1);
    qv = qs.view, kv = ks.view, vv = vs.view;
  }
  const Oracle want = naive_attention(q.view(), k.view(), v.view(), c.causal, scale, mask4.view(), lengths, c.var);
  Tensor out({c.B, c.Hq, c.Tq, c.Dv}), lse({c.B, c.Hq, c.Tq});
  for (const auto& isa : kernels_here()) {
    SCOPED_TRACE(kernel_name(isa));
    // The reference accumulates in float64; the fast kernels in float32, held to the 1e-5.
    const double tol = isa ? 1e-5 : 1e-6;
    // An lse is held relative to the larger of itself and the scores' typical size, scale·√D for
    // these unit inputs: a float32 score carries a rounding error relative to that size, which
    // survives into an lse near 0 when the row's few visible keys cancel (an explicit scale of 1.9
    // at D = 128 gives scores of ±20 and an lse of -0.9 with an error of 1.4e-5 on 2 seeds in 1000).
    const double score_size = std::max(1.0, scale * std::sqrt(static_cast<double>(c.D)));
    detail::scaled_dot_product_attention_on(isa, qv, kv, vv, out.view(), opt, lse.view());
    EXPECT_LE(rel_l2(out.data(), want.out), tol);
    for (int64_t r = 0; r < lse.numel(); ++r) {
      ASSERT_FALSE(std::isnan(lse.data()[r])) << "row " << r;
      if (want.lse[r] == -INFINITY) {
        ASSERT_EQ(lse.data()[r], -INFINITY) << "row " << r;
        for (int64_t d = 0; d < c.Dv; ++d) ASSERT_EQ(out.data()[r * c.Dv + d], 0.0f) << "fully masked row " << r;
      } else {
        ASSERT_NEAR(lse.data()[r], want.lse[r], tol * std::max(score_size, std::fabs(want.lse[r]))) << "row " << r;
      }
    }
  }

  // The probabilities from the same inputs and the forward's lse.
  if (c.Tq * c.Tk <= 4096) {
    const Tensor probs = attention_probabilities(qv, kv, lse.view(), opt);
    double worst = 0.0;
    for (int64_t i = 0; i < probs.numel(); ++i) worst = std::max(worst, std::fabs(probs.data()[i] - want.probs[i]));
    EXPECT_LE(worst, 1e-6);
  }
}

INSTANTIATE_TEST_SUITE_P(Reference, AttentionGrid, ::testing::ValuesIn(grid()), case_name);

// Random shapes over the whole range the fast kernels take (D 1..256, T 1..3000, grouped heads,
// masks, key lengths, strides), every kernel against the oracle. The budget keeps the float64
// oracle to about a second.
TEST(Attention, RandomShapesEveryKernel) {
  auto gen = test_rng();
  auto pick = [&gen](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); };
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t D = pick(1, 256), Hkv = pick(1, 3), Hq = Hkv * pick(1, 4), B = pick(1, 2);
    const bool decode = trial % 3 == 0;
    int64_t Tk = pick(1, 3000), Tq = decode ? pick(1, 8) : pick(1, 3000);
    while (static_cast<double>(B * Hq * Tq) * static_cast<double>(Tk * D) > 1.5e8) (Tq > Tk ? Tq : Tk) /= 2;
    const int64_t Dv = trial % 4 == 1 ? pick(1, 256) : D;
    const bool causal = pick(0, 1) == 1, masked = pick(0, 2) == 0, padded = pick(0, 2) == 0, strided = pick(0, 1) == 1;
    Variant var;  // half the trials: a window, top-left alignment or soft-capping, at random
    if (trial % 2 == 1) {
      if (pick(0, 1) == 1) var.left = pick(0, Tk);
      if (pick(0, 3) == 0) var.right = pick(0, Tk);
      var.top_left = pick(0, 1) == 1;
      if (pick(0, 1) == 1) var.softcap = 4.0f;
    }
    SCOPED_TRACE(::testing::Message() << "B=" << B << " Hq=" << Hq << " Hkv=" << Hkv << " Tq=" << Tq << " Tk=" << Tk
                                      << " D=" << D << " Dv=" << Dv << " causal=" << causal << " mask=" << masked
                                      << " lengths=" << padded << " strided=" << strided << var.name());
    const Tensor q = random_tensor(gen, {B, Hq, Tq, D}), k = random_tensor(gen, {B, Hkv, Tk, D});
    const Tensor v = random_tensor(gen, {B, Hkv, Tk, Dv});
    Tensor mask = masked ? random_tensor(gen, {1, Hq, Tq, Tk}) : Tensor();
    std::vector<int64_t> lengths;
    for (int64_t b = 0; padded && b < B; ++b) lengths.push_back(pick(0, Tk));
    AttentionOptions opt;
    opt.causal = causal;
    opt.attn_mask = mask.defined() ? mask.view() : ConstTensorView{};
    opt.kv_lengths = lengths;
    var.apply(opt);
    // Strided: q stored [D, B, Hq, Tq] (head size not innermost), k stored [B, Tk, Hkv, D].
    StridedCopy qs = strided_copy(q, {3, 0, 1, 2}, 0), ks = strided_copy(k, {0, 2, 1, 3}, 3);
    const ConstTensorView qv = strided ? qs.view : q.view(), kv = strided ? ks.view : k.view();
    const Oracle want =
        naive_attention(q.view(), k.view(), v.view(), causal, 1.0 / std::sqrt(double(D)), opt.attn_mask, lengths, var);
    Tensor out({B, Hq, Tq, Dv}), lse({B, Hq, Tq});
    for (cpu::Isa isa : cpu::usable_isas()) {
      SCOPED_TRACE(cpu::isa_name(isa));
      detail::scaled_dot_product_attention_on(isa, qv, kv, v.view(), out.view(), opt, lse.view());
      EXPECT_LE(rel_l2(out.data(), want.out), 1e-5);
      for (int64_t r = 0; r < lse.numel(); ++r)
        if (want.lse[r] == -INFINITY) ASSERT_EQ(lse.data()[r], -INFINITY);
        else ASSERT_NEAR(lse.data()[r], want.lse[r], 1e-5 * std::max(1.0, std::fabs(want.lse[r])));
    }
  }
}

TEST(Attention, FullyMaskedRowsGiveZeroAndMinusInfinity) {
  auto gen = test_rng();
  const int64_t B = 3, H = 2, Tq = 6, Tk = 4, D = 8;
  const Tensor q = random_tensor(gen, {B, H, Tq, D}), k = random_tensor(gen, {B, H, Tk, D});
  const Tensor v = random_tensor(gen, {B, H, Tk, D});
  Tensor mask({Tq, Tk});
  for (int64_t j = 0; j < Tk; ++j) mask.data()[5 * Tk + j] = -INFINITY;  // row 5: every key masked
  const std::vector<int64_t> lengths = {Tk, 0, 2};                      // batch 1: no keys at all
  AttentionOptions opt;
  opt.causal = true;  // Tq > Tk: rows 0 and 1 see no key
  opt.attn_mask = mask.view();
  opt.kv_lengths = lengths;
  const AttentionResult r = scaled_dot_product_attention(q.view(), k.view(), v.view(), opt);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        const bool empty = b == 1 || i < 2 || i == 5;
        const float l = r.lse.data()[(b * H + h) * Tq + i];
        EXPECT_EQ(empty, l == -INFINITY) << b << "," << h << "," << i;
        for (int64_t d = 0; d < D; ++d) {
          const float o = r.out.data()[((b * H + h) * Tq + i) * D + d];
          EXPECT_FALSE(std::isnan(o));
          if (empty) EXPECT_EQ(o, 0.0f);
        }
      }
  const Tensor probs = attention_probabilities(q.view(), k.view(), r.lse.view(), opt);
  for (int64_t i = 0; i < probs.numel(); ++i) EXPECT_FALSE(std::isnan(probs.data()[i]));
}

// NaN in q makes that row NaN (out and lse); NaN in a key makes NaN exactly the rows that see it
// (causal: the later ones); no NaN row is reported as a masked one. Every kernel, on the split-K
// decode shape and on the blocked one.
TEST(Attention, NanPropagatesOnEveryKernel) {
  auto gen = test_rng();
  for (const auto& [Tq, Tk] : {std::pair<int64_t, int64_t>{4, 600}, {70, 300}}) {
    const int64_t H = 2, D = 40, row = Tq / 2, key = Tk - Tq + row;  // rows >= row see key
    Tensor q = random_tensor(gen, {1, H, Tq, D}), k = random_tensor(gen, {1, H, Tk, D});
    const Tensor v = random_tensor(gen, {1, H, Tk, D});
    q.data()[(1 * Tq + row) * D + 3] = NAN;  // head 1, row `row`
    k.data()[(0 * Tk + key) * D + 5] = NAN;  // head 0, key `key`
    AttentionOptions opt;
    opt.causal = true;
    for (const auto& isa : kernels_here()) {
      SCOPED_TRACE(kernel_name(isa) + " Tq=" + std::to_string(Tq));
      AttentionResult r{Tensor({1, H, Tq, D}), Tensor({1, H, Tq})};
      detail::scaled_dot_product_attention_on(isa, q.view(), k.view(), v.view(), r.out.view(), opt, r.lse.view());
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Tq; ++i) {
          const bool nan = h == 1 ? i == row : i >= row;
          EXPECT_EQ(std::isnan(r.lse.data()[h * Tq + i]), nan) << h << "," << i;
          for (int64_t d = 0; d < D; ++d) ASSERT_EQ(std::isnan(r.out.data()[(h * Tq + i) * D + d]), nan) << h << "," << i;
        }
    }
  }
}

TEST(Attention, ProbabilitiesForChosenHeadsMatchTheOracle) {
  auto gen = test_rng();
  const int64_t B = 2, Hq = 6, Hkv = 3, Tq = 11, Tk = 19, D = 40;
  const Tensor q = random_tensor(gen, {B, Hq, Tq, D}), k = random_tensor(gen, {B, Hkv, Tk, D});
  const Tensor v = random_tensor(gen, {B, Hkv, Tk, D});
  AttentionOptions opt;
  opt.causal = true;
  const std::vector<int64_t> heads = {5, 0, 3};
  // Without lse (computed inside) and with the forward's lse: the same matrix.
  const Tensor own = attention_probabilities(q.view(), k.view(), ConstTensorView{}, opt, heads);
  const AttentionResult r = scaled_dot_product_attention(q.view(), k.view(), v.view(), opt);
  const Tensor given = attention_probabilities(q.view(), k.view(), r.lse.view(), opt, heads);
  const Oracle want = naive_attention(q.view(), k.view(), v.view(), true, 1.0 / std::sqrt(double(D)), {}, {});
  for (int64_t b = 0; b < B; ++b)
    for (size_t s = 0; s < heads.size(); ++s)
      for (int64_t i = 0; i < Tq; ++i) {
        double row_sum = 0.0;
        for (int64_t j = 0; j < Tk; ++j) {
          const int64_t at = ((b * 3 + static_cast<int64_t>(s)) * Tq + i) * Tk + j;
          const double p = want.probs[static_cast<size_t>(((b * Hq + heads[s]) * Tq + i) * Tk + j)];
          EXPECT_NEAR(own.data()[at], p, 1e-6);
          EXPECT_NEAR(given.data()[at], p, 1e-6);
          row_sum += given.data()[at];
        }
        EXPECT_NEAR(row_sum, 1.0, 1e-5);
      }
}

TEST(Attention, KeysSharedAcrossBatchThroughZeroStride) {
  auto gen = test_rng();
  const int64_t B = 3, H = 2, T = 9, D = 16;
  const Tensor q = random_tensor(gen, {B, H, T, D});
  const Tensor k1 = random_tensor(gen, {1, H, T, D}), v1 = random_tensor(gen, {1, H, T, D});
  const ConstTensorView k(k1.data(), {B, H, T, D}, {0, T * D, D, 1});
  const ConstTensorView v(v1.data(), {B, H, T, D}, {0, T * D, D, 1});
  Tensor k_full({B, H, T, D}), v_full({B, H, T, D});
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(k_full.data() + b * H * T * D, k1.data(), sizeof(float) * H * T * D);
    std::memcpy(v_full.data() + b * H * T * D, v1.data(), sizeof(float) * H * T * D);
  }
  const AttentionResult a = scaled_dot_product_attention(q.view(), k, v);
  const AttentionResult b = scaled_dot_product_attention(q.view(), k_full.view(), v_full.view());
  EXPECT_EQ(0, std::memcmp(a.out.data(), b.out.data(), sizeof(float) * a.out.numel()));
}

TEST(Attention, BitwiseIdenticalForAnyThreadCount) {
  auto gen = test_rng();
  // A blocked case (many query rows) and a split-K decode case (one query, many keys).
  for (const auto& [Tq, Tk] : {std::pair<int64_t, int64_t>{203, 203}, {1, 2500}}) {
    const Tensor q = random_tensor(gen, {2, 6, Tq, 40}), k = random_tensor(gen, {2, 3, Tk, 40});
    const Tensor v = random_tensor(gen, {2, 3, Tk, 40});
    for (const Variant& var : {Variant{}, Variant{90, -1, false, 6.0f}}) {
      for (const auto& isa : kernels_here()) {
        AttentionOptions opt;
        opt.causal = true;
        var.apply(opt);
        std::vector<AttentionResult> runs;
        for (int threads : {1, 2, 3}) {
          omp_set_num_threads(threads);
          AttentionResult r{Tensor({2, 6, Tq, 40}), Tensor({2, 6, Tq})};
          detail::scaled_dot_product_attention_on(isa, q.view(), k.view(), v.view(), r.out.view(), opt, r.lse.view());
          runs.push_back(std::move(r));
        }
        omp_set_num_threads(omp_get_num_procs());
        for (size_t i = 1; i < runs.size(); ++i) {
          EXPECT_EQ(0, std::memcmp(runs[0].out.data(), runs[i].out.data(), sizeof(float) * runs[0].out.numel()))
              << kernel_name(isa) << " Tq=" << Tq;
          EXPECT_EQ(0, std::memcmp(runs[0].lse.data(), runs[i].lse.data(), sizeof(float) * runs[0].lse.numel()))
              << kernel_name(isa) << " Tq=" << Tq;
        }
      }
    }
  }
}

TEST(Attention, EmptyTensorsAreFine) {
  const Tensor q({0, 2, 3, 4}), k({0, 2, 5, 4}), v({0, 2, 5, 4});
  const AttentionResult r = scaled_dot_product_attention(q.view(), k.view(), v.view());
  EXPECT_EQ(r.out.numel(), 0);
  const Tensor q1({1, 1, 2, 4}), k0({1, 1, 0, 4}), v0({1, 1, 0, 4});  // no keys: every row masked
  const AttentionResult e = scaled_dot_product_attention(q1.view(), k0.view(), v0.view());
  EXPECT_EQ(e.out.data()[0], 0.0f);
  EXPECT_EQ(e.lse.data()[1], -INFINITY);
}

TEST(Attention, FlopCountFollowsDesign) {
  EXPECT_DOUBLE_EQ(attention_flops(1, 12, 4096, 4096, 64, 64, false), 4.0 * 12 * 4096 * 4096 * 64);
  EXPECT_DOUBLE_EQ(attention_flops(1, 12, 4096, 4096, 64, 64, true), 2.0 * 12 * 4096 * 4096 * 64);
  EXPECT_DOUBLE_EQ(attention_flops(1, 1, 1, 100, 64, 64, true), 4.0 * 100 * 64);  // decode: not halved
  // Counted over the visible pairs: causal T·(T + 1)/2; a causal window of W = left + 1 keys
  // W·T − W·(W − 1)/2; top-left causal with Tq > Tk: the rows past Tk see all Tk keys.
  AttentionOptions opt;
  opt.causal = true;
  EXPECT_DOUBLE_EQ(attention_flops(2, 3, 100, 100, 8, 8, opt), 2.0 * 16 * 2 * 3 * (100.0 * 101 / 2));
  opt.window.left = 9;
  EXPECT_DOUBLE_EQ(attention_flops(2, 3, 100, 100, 8, 8, opt), 2.0 * 16 * 2 * 3 * (10.0 * 100 - 10 * 9 / 2));
  opt.window.left = -1;
  opt.causal_alignment = CausalAlignment::top_left;
  EXPECT_DOUBLE_EQ(attention_flops(1, 1, 7, 4, 8, 8, opt), 2.0 * 16 * (1 + 2 + 3 + 4 * 4));
}

// The new options' errors name the option, what it takes and what it got.
TEST(Attention, RejectsBadVariantOptions) {
  const Tensor q({1, 1, 3, 4}), k({1, 1, 5, 4}), v({1, 1, 5, 4});
  AttentionOptions opt;
  opt.window.left = -2;
  expect_error([&] { scaled_dot_product_attention(q.view(), k.view(), v.view(), opt); },
               {"scaled_dot_product_attention: window.left: expected a key count >= 0, or -1 for unlimited, got -2"});
  opt.window = {-1, -5};
  expect_error([&] { scaled_dot_product_attention(q.view(), k.view(), v.view(), opt); }, {"window.right", "got -5"});
  opt.window = {};
  for (float bad : {0.0f, -1.0f, NAN, INFINITY}) {
    opt.softcap = bad;
    expect_error([&] { scaled_dot_product_attention(q.view(), k.view(), v.view(), opt); },
                 {"scaled_dot_product_attention: softcap: expected a finite number > 0"});
  }
}

}  // namespace
}  // namespace mhsa::test
