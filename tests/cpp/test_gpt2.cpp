// tests/cpp/test_gpt2.cpp — the GPT-2 pieces against their float64 twins (LayerNorm, GELU, the
// Bᵀ stream), the cache against recomputation, the sampler's rules, and the loader's errors.
// Logits against Hugging Face transformers are in tests/python/test_gpt2.py.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "kernels/dispatch.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "mhsa/gpt2.h"
#include "mhsa/safetensors.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

namespace fs = std::filesystem;

std::vector<double> as_double(const float* p, int64_t n) { return std::vector<double>(p, p + n); }

TEST(Gpt2Kernels, LayerNormMatchesFloat64) {
  auto gen = test_rng();
  for (cpu::Isa isa : cpu::usable_isas())
    for (int64_t C : {1, 40, 97, 768}) {
      const int64_t rows = 37, ld = C + 3;
      Tensor x = random_tensor(gen, {rows, ld}, 3.0f), g = random_tensor(gen, {C}), b = random_tensor(gen, {C});
      for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] += 5.0f;  // an offset: the mean must not cancel badly
      Tensor want({rows, C}), got({rows, C});
      kernels::layer_norm_ref(rows, C, x.data(), ld, g.data(), b.data(), 1e-5f, want.data(), C);
      kernels::kernels_for(isa).layer_norm(rows, C, x.data(), ld, g.data(), b.data(), 1e-5f, got.data(), C);
      EXPECT_LE(rel_l2(got.data(), as_double(want.data(), want.numel())), 1e-6) << cpu::isa_name(isa) << " C " << C;
    }
}

TEST(Gpt2Kernels, GeluMatchesFloat64) {
  auto gen = test_rng();
  for (cpu::Isa isa : cpu::usable_isas())
    for (int64_t n : {1, 15, 16, 17, 100003}) {
      Tensor x = random_tensor(gen, {n}, 4.0f);
      x.data()[0] = n > 1 ? -30.0f : 0.5f;  // a far tail
      Tensor want = x, got = x;
      kernels::gelu_tanh_ref(n, want.data());
      kernels::kernels_for(isa).gelu_tanh(n, got.data());
      double worst = 0;
      for (int64_t i = 0; i < n; ++i)  // absolute error relative to |x|: GELU(x) ~ x or ~ 0
        worst = std::max(worst, std::abs(double(got.data()[i]) - want.data()[i]) / std::max(1.0, std::abs(double(x.data()[i]))));
      EXPECT_LE(worst, 1e-6) << cpu::isa_name(isa) << " n " << n;
    }
}

// The training head: loss per row and (softmax − onehot)·scale, against float64, for widths around
// the vector and summation-chunk sizes and GPT-2's 50,257; ignored rows (target −1) come back zero;
// bitwise the same for 1, 2 and 3 threads.
TEST(Gpt2Kernels, SoftmaxCrossEntropyMatchesFloat64) {
  auto gen = test_rng();
  const int saved = omp_get_max_threads();
  for (cpu::Isa isa : cpu::usable_isas())
    for (int64_t V : {1, 15, 17, 513, 50257}) {
      const int64_t rows = 9, ld = V + 5;
      Tensor x = random_tensor(gen, {rows, ld}, 4.0f);
      x.data()[3 * ld + V / 2] = 60.0f;  // one dominant logit: lse far from the bulk
      std::vector<int32_t> targets(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) targets[static_cast<size_t>(r)] = static_cast<int32_t>((r * 7919) % V);
      targets[5] = -1;
      const float scale = 1.0f / 8.0f;
      Tensor want = x;
      std::vector<double> want_loss(static_cast<size_t>(rows));
      kernels::softmax_cross_entropy_ref(rows, V, want.data(), ld, targets.data(), scale, want_loss.data());
      std::vector<std::vector<float>> runs;
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        Tensor got = x;
        std::vector<double> loss(static_cast<size_t>(rows));
        kernels::kernels_for(isa).softmax_cross_entropy(rows, V, got.data(), ld, targets.data(), scale, loss.data());
        for (int64_t r = 0; r < rows; ++r) {
          EXPECT_NEAR(loss[static_cast<size_t>(r)], want_loss[static_cast<size_t>(r)], 2e-6 * (1 + want_loss[static_cast<size_t>(r)]))
              << cpu::isa_name(isa) << " V " << V << " row " << r;
          // Error against the scale of the terms, (‖softmax‖² + 1)·scale²: p_target − 1 cancels.
          double err = 0, norm = 1;
          for (int64_t v = 0; v < V; ++v) {
            const double d = double(got.data()[r * ld + v]) - want.data()[r * ld + v];
            const double p = want.data()[r * ld + v] / scale + (v == targets[static_cast<size_t>(r)]);
            err += d * d, norm += p * p;
          }
          if (r == 5) EXPECT_EQ(err, 0.0) << "an ignored row must be all zeros";
          else EXPECT_LE(std::sqrt(err / norm) / scale, 2e-6) << cpu::isa_name(isa) << " V " << V << " row " << r;
          for (int64_t v = V; v < ld; ++v) ASSERT_EQ(got.data()[r * ld + v], x.data()[r * ld + v]) << "padding";
        }
        runs.emplace_back(got.data(), got.data() + got.numel());
      }
      EXPECT_EQ(runs[0], runs[1]) << cpu::isa_name(isa) << " V " << V << ": 1 vs 2 threads";
      EXPECT_EQ(runs[0], runs[2]) << cpu::isa_name(isa) << " V " << V << ": 1 vs 3 threads";
    }
  omp_set_num_threads(saved);
}

// AdamW's update against float64 over several steps (moments carried), with and without decay,
// including zero gradients (v = 0: the eps guard) and lengths that are not whole vectors.
TEST(Gpt2Kernels, AdamWMatchesFloat64) {
  auto gen = test_rng();
  for (cpu::Isa isa : cpu::usable_isas())
    for (int64_t n : {1, 17, 100003})
      for (float decay : {0.0f, 1e-4f}) {
        Tensor w = random_tensor(gen, {n}), m({n}), v({n});
        Tensor w_ref = w, m_ref = m, v_ref = v;
        for (int step = 1; step <= 3; ++step) {
          Tensor g = random_tensor(gen, {n}, 0.01f);
          g.data()[0] = 0.0f;
          const float inv_c1 = 1.0f / (1.0f - std::pow(0.9f, float(step))), inv_c2 = 1.0f / (1.0f - std::pow(0.95f, float(step)));
          kernels::adamw_ref(n, w_ref.data(), g.data(), m_ref.data(), v_ref.data(), 1e-3f, decay, 0.9f, 0.95f, inv_c1,
                             inv_c2, 1e-8f);
          kernels::kernels_for(isa).adamw(n, w.data(), g.data(), m.data(), v.data(), 1e-3f, decay, 0.9f, 0.95f, inv_c1,
                                          inv_c2, 1e-8f);
        }
        for (int64_t i = 0; i < n; ++i)  // each update is ≤ lr in size: compare on that scale
          ASSERT_NEAR(w.data()[i], w_ref.data()[i], 1e-8 + 4e-7 * std::abs(w_ref.data()[i])) << cpu::isa_name(isa) << " i " << i;
        EXPECT_LE(rel_l2(m.data(), as_double(m_ref.data(), m_ref.numel())), 1e-6) << cpu::isa_name(isa) << " n " << n;
        EXPECT_LE(rel_l2(v.data(), as_double(v_ref.data(), v_ref.numel())), 1e-6) << cpu::isa_name(isa) << " n " << n;
      }
}

TEST(Gpt2Kernels, GeluBackwardMatchesFloat64) {
  auto gen = test_rng();
  for (cpu::Isa isa : cpu::usable_isas())
    for (int64_t n : {1, 17, 100003}) {
      Tensor z = random_tensor(gen, {n}, 4.0f), du = random_tensor(gen, {n});
      z.data()[0] = n > 1 ? -30.0f : 0.3f;
      Tensor want({n}), got({n});
      kernels::gelu_tanh_backward_ref(n, z.data(), du.data(), want.data());
      kernels::kernels_for(isa).gelu_tanh_backward(n, z.data(), du.data(), got.data());
      double worst = 0;
      for (int64_t i = 0; i < n; ++i)
        worst = std::max(worst, std::abs(double(got.data()[i]) - want.data()[i]) / std::max(1.0, std::abs(double(du.data()[i]))));
      EXPECT_LE(worst, 5e-6) << cpu::isa_name(isa) << " n " << n;  // a few float32 ulp of GELU' ≤ 1.13
    }
}

TEST(Gpt2Kernels, TransposedStreamMatchesFloat64) {
  auto gen = test_rng();
  for (cpu::Isa isa : cpu::usable_isas())
    for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 97, 40}, {3, 1025, 80}, {8, 200, 768}, {5, 1, 1}}) {
      const Tensor a = random_tensor(gen, {M, K}), b = random_tensor(gen, {N, K});
      Tensor bt({K, N}), want({M, N}), got({M, N});
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) bt.data()[k * N + n] = b.data()[n * K + k];
      kernels::gemm_ref(M, N, K, a.data(), K, bt.data(), N, nullptr, want.data(), N);
      kernels::kernels_for(isa).matmul_bt(M, N, K, a.data(), K, b.data(), K, got.data(), N);
      EXPECT_LE(rel_l2(got.data(), as_double(want.data(), want.numel())), 2e-6)
          << cpu::isa_name(isa) << " " << M << "x" << N << "x" << K;
    }
}

// Each row of A is its own chain whatever the row count (1 to 8 rows in one pass, more in several,
// bfloat16 B too): a batch of decoding sequences gets the bits each gets alone.
TEST(Gpt2Kernels, TransposedStreamRowsDoNotDependOnTheRowCount) {
  auto gen = test_rng();
  for (const int64_t K : {203, 1100}) {  // 1100: K in chunks of 512 and a partial vector
    const int64_t N = 37, M_max = 11;
    const Tensor a = random_tensor(gen, {M_max, K}), b = random_tensor(gen, {N, K});
    std::vector<uint16_t> b16(static_cast<size_t>(N * K));
    for (size_t i = 0; i < b16.size(); ++i) b16[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(b.data()[i]) >> 16);
    for (cpu::Isa isa : cpu::usable_isas()) {
      const kernels::KernelTable& k = kernels::kernels_for(isa);
      Tensor alone({M_max, N}), alone16({M_max, N});
      for (int64_t m = 0; m < M_max; ++m) {
        k.matmul_bt(1, N, K, a.data() + m * K, K, b.data(), K, alone.data() + m * N, N);
        k.matmul_bt_bf16(1, N, K, a.data() + m * K, K, b16.data(), K, alone16.data() + m * N, N);
      }
      for (int64_t M = 2; M <= M_max; ++M) {
        Tensor got({M, N}), got16({M, N});
        k.matmul_bt(M, N, K, a.data(), K, b.data(), K, got.data(), N);
        k.matmul_bt_bf16(M, N, K, a.data(), K, b16.data(), K, got16.data(), N);
        EXPECT_EQ(std::memcmp(got.data(), alone.data(), sizeof(float) * M * N), 0) << cpu::isa_name(isa) << " M " << M;
        EXPECT_EQ(std::memcmp(got16.data(), alone16.data(), sizeof(float) * M * N), 0)
            << cpu::isa_name(isa) << " bf16 M " << M;
      }
    }
  }
}

// Several matrices in one stream (q | k | v): strided B and C, parts that end inside a group of
// rows, large enough to be split across threads. Each part against float64, and bit for bit the
// separate matmul_bt calls whatever the thread count.
TEST(Gpt2Kernels, TransposedStreamOfSeveralMatricesIsEachOne) {
  auto gen = test_rng();
  const int saved = omp_get_max_threads();
  const int64_t K = 401, ldb = K + 2, Ns[] = {13, 5, 90}, ldc = 13 + 5 + 90 + 3;
  for (cpu::Isa isa : cpu::usable_isas())
    for (int64_t M : {1, 3, 6}) {
      const kernels::KernelTable& k = kernels::kernels_for(isa);
      const Tensor a = random_tensor(gen, {M, K + 1});
      std::vector<Tensor> bs;
      for (int64_t N : Ns) bs.push_back(random_tensor(gen, {N, ldb}));
      Tensor want({M, ldc});  // the separate calls, side by side
      int64_t col = 0;
      for (size_t p = 0; p < bs.size(); col += Ns[p++])
        k.matmul_bt(M, Ns[p], K, a.data(), K + 1, bs[p].data(), ldb, want.data() + col, ldc);
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        Tensor got({M, ldc});
        kernels::BtPart parts[3];
        col = 0;
        for (size_t p = 0; p < bs.size(); col += Ns[p++]) parts[p] = {bs[p].data(), ldb, Ns[p], got.data() + col, ldc};
        k.matmul_bt_parts(M, K, a.data(), K + 1, parts, 3);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t c = 0; c < col; ++c)
            ASSERT_EQ(got.data()[m * ldc + c], want.data()[m * ldc + c])
                << cpu::isa_name(isa) << " M " << M << " threads " << threads << " at " << m << ", " << c;
      }
      omp_set_num_threads(saved);
      col = 0;
      for (size_t p = 0; p < bs.size(); col += Ns[p++]) {  // each part against float64
        const int64_t N = Ns[p];
        Tensor bt({K, N}), ref({M, N}), part({M, N});
        for (int64_t n = 0; n < N; ++n)
          for (int64_t kk = 0; kk < K; ++kk) bt.data()[kk * N + n] = bs[p].data()[n * ldb + kk];
        Tensor a_packed({M, K});
        for (int64_t m = 0; m < M; ++m)
          for (int64_t kk = 0; kk < K; ++kk) a_packed.data()[m * K + kk] = a.data()[m * (K + 1) + kk];
        kernels::gemm_ref(M, N, K, a_packed.data(), K, bt.data(), N, nullptr, ref.data(), N);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) part.data()[m * N + n] = want.data()[m * ldc + col + n];
        EXPECT_LE(rel_l2(part.data(), as_double(ref.data(), ref.numel())), 2e-6) << cpu::isa_name(isa) << " part " << p;
      }
    }
}

Gpt2Config tiny_config() {
  Gpt2Config c;
  c.vocab_size = 61;
  c.n_positions = 40;
  c.n_embd = 48;
  c.n_layer = 2;
  c.n_head = 4;
  c.eos_token_id = 60;
  return c;
}

std::vector<int32_t> random_ids(std::mt19937_64& gen, int64_t n, int64_t V) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = static_cast<int32_t>(gen() % static_cast<uint64_t>(V));
  return ids;
}

TEST(Gpt2, CachedChunksEqualTheFullForward) {
  auto gen = test_rng();
  const Gpt2 m = Gpt2::random(tiny_config(), gen());
  const int64_t B = 2, T = 23, V = m.config().vocab_size;
  const std::vector<int32_t> ids = random_ids(gen, B * T, V);
  const Tensor full = m.forward(ids, B, T);
  for (int64_t chunk : {int64_t{1}, int64_t{5}, T}) {
    Gpt2Cache cache = m.new_cache(B, T);
    for (int64_t t0 = 0; t0 < T; t0 += chunk) {
      const int64_t n = std::min(chunk, T - t0);
      std::vector<int32_t> part;
      for (int64_t b = 0; b < B; ++b) part.insert(part.end(), ids.begin() + b * T + t0, ids.begin() + b * T + t0 + n);
      const Tensor all = m.extend(cache, part, B, n, false);
      ASSERT_EQ(cache.length(), t0 + n);
      std::vector<double> want;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = t0; t < t0 + n; ++t)
          for (int64_t v = 0; v < V; ++v) want.push_back(full.data()[(b * T + t) * V + v]);
      EXPECT_LE(rel_l2(all.data(), want), 4e-6) << "chunk " << chunk << " at " << t0;
    }
  }
}

TEST(Gpt2, ForwardCanReturnEveryLayersAttention) {
  auto gen = test_rng();
  const Gpt2 m = Gpt2::random(tiny_config(), gen());
  const int64_t B = 2, T = 9, H = 4, V = m.config().vocab_size;
  const std::vector<int32_t> ids = random_ids(gen, B * T, V);
  std::vector<Tensor> attention;
  const Tensor with = m.forward(ids, B, T, &attention), without = m.forward(ids, B, T);
  EXPECT_LE(rel_l2(with.data(), as_double(without.data(), without.numel())), 4e-6);
  ASSERT_EQ(attention.size(), 2u);
  for (const Tensor& p : attention) {
    ASSERT_EQ(p.shape(), (std::vector<int64_t>{B, H, T, T}));
    for (int64_t r = 0; r < B * H * T; ++r) {
      const int64_t i = r % T;
      double sum = 0;
      for (int64_t j = 0; j < T; ++j) {
        const float v = p.data()[r * T + j];
        if (j > i) EXPECT_EQ(v, 0.0f);  // the future is masked
        sum += v;
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
  }
}

TEST(Gpt2, LastOnlyLogitsAreTheLastRowOfAll) {
  auto gen = test_rng();
  const Gpt2 m = Gpt2::random(tiny_config(), gen());
  const int64_t B = 3, T = 11, V = m.config().vocab_size;
  const std::vector<int32_t> ids = random_ids(gen, B * T, V);
  Gpt2Cache c1 = m.new_cache(B, T), c2 = m.new_cache(B, T);
  const Tensor all = m.extend(c1, ids, B, T, false), last = m.extend(c2, ids, B, T, true);
  ASSERT_EQ(last.shape(), (std::vector<int64_t>{B, 1, V}));
  for (int64_t b = 0; b < B; ++b) {
    std::vector<double> want(all.data() + (b * T + T - 1) * V, all.data() + (b * T + T) * V);
    EXPECT_LE(rel_l2(last.data() + b * V, want), 1e-6);
  }
}

TEST(Gpt2, GreedyGenerationEqualsArgmaxOfRecomputation) {
  auto gen = test_rng();
  Gpt2Config c = tiny_config();
  c.eos_token_id = -1;  // run the full length
  const Gpt2 m = Gpt2::random(c, gen());
  const int64_t B = 2, T = 6, V = c.vocab_size;
  const std::vector<int32_t> prompt = random_ids(gen, B * T, V);
  GenerationOptions o;
  o.max_new_tokens = 12;
  int64_t calls = 0;
  const auto out = m.generate(prompt, B, T, o, [&](int64_t step, std::span<const int32_t> tokens) {
    EXPECT_EQ(step, calls++);
    EXPECT_EQ(static_cast<int64_t>(tokens.size()), B);
    return true;
  });
  EXPECT_EQ(calls, 12);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int32_t> seq(prompt.begin() + b * T, prompt.begin() + (b + 1) * T);
    ASSERT_EQ(out[static_cast<size_t>(b)].size(), 12u);
    for (int32_t got : out[static_cast<size_t>(b)]) {  // from scratch, no cache
      const int64_t n = static_cast<int64_t>(seq.size());
      const Tensor logits = m.forward(seq, 1, n);
      const float* row = logits.data() + (n - 1) * V;
      EXPECT_EQ(got, std::max_element(row, row + V) - row);
      seq.push_back(got);
    }
  }
}

TEST(Gpt2, GenerationStopsAtEosAndWhenAsked) {
  auto gen = test_rng();
  Gpt2Config c = tiny_config();
  const Gpt2 m = Gpt2::random(c, gen());
  const std::vector<int32_t> prompt = random_ids(gen, 4, c.vocab_size);
  GenerationOptions o;
  o.max_new_tokens = 30;
  o.temperature = 1.0f;
  o.seed = 7;
  const auto out = m.generate(prompt, 1, 4, o);
  const auto& row = out[0];
  for (size_t i = 0; i + 1 < row.size(); ++i) EXPECT_NE(row[i], c.eos_token_id);
  EXPECT_TRUE(row.size() == 30 || row.back() == c.eos_token_id);
  EXPECT_EQ(m.generate(prompt, 1, 4, o), out) << "a seed must reproduce its sample";
  // Asked to stop after 3 steps, it stops there (or earlier, where the seed's sample reaches EOS
  // first: 61 tokens, ~3% of seeds).
  int64_t all = 0, steps = 0;
  m.generate(prompt, 1, 4, o, [&](int64_t, std::span<const int32_t>) { return ++all > 0; });
  m.generate(prompt, 1, 4, o, [&](int64_t, std::span<const int32_t>) { return ++steps < 3; });
  EXPECT_GE(all, 1);
  EXPECT_EQ(steps, std::min<int64_t>(3, all));
}

TEST(Gpt2, ContextLimitIsAClearError) {
  const Gpt2 m = Gpt2::random(tiny_config(), 1);
  const std::vector<int32_t> prompt(30, 1);
  GenerationOptions o;
  o.max_new_tokens = 11;  // 30 + 11 > 40
  expect_error([&] { m.generate(prompt, 1, 30, o); }, {"Gpt2::generate: max_new_tokens: expected at most 10 (the context is 40 tokens and the prompt has 30), got 11"});
  Gpt2Cache cache = m.new_cache(1, 40);
  m.extend(cache, prompt, 1, 30, true);
  const std::vector<int32_t> more(11, 2);
  expect_error([&] { m.extend(cache, more, 1, 11, true); }, {"expected at most 10 more tokens"});
  EXPECT_EQ(cache.length(), 30);
  const std::vector<int32_t> bad = {1, 61};
  expect_error([&] { m.extend(cache, bad, 1, 2, true); }, {"Gpt2::extend: ids[0, 1]: expected a token id in [0, 61), got 61"});
  EXPECT_EQ(cache.length(), 30);
  expect_error([&] { m.new_cache(1, 41); }, {"Gpt2::new_cache: max_tokens: expected a count in [1, 40]"});
}

// Greedy sampling is std::max_element's index (the first of equal maxima; a NaN only when it is
// the first logit) on random vocabularies of every length around the vector width, with ties,
// signed zeros, infinities and NaNs planted at random places.
TEST(Gpt2Sampler, GreedyIsTheFirstLargest) {
  std::mt19937_64 gen = test_rng();
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  GenerationOptions greedy;
  uint64_t rng = 1;
  for (int trial = 0; trial < 1500; ++trial) {
    const size_t V = trial < 200 ? 1 + trial % 70 : 1 + gen() % 60000;
    std::vector<float> l(V);
    const int kind = static_cast<int>(gen() % 6);
    for (float& x : l) x = kind == 0 ? std::round(u(gen)) : u(gen);  // kind 0: many ties
    for (int k = static_cast<int>(gen() % 4); k > 0; --k) {
      const float special[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), 4.0f};
      l[gen() % V] = special[gen() % 6];
    }
    if (kind == 1) std::fill(l.begin(), l.end(), -std::numeric_limits<float>::infinity());
    if (kind == 2) l[0] = std::numeric_limits<float>::quiet_NaN();
    const int32_t expected = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    std::vector<float> copy = l;
    ASSERT_EQ(Gpt2::sample(copy, {}, greedy, rng), expected) << "V " << V << " kind " << kind << " trial " << trial;
  }
}

// The sampler: penalties, cuts, and a distribution that follows softmax(logits / temperature).
TEST(Gpt2Sampler, RulesAndDistribution) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, -1.0f, 2.5f};
  GenerationOptions greedy;
  uint64_t rng = 1;
  std::vector<float> l = logits;
  EXPECT_EQ(Gpt2::sample(l, {}, greedy, rng), 1);
  GenerationOptions pen;
  pen.repetition_penalty = 2.0f;  // 3 → 1.5: 2.5 wins
  l = logits;
  EXPECT_EQ(Gpt2::sample(l, std::vector<int32_t>{1, 1}, pen, rng), 4);
  EXPECT_FLOAT_EQ(l[1], 1.5f);
  // OpenAI's penalties count the generated tokens only (history after prompt_tokens): token 1
  // generated twice, 4 once, 2 only in the prompt.
  GenerationOptions openai;
  openai.presence_penalty = 0.25f;
  openai.frequency_penalty = 0.5f;
  openai.logit_bias = {{3, 10.0f}, {0, -100.0f}};
  l = logits;
  const std::vector<int32_t> history = {2, 2, 1, 4, 1};  // prompt {2, 2}, then 1, 4, 1
  EXPECT_EQ(Gpt2::sample(l, history, openai, rng, 2), 3);  // −1 + 10 = 9 wins
  EXPECT_FLOAT_EQ(l[0], 1.0f - 100.0f);
  EXPECT_FLOAT_EQ(l[1], 3.0f - 2 * 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(l[2], 2.0f);  // in the prompt only
  EXPECT_FLOAT_EQ(l[3], 9.0f);
  EXPECT_FLOAT_EQ(l[4], 2.5f - 0.5f - 0.25f);
  openai.logit_bias.clear();
  l = logits;  // with every token of history counted (prompt_tokens 0): 2 is penalised twice
  EXPECT_EQ(Gpt2::sample(l, history, openai, rng), 1);
  EXPECT_FLOAT_EQ(l[2], 2.0f - 2 * 0.5f - 0.25f);
  GenerationOptions top1;
  top1.temperature = 1.0f;
  top1.top_k = 1;
  GenerationOptions nucleus;
  nucleus.temperature = 1.0f;
  nucleus.top_p = 0.01f;
  for (int i = 0; i < 50; ++i) {
    l = logits;
    EXPECT_EQ(Gpt2::sample(l, {}, top1, rng), 1);
    l = logits;
    EXPECT_EQ(Gpt2::sample(l, {}, nucleus, rng), 1);
  }
  // Frequencies at temperature 0.7 against the softmax, with top_k = 3 (tokens 1, 4, 2 only).
  GenerationOptions s;
  s.temperature = 0.7f;
  s.top_k = 3;
  const int draws = 60000;
  std::map<int32_t, int> count;
  uint64_t state = test_seed();
  for (int i = 0; i < draws; ++i) {
    l = logits;
    ++count[Gpt2::sample(l, {}, s, state)];
  }
  double z = 0;
  for (int t : {1, 4, 2}) z += std::exp(logits[static_cast<size_t>(t)] / 0.7);
  for (int t : {1, 4, 2}) {
    const double p = std::exp(logits[static_cast<size_t>(t)] / 0.7) / z;
    const double sd = std::sqrt(draws * p * (1 - p));
    EXPECT_NEAR(count[t], draws * p, 5 * sd) << "token " << t;
  }
  EXPECT_EQ(count[0] + count[3], 0);
}

// The cuts against a plain sorted reference (every token ordered by logit, then id; top_k, then
// the smallest head whose softmax mass reaches top_p) on random logits with ties and NaNs, from 1
// to 50,257 tokens: every draw lies in the reference's set, and the likeliest token is drawn.
// (The sampler selects without sorting, in buckets of logit value: a wrong bucket boundary would
// let a token past the cut in, or keep one out.)
TEST(Gpt2Sampler, CutsAreThoseOfASortedReference) {
  auto gen = test_rng();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto pick = [&](auto list) { return list[std::uniform_int_distribution<size_t>(0, list.size() - 1)(gen)]; };
  for (int trial = 0; trial < 80; ++trial) {
    const size_t V = pick(std::vector<size_t>{1, 2, 7, 65, 300, 5000, 50257});
    const float scale = pick(std::vector<float>{0.05f, 1.0f, 6.0f});
    std::vector<float> logits(V);
    for (size_t i = 0; i < V; ++i) {
      const float u = std::uniform_real_distribution<float>(0, 1)(gen);
      logits[i] = i > 0 && u < 0.1f ? logits[i - 1 - std::uniform_int_distribution<size_t>(0, i - 1)(gen) % std::min<size_t>(i, 5)]
                                    : normal(gen) * scale;  // ties
      if (V > 1 && u > 0.99f) logits[i] = std::numeric_limits<float>::quiet_NaN();
    }
    GenerationOptions o;
    o.temperature = std::uniform_real_distribution<float>(0.2f, 2.0f)(gen);
    o.top_k = pick(std::vector<int64_t>{0, 1, 3, 40, static_cast<int64_t>(V) - 1, static_cast<int64_t>(V)});
    o.top_p = pick(std::vector<float>{1.0f, 0.3f, 0.9f, 0.999f});
    std::vector<int32_t> order;
    for (size_t i = 0; i < V; ++i)
      if (!std::isnan(logits[i])) order.push_back(static_cast<int32_t>(i));
    if (order.empty()) continue;
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    if (o.top_k > 0 && static_cast<size_t>(o.top_k) < order.size()) order.resize(static_cast<size_t>(o.top_k));
    std::vector<double> p;
    for (const int32_t t : order) p.push_back(std::exp((double(logits[t]) - logits[order[0]]) / o.temperature));
    const double total = std::accumulate(p.begin(), p.end(), 0.0);
    size_t keep = order.size();
    if (o.top_p < 1.0f) {
      double mass = 0;
      keep = 0;
      while (keep < order.size() && mass < o.top_p * total) mass += p[keep++];
      // A cut within float rounding of the mass could fall either way: leave such cases out.
      if (std::abs(mass - o.top_p * total) < 1e-4 * total || std::abs(mass - p[keep - 1] - o.top_p * total) < 1e-4 * total)
        continue;
    }
    const std::set<int32_t> allowed(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep));
    bool likeliest = false;
    for (int d = 0; d < 300; ++d) {
      std::vector<float> l = logits;
      uint64_t rng = test_seed() * 7919 + static_cast<uint64_t>(trial * 1000 + d);
      const int32_t t = Gpt2::sample(l, {}, o, rng);
      ASSERT_TRUE(allowed.count(t)) << "trial " << trial << ": V " << V << ", temperature " << o.temperature
                                    << ", top_k " << o.top_k << ", top_p " << o.top_p << ": drew " << t;
      likeliest |= t == order[0];
    }
    EXPECT_TRUE(likeliest || p[0] / std::accumulate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(keep), 0.0) < 0.05)
        << "trial " << trial;
  }
}

// Frequencies without a cut and with top_p over GPT-2's vocabulary: three tokens well above the
// rest, and the rest as one, each within 5 standard deviations of the softmax's share.
TEST(Gpt2Sampler, FrequenciesOverAWholeVocabulary) {
  auto gen = test_rng();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t V = 50257;
  std::vector<float> logits(V);
  for (float& l : logits) l = normal(gen);
  const int32_t top[3] = {40000, 7, 50256};
  logits[40000] = 11.0f;
  logits[7] = 10.5f;
  logits[50256] = 10.0f;
  for (const float top_p : {1.0f, 0.4f}) {
    GenerationOptions o;
    o.temperature = 1.0f;
    o.top_p = top_p;
    std::vector<double> p(V);
    for (size_t i = 0; i < V; ++i) p[i] = std::exp(double(logits[i]) - 11.0);
    double total = std::accumulate(p.begin(), p.end(), 0.0);
    if (top_p < 1.0f) total = p[40000] + p[7];  // 0.4 of the mass: the first two (~0.30 and ~0.18)
    ASSERT_TRUE(top_p == 1.0f || (p[40000] < 0.4 * std::accumulate(p.begin(), p.end(), 0.0) &&
                                  p[40000] + p[7] > 0.4 * std::accumulate(p.begin(), p.end(), 0.0)));
    const int draws = 20000;
    std::map<int32_t, int> count;
    uint64_t state = test_seed();
    for (int d = 0; d < draws; ++d) {
      std::vector<float> l = logits;
      ++count[Gpt2::sample(l, {}, o, state)];
    }
    int rest = draws;
    for (const int32_t t : top) {
      const double share = top_p < 1.0f && t == 50256 ? 0.0 : p[static_cast<size_t>(t)] / total;
      EXPECT_NEAR(count[t], draws * share, 5 * std::sqrt(draws * share * (1 - share)) + 1e-9) << "token " << t << ", top_p " << top_p;
      rest -= count[t];
    }
    const double share = top_p < 1.0f ? 0.0 : 1.0 - (p[40000] + p[7] + p[50256]) / total;
    EXPECT_NEAR(rest, draws * share, 5 * std::sqrt(draws * share * (1 - share)) + 1e-9) << "the rest, top_p " << top_p;
  }
}

// Logits past the ordinary: NaN never drawn, +inf logits share all, nothing but NaN and −inf gives
// greedy's answer, a temperature whose inverse overflows gives the largest, and the sampler's
// result does not depend on what it drew before (its scratch is kept per thread).
TEST(Gpt2Sampler, InfinitiesNaNsAndExtremes) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();
  GenerationOptions o;
  o.temperature = 1.0f;
  std::map<int32_t, int> count;
  for (uint64_t s = 0; s < 400; ++s) {
    std::vector<float> l = {kNaN, 1.0f, kInf, kNaN, 3.0f, kInf, -kInf};
    uint64_t rng = s;
    ++count[Gpt2::sample(l, {}, o, rng)];
  }
  EXPECT_EQ(count.size(), 2u);
  EXPECT_GT(count[2], 100);
  EXPECT_GT(count[5], 100);
  for (uint64_t s = 0; s < 200; ++s) {
    std::vector<float> l = {kNaN, 0.5f, kNaN, 0.25f};
    uint64_t rng = s;
    const int32_t t = Gpt2::sample(l, {}, o, rng);
    EXPECT_TRUE(t == 1 || t == 3) << t;
  }
  std::vector<float> none = {-kInf, kNaN, -kInf};
  uint64_t rng = 1;
  std::vector<float> copy = none;
  EXPECT_EQ(Gpt2::sample(none, {}, o, rng), Gpt2::sample(copy, {}, GenerationOptions{}, rng));
  GenerationOptions cold = o;
  cold.temperature = 1e-45f;  // 1/t is +inf in float
  for (uint64_t s = 0; s < 50; ++s) {
    std::vector<float> l = {0.5f, 2.0f, 1.0f, 2.0f - 1e-6f};
    rng = s;
    EXPECT_EQ(Gpt2::sample(l, {}, cold, rng), 1);
  }
  // Options the public sampler does not check (generate does): no crash, the likeliest.
  GenerationOptions odd = o;
  odd.temperature = kNaN;
  std::vector<float> l3 = {0.5f, 2.0f, 1.0f};
  rng = 1;
  EXPECT_EQ(Gpt2::sample(l3, {}, odd, rng), 1);
  odd = o;
  odd.top_p = 0.0f;
  l3 = {0.5f, 2.0f, 1.0f};
  EXPECT_EQ(Gpt2::sample(l3, {}, odd, rng), 1);
  odd.top_p = kNaN;  // (no cut)
  odd.top_k = -3;
  l3 = {0.5f, 2.0f, 1.0f};
  const int32_t any = Gpt2::sample(l3, {}, odd, rng);
  EXPECT_TRUE(any >= 0 && any < 3) << any;
  GenerationOptions narrow = o;
  narrow.top_p = 1e-30f;  // less than any token's share: the likeliest alone
  for (uint64_t s = 0; s < 50; ++s) {
    std::vector<float> l = {0.5f, 2.0f, 1.0f, 2.0f};
    rng = s;
    EXPECT_EQ(Gpt2::sample(l, {}, narrow, rng), 1);  // (ties: the lower id)
  }
  // Long, then short: the short vocabulary's draws are those of a fresh thread's.
  std::vector<int32_t> first, again;
  for (int round = 0; round < 2; ++round) {
    for (uint64_t s = 0; s < 20; ++s) {
      if (round == 1) {
        std::vector<float> big(50257, 0.0f);
        uint64_t r = s;
        (void)Gpt2::sample(big, {}, o, r);
      }
      std::vector<float> l = {0.1f, 0.7f, 0.3f, 0.2f, 0.9f};
      rng = s;
      (round == 0 ? first : again).push_back(Gpt2::sample(l, {}, o, rng));
    }
  }
  EXPECT_EQ(first, again);
}

TEST(Gpt2Train, GradientsAreBitwiseIdenticalForAnyThreadCount) {
  auto gen = test_rng();
  const Gpt2 m = Gpt2::random(tiny_config(), gen());
  const int64_t B = 2, T = 13, V = m.config().vocab_size;
  const std::vector<int32_t> ids = random_ids(gen, B * T, V), targets = random_ids(gen, B * T, V);
  std::vector<std::vector<Tensor>> runs;
  std::vector<double> losses;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    runs.push_back(m.zero_gradients());
    losses.push_back(m.loss_and_gradients(ids, targets, B, T, runs.back()));
  }
  omp_set_num_threads(omp_get_num_procs());
  const auto params = m.parameters();
  for (size_t r = 1; r < runs.size(); ++r) {
    EXPECT_EQ(losses[r], losses[0]);
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_EQ(0, std::memcmp(runs[r][i].data(), runs[0][i].data(), sizeof(float) * runs[0][i].numel()))
          << params[i].first << " with " << r + 1 << " threads";
  }
  // Gradients accumulate: a second call doubles them.
  std::vector<Tensor> twice = m.zero_gradients();
  m.loss_and_gradients(ids, targets, B, T, twice);
  m.loss_and_gradients(ids, targets, B, T, twice);
  EXPECT_LE(rel_l2(twice[0].data(), [&] {
              std::vector<double> d(as_double(runs[0][0].data(), runs[0][0].numel()));
              for (double& v : d) v *= 2;
              return d;
            }()),
            1e-6);
}

// ---- loading ---------------------------------------------------------------------------------

struct TinyDir {
  fs::path dir;
  explicit TinyDir(const std::string& name) : dir(fs::temp_directory_path() / (name + std::to_string(test_seed()))) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TinyDir() { fs::remove_all(dir); }
  void write(const std::string& file, const std::string& text) const { std::ofstream(dir / file) << text; }
};

const char* kTinyConfig = R"({"model_type": "gpt2", "vocab_size": 11, "n_positions": 8, "n_embd": 8, "n_layer": 1,
  "n_head": 2, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "n_inner": null})";

std::vector<std::pair<std::string, Tensor>> tiny_tensors(std::mt19937_64& gen, const std::string& prefix) {
  std::vector<std::pair<std::string, Tensor>> t;
  const auto add = [&](const std::string& n, std::vector<int64_t> dims) { t.emplace_back(prefix + n, random_tensor(gen, dims)); };
  add("wte.weight", {11, 8});
  add("wpe.weight", {8, 8});
  add("ln_f.weight", {8});
  add("ln_f.bias", {8});
  for (const char* ln : {"h.0.ln_1.", "h.0.ln_2."}) {
    add(std::string(ln) + "weight", {8});
    add(std::string(ln) + "bias", {8});
  }
  add("h.0.attn.c_attn.weight", {8, 24});
  add("h.0.attn.c_attn.bias", {24});
  add("h.0.attn.c_proj.weight", {8, 8});
  add("h.0.attn.c_proj.bias", {8});
  add("h.0.mlp.c_fc.weight", {8, 32});
  add("h.0.mlp.c_fc.bias", {32});
  add("h.0.mlp.c_proj.weight", {32, 8});
  add("h.0.mlp.c_proj.bias", {8});
  return t;
}

void save(const fs::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<std::pair<std::string, ConstTensorView>> views;
  for (const auto& [n, t] : tensors) views.emplace_back(n, t.view());
  save_safetensors(path.string(), views);
}

TEST(Gpt2Load, PrefixedAndBareNamesGiveTheSameModel) {
  auto gen = test_rng();
  TinyDir a("mhsa_gpt2_bare"), b("mhsa_gpt2_prefixed");
  auto bare = tiny_tensors(gen, "");
  bare.emplace_back("h.0.attn.bias", Tensor({1, 1, 8, 8}));  // a causal-mask buffer: ignored
  save(a.dir / "model.safetensors", bare);
  std::vector<std::pair<std::string, Tensor>> prefixed;
  for (const auto& [n, t] : bare) prefixed.emplace_back("transformer." + n, t);
  save(b.dir / "model.safetensors", prefixed);
  a.write("config.json", kTinyConfig);
  b.write("config.json", kTinyConfig);
  const std::vector<int32_t> ids = {3, 1, 4, 1, 5};
  const Tensor la = Gpt2::load(a.dir).forward(ids, 1, 5), lb = Gpt2::load(b.dir).forward(ids, 1, 5);
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), sizeof(float) * la.numel()));
}

TEST(Gpt2Load, BadDirectoriesGiveClearErrors) {
  auto gen = test_rng();
  TinyDir d("mhsa_gpt2_bad");
  expect_error([&] { Gpt2::load(d.dir / "nope"); }, {"Gpt2::load: dir: expected a model directory"});
  expect_error([&] { Gpt2::load(d.dir); }, {"config.json: expected a readable config.json, got no such file"});
  d.write("config.json", "{\"n_embd\": 8,");
  expect_error([&] { Gpt2::load(d.dir); }, {"config.json: expected a JSON object, got invalid JSON"});
  d.write("config.json", R"({"vocab_size": 11, "n_positions": 8, "n_embd": 8, "n_layer": 1})");
  expect_error([&] { Gpt2::load(d.dir); }, {"expected a key \"n_head\", got none"});
  d.write("config.json", R"({"vocab_size": 11, "n_positions": 8, "n_embd": 8, "n_layer": 1, "n_head": 3})");
  expect_error([&] { Gpt2::load(d.dir); }, {"config.n_head: expected a divisor of n_embd = 8, got 3"});
  d.write("config.json", R"({"vocab_size": 11, "n_positions": 8, "n_embd": 8, "n_layer": -1, "n_head": 2})");
  expect_error([&] { Gpt2::load(d.dir); }, {"n_layer: expected a positive integer, got -1"});
  d.write("config.json", R"({"vocab_size": 11, "n_positions": 8, "n_embd": 8, "n_layer": 1, "n_head": 2,
                             "activation_function": "relu"})");
  expect_error([&] { Gpt2::load(d.dir); }, {"activation_function: expected \"gelu_new\" (GELU, tanh approximation), got \"relu\""});
  d.write("config.json", kTinyConfig);
  expect_error([&] { Gpt2::load(d.dir); }, {"expected model.safetensors"});
  auto tensors = tiny_tensors(gen, "");
  auto missing = tensors;
  missing.erase(missing.begin() + 5);  // h.0.ln_1.bias
  save(d.dir / "model.safetensors", missing);
  expect_error([&] { Gpt2::load(d.dir); }, {"expected a tensor 'h.0.ln_1.bias', got none"});
  auto wrong = tensors;
  wrong[8].second = Tensor({8, 25});  // h.0.attn.c_attn.weight
  save(d.dir / "model.safetensors", wrong);
  expect_error([&] { Gpt2::load(d.dir); }, {"tensor 'h.0.attn.c_attn.weight': expected shape [8, 24], got [8, 25]"});
}

}  // namespace
}  // namespace mhsa::test
