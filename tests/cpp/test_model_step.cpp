// tests/cpp/test_model_step.cpp — Model::step (continuous batching: one forward over several
// sequences, each with its own cache and positions) against Model::extend of each sequence alone,
// for GPT-2 (learned positions, Conv1D weights), a grouped-query Llama (RoPE), Mistral (a sliding
// window shorter than the prompts) and Gemma 2 (soft-caps, sandwich norms), float32 and bfloat16
// weights, prompts of different lengths, prefill chunks mixed with decode tokens, sequences joining
// and leaving.
//
// Bitwise where the GEMM takes the same path for the step's total rows as for each sequence's own
// (every element of C is one fixed chain per path, so rows do not depend on M within a path; see
// kernels/gemm.cpp and kernels/matmul_bt.cpp): steps of at most 4 rows in all (the small-M
// streams), and steps whose every sequence runs at least 17 rows (the plain chains) with at most 64
// sequences (the LM head's stream). Steps that mix a prompt chunk with decode tokens cross paths:
// there the logits agree to float32 rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "mhsa/error.h"
#include "mhsa/evaluate.h"
#include "mhsa/model.h"
#include "model/access.h"
#include "nn/blocked_matrix.h"
#include "nn/ops.h"
#include "nn/profile.h"
#include "kernels/dispatch.h"
#include "test_util.h"

namespace mhsa {
namespace {

using json = nlohmann::json;

std::vector<std::pair<std::string, json>> configs() {
  const json llama = {{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 263},
                      {"hidden_size", 48}, {"intermediate_size", 83}, {"num_hidden_layers", 2},
                      {"num_attention_heads", 6}, {"num_key_value_heads", 2}, {"max_position_embeddings", 160}};
  json mistral = llama;
  mistral["model_type"] = "mistral";
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["sliding_window"] = 7;
  json gemma = llama;
  gemma["model_type"] = "gemma2";
  gemma["architectures"] = {"Gemma2ForCausalLM"};
  gemma["head_dim"] = 8;
  gemma["sliding_window"] = 6;
  const json gpt2 = {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", 301},
                     {"n_embd", 48},         {"n_layer", 2},                         {"n_head", 4},
                     {"n_positions", 160}};
  return {{"gpt2", gpt2}, {"llama", llama}, {"mistral", mistral}, {"gemma2", gemma}};
}

// Two copies of each sequence's state: `batched` advanced by Model::step, `alone` by extend.
struct Sequences {
  const Model& model;
  std::mt19937_64& gen;
  std::vector<ModelCache> batched, alone;

  void add(int64_t capacity) {
    batched.push_back(model.new_cache(1, capacity));
    alone.push_back(model.new_cache(1, capacity));
  }
  std::vector<int32_t> ids(int64_t n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& t : v) t = std::uniform_int_distribution<int32_t>(0, model.config().vocab_size - 1)(gen);
    return v;
  }
  // One step of sequences `which` with n[i] new tokens each; the largest difference of their logits
  // from extend's alone, relative to the largest logit.
  double step(const std::vector<size_t>& which, const std::vector<int64_t>& n) {
    std::vector<std::vector<int32_t>> tokens;
    for (int64_t k : n) tokens.push_back(ids(k));
    std::vector<SequenceStep> steps;
    for (size_t i = 0; i < which.size(); ++i) steps.push_back({&batched[which[i]], tokens[i]});
    const Tensor got = model.step(steps);
    const int64_t V = model.config().vocab_size;
    EXPECT_EQ(got.shape(), (std::vector<int64_t>{static_cast<int64_t>(which.size()), 1, V}));
    double diff = 0, top = 0;
    for (size_t i = 0; i < which.size(); ++i) {
      const Tensor want = model.extend(alone[which[i]], tokens[i], 1, n[i], true);
      for (int64_t v = 0; v < V; ++v) {
        const float a = got.data()[static_cast<int64_t>(i) * V + v], b = want.data()[v];
        if (!(a == b)) diff = std::max(diff, std::isnan(a) ? INFINITY : std::fabs(static_cast<double>(a) - b));
        top = std::max(top, std::fabs(static_cast<double>(b)));
      }
      EXPECT_EQ(batched[which[i]].length(), alone[which[i]].length());
    }
    return diff / std::max(top, 1e-30);
  }
};

void run_family(const std::string& name, const json& config, WeightType dtype) {
  SCOPED_TRACE(name + (dtype == WeightType::bf16 ? " bf16" : " f32"));
  auto gen = test::test_rng();
  const Model model = Model::random(ModelConfig::parse(config.dump()), gen(), dtype);
  Sequences s{model, gen, {}, {}};
  std::uniform_int_distribution<int64_t> len(1, 9);
  // Four prompts of different lengths, prefilled together: chunks of at least 17 rows each.
  for (int i = 0; i < 4; ++i) s.add(150);
  EXPECT_EQ(s.step({0, 1, 2, 3}, {17 + len(gen), 17 + len(gen), 30 + len(gen), 17}), 0.0);
  // Decode steps of at most 4 rows: four sequences, or a 2-token chunk beside two decodes.
  for (int k = 0; k < 3; ++k) EXPECT_EQ(s.step({0, 1, 2, 3}, {1, 1, 1, 1}), 0.0);
  EXPECT_EQ(s.step({2, 0, 3}, {1, 2, 1}), 0.0);
  EXPECT_EQ(s.step({1}, {1}), 0.0);  // the others wait: a step of one
  // A sequence joins (its prompt runs beside the others' chunks) and one leaves.
  s.add(150);
  EXPECT_EQ(s.step({4, 3, 1, 0}, {20 + len(gen), 18, 17, 25}), 0.0);
  // Mixed: a new prompt chunk in the same forward as decode tokens (paths differ: rounding only).
  s.add(150);
  // bfloat16 weights on AVX512_BF16's dot product: a step of more than 8 rows rounds its
  // activations to bfloat16 (kernels::gemm_bt_bf16_dot), a decode token alone does not (seen up
  // to 5e-3 with Gemma 2's soft-caps); ctest's Bf16WithoutDotProduct covers the float32 rounding.
  const double tolerance = dtype == WeightType::bf16 && kernels::kernels().gemm_bt_bf16_dot ? 2e-2 : 1e-4;
  const double mixed = s.step({0, 5, 2, 4, 1}, {1, 12 + len(gen), 1, 1, 1});
  EXPECT_LT(mixed, tolerance);
  for (int k = 0; k < 3; ++k) EXPECT_LT(s.step({5, 4, 0, 3, 2, 1}, {1, 1, 1, 1, 1, 1}), tolerance);
}

TEST(ModelStep, EqualsExtendAloneForEveryFamily) {
  for (const auto& [name, config] : configs())
    for (WeightType dtype : {WeightType::f32, WeightType::bf16}) run_family(name, config, dtype);
}

// mhsa::hidden_states (the server's embeddings): a right-padded batch leaves each sequence's rows as
// they are alone (causal), and the logits are the states times the output matrix.
TEST(ModelStep, HiddenStatesArePaddingFreeAndGiveTheLogits) {
  for (const auto& [name, config] : configs()) {
    SCOPED_TRACE(name);
    auto gen = test::test_rng();
    const Model model = Model::random(ModelConfig::parse(config.dump()), gen());
    const int64_t C = model.config().hidden_size, V = model.config().vocab_size, T = 9, short_T = 4;
    std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(V - 1));
    std::vector<int32_t> ids(2 * T);
    for (int32_t& x : ids) x = id(gen);
    std::fill(ids.begin() + T + short_T, ids.end(), 0);  // the second sequence: 4 tokens, then padding
    const Tensor batch = hidden_states(model, ids, 2, T);  // [2, T, C]
    const Tensor alone = hidden_states(model, std::span(ids).subspan(T, short_T), 1, short_T);
    for (int64_t i = 0; i < short_T * C; ++i) EXPECT_NEAR(batch.data()[T * C + i], alone.data()[i], 1e-5) << i;
    if (name != "llama") continue;  // untied, no soft-cap: logits = h · lm_headᵀ
    const Tensor logits = model.forward(std::span(ids).first(T), 1, T);  // [1, T, V]
    const Tensor* head = model.parameter("lm_head.weight");             // [V, C]
    ASSERT_NE(head, nullptr);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t v = 0; v < V; ++v) {
        double dot = 0;
        for (int64_t c = 0; c < C; ++c) dot += double(batch.data()[t * C + c]) * head->data()[v * C + c];
        EXPECT_NEAR(logits.data()[t * V + v], dot, 1e-4) << t << ", " << v;
      }
  }
  EXPECT_THROW(hidden_states(Model::random(ModelConfig::parse(configs()[1].second.dump()), 1), std::vector<int32_t>{1, 999}, 1, 2),
               Error);
}

// nn/profile.h (mhsa bench --profile): with profiling on, a forward on this thread counts each
// phase once per layer (the embedding and the head once), times them, and changes no result;
// off, or on another thread, it counts nothing here.
TEST(ModelStep, ProfileCountsEveryPhaseOfAForward) {
  namespace profile = nn::profile;
  auto gen = test::test_rng();
  for (const auto& [name, config] : configs()) {
    SCOPED_TRACE(name);
    const Model model = Model::random(ModelConfig::parse(config.dump()), gen());
    const int64_t layers = model.config().num_layers;
    const std::vector<int32_t> ids = {3, 1, 4, 1, 5};
    const auto forward = [&] {
      ModelCache cache = model.new_cache(1, 16);
      (void)model.extend(cache, ids, 1, 5, true);
      const std::vector<int32_t> next = {2};
      return model.extend(cache, next, 1, 1, true);
    };
    const Tensor plain = forward();
    (void)profile::take();
    profile::set_enabled(true);
    const Tensor timed = forward();
    std::thread([&] { (void)forward(); }).join();  // another thread's totals are its own
    profile::set_enabled(false);
    const profile::Totals t = profile::take();
    EXPECT_EQ(std::memcmp(plain.data(), timed.data(), sizeof(float) * static_cast<size_t>(plain.numel())), 0);
    double sum = 0;
    for (int i = 0; i < profile::kPhases; ++i) {
      const auto p = static_cast<profile::Phase>(i);
      SCOPED_TRACE(profile::phase_name(p));
      const int64_t per_forward = !profile::per_layer(p) ? 1
                                  : p == profile::Phase::norm || p == profile::Phase::residual ? 2 * layers
                                                                                                : layers;
      EXPECT_GE(t.calls[static_cast<size_t>(i)], 2 * per_forward);  // two forwards (norm: pre and post slots)
      EXPECT_GE(t.seconds[static_cast<size_t>(i)], 0.0);
      sum += t.seconds[static_cast<size_t>(i)];
    }
    EXPECT_EQ(t.calls[static_cast<size_t>(profile::Phase::head)], 2);
    EXPECT_EQ(t.calls[static_cast<size_t>(profile::Phase::qkv)], 2 * layers);
    EXPECT_GT(sum, 0.0);
    (void)forward();  // off: nothing counted
    const profile::Totals off = profile::take();
    for (int i = 0; i < profile::kPhases; ++i) EXPECT_EQ(off.calls[static_cast<size_t>(i)], 0);
  }
}

// The CLI's inference models keep GPT-2's projections blocked and its output matrix transposed
// and blocked (ModelAccess::block_weights). The projections are kernels::gemm_blocked's chains,
// bitwise the loaded model's (Gemm.BlockedBIsBitwiseGemm); the head is gemm's chains on wᵀ
// (BlockedOutputMatrixIsGemmOnItsTranspose below), where the loaded model streams w: so every
// forward — a whole prompt (the packed path past 256 rows, in place below), decode steps of 1 to 8
// sequences, a chunk — gives the loaded model's logits to float rounding, and the same loss.
// Training the blocked model is refused. Other families, and 16-bit weights, are left as they are.
TEST(ModelStep, BlockedGpt2WeightsGiveTheSameResults) {
  auto gen = test::test_rng();
  json config = configs()[0].second;
  config["n_embd"] = 64;  // c_attn 64 -> 192, c_fc 64 -> 256: every projection blocks
  config["n_positions"] = 400;
  const uint64_t seed = gen();
  const Model plain = Model::random(ModelConfig::parse(config.dump()), seed);
  Model blocked = Model::random(ModelConfig::parse(config.dump()), seed);
  ASSERT_TRUE(ModelAccess::block_weights(blocked));
  EXPECT_TRUE(ModelAccess::blocked(blocked) && !ModelAccess::blocked(plain));
  // Relative L2 distance; the head's K = 64 terms summed in another order move a logit by a few
  // float32 roundings of the terms' size (2^-24 = 6e-8 each).
  const auto distance = [](const Tensor& a, const Tensor& b) {
    EXPECT_EQ(a.shape(), b.shape());
    double d = 0, n = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      d += (double(a.data()[i]) - b.data()[i]) * (double(a.data()[i]) - b.data()[i]);
      n += double(b.data()[i]) * b.data()[i];
    }
    return std::sqrt(d / n);
  };
  constexpr double kClose = 1e-6;
  Sequences s{plain, gen, {}, {}};
  const std::vector<int32_t> prompt = s.ids(300);
  EXPECT_LE(distance(blocked.forward(prompt, 1, 300), plain.forward(prompt, 1, 300)), kClose);
  EXPECT_LE(distance(blocked.forward(std::span(prompt).first(40), 2, 20), plain.forward(std::span(prompt).first(40), 2, 20)),
            kClose);
  std::vector<ModelCache> a, b;
  for (int i = 0; i < 8; ++i) a.push_back(plain.new_cache(1, 64)), b.push_back(blocked.new_cache(1, 64));
  for (int64_t n : {1, 2, 3, 5, 8}) {  // sequences per step: the stream, the fresh in-place path
    for (int round = 0; round < 2; ++round) {
      std::vector<std::vector<int32_t>> tokens;
      std::vector<SequenceStep> sa, sb;
      for (int64_t i = 0; i < n; ++i) tokens.push_back(s.ids(round == 0 && i == 0 ? 6 : 1));
      for (int64_t i = 0; i < n; ++i) sa.push_back({&a[static_cast<size_t>(i)], tokens[static_cast<size_t>(i)]});
      for (int64_t i = 0; i < n; ++i) sb.push_back({&b[static_cast<size_t>(i)], tokens[static_cast<size_t>(i)]});
      EXPECT_LE(distance(blocked.step(sb), plain.step(sa)), kClose) << n << " sequences";
    }
  }
  const std::span<const int32_t> ids(prompt.data(), 299), targets(prompt.data() + 1, 299);
  const double want = plain.loss(ids, targets, 1, 299);
  EXPECT_NEAR(blocked.loss(ids, targets, 1, 299), want, 1e-6 * want);
  EXPECT_THROW(blocked.zero_gradients(), Error);
  std::vector<Tensor> grads = plain.zero_gradients();
  EXPECT_THROW(blocked.loss_and_gradients(ids, targets, 1, 299, grads), Error);
  // An untied output matrix is blocked in its own right; the embedding stays as loaded.
  config["tie_word_embeddings"] = false;
  const Model plain_untied = Model::random(ModelConfig::parse(config.dump()), seed);
  Model untied = Model::random(ModelConfig::parse(config.dump()), seed);
  ASSERT_EQ(untied.parameters().size(), plain.parameters().size() + 1);
  ASSERT_TRUE(ModelAccess::block_weights(untied));
  EXPECT_LE(distance(untied.forward(prompt, 1, 300), plain_untied.forward(prompt, 1, 300)), kClose);
  EXPECT_LE(distance(untied.forward(std::span(prompt).first(3), 1, 3), plain_untied.forward(std::span(prompt).first(3), 1, 3)),
            kClose);
  Model llama = Model::random(ModelConfig::parse(configs()[1].second.dump()), seed);
  EXPECT_FALSE(ModelAccess::block_weights(llama));
  Model half = Model::random(ModelConfig::parse(config.dump()), seed, WeightType::bf16);
  EXPECT_FALSE(ModelAccess::block_weights(half));
}

// An output matrix kept transposed and blocked (nn/blocked_matrix.h): its rows read back exactly
// (the embedding), and the head's logits are kernels::gemm on wᵀ bit for bit, for every row count
// (the stream, fresh and plain classes; past 256 rows in chunks) and vocabularies that fill 32
// columns, do not, and fill none.
TEST(ModelStep, BlockedOutputMatrixIsGemmOnItsTranspose) {
  auto gen = test::test_rng();
  const kernels::KernelTable& k = kernels::kernels();
  for (int64_t V : {7, 64, 263})
    for (int64_t C : {16, 80}) {
      const Tensor w = test::random_tensor(gen, {V, C});
      const nn::BlockedMatrix b = nn::BlockedMatrix::of(w);
      std::vector<float> row(static_cast<size_t>(C));
      for (int64_t r = 0; r < V; ++r) {
        b.row(r, row.data());
        ASSERT_EQ(std::memcmp(row.data(), w.data() + r * C, sizeof(float) * C), 0) << "row " << r << " of " << V;
      }
      const std::vector<int32_t> ids = {0, static_cast<int32_t>(V - 1), static_cast<int32_t>(V / 2), 0};
      Tensor embedded({4, C});
      nn::embedding_forward(4, 4, 0, ids.data(), b, nullptr, 1.0f, embedded.data());
      for (int64_t r = 0; r < 4; ++r)
        EXPECT_EQ(std::memcmp(embedded.data() + r * C, w.data() + ids[static_cast<size_t>(r)] * C, sizeof(float) * C), 0);
      Tensor wt({C, V});
      for (int64_t v = 0; v < V; ++v)
        for (int64_t c = 0; c < C; ++c) wt.data()[c * V + v] = w.data()[v * C + c];
      for (int64_t M : {1, 3, 5, 8, 16, 17, 300}) {
        const int64_t ldh = C + 3;
        const Tensor h = test::random_tensor(gen, {M, ldh});
        Tensor got({M, V}), want({M, V});
        nn::lm_head_forward(M, h.data(), ldh, b, 0.0f, got.data());
        k.gemm(M, V, C, h.data(), ldh, wt.data(), V, nullptr, want.data(), V);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * M * V), 0) << "V " << V << " C " << C << " M " << M;
      }
    }
}

TEST(ModelStep, ChecksEverySequenceBeforeRunningAny) {
  auto gen = test::test_rng();
  const Model model = Model::random(ModelConfig::parse(configs()[1].second.dump()), gen());
  ModelCache a = model.new_cache(1, 8), b = model.new_cache(1, 4), pair = model.new_cache(2, 8);
  const std::vector<int32_t> three = {1, 2, 3}, five = {1, 2, 3, 4, 5}, bad = {1, 263};
  const auto refused = [&](std::vector<SequenceStep> steps, const std::string& what) {
    try {
      model.step(steps);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
    EXPECT_EQ(a.length(), 0);
    EXPECT_EQ(b.length(), 0);
  };
  refused({}, "seqs");
  refused({{&a, three}, {&b, five}}, "seqs[1].n");       // no room in b
  refused({{&a, three}, {&a, three}}, "seqs[1].cache");  // one cache twice
  refused({{&a, three}, {&pair, three}}, "seqs[1].cache");
  refused({{&a, three}, {nullptr, three}}, "seqs[1].cache");
  refused({{&a, three}, {&b, bad}}, "seqs[1].ids[0, 1]");
  refused({{&a, {}}}, "seqs[0].n");
  ModelCache foreign = Model::random(ModelConfig::parse(configs()[0].second.dump()), 1).new_cache(1, 8);
  refused({{&a, three}, {&foreign, three}}, "seqs[1].cache");
}

}  // namespace
}  // namespace mhsa
