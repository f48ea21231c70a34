// tests/cpp/test_speculative.cpp — speculative decoding (model/speculative.h).
//
// - The property greedy exactness rests on: a forward of up to exact_rows() tokens over a cache
//   gives each row's logits bit for bit as one-token steps do, for every family's layout (GPT-2's
//   float [in, out] weights, grouped-query heads of several group sizes, windows, soft-caps) and
//   every weight type, over a cache short and long (past one 512-key split-K slice).
// - Greedy generation with prompt lookup and with a draft model equals plain generation token for
//   token, and guesses are made and kept (a test that ran no speculation could not fail).
// - Sampling: the tokens of speculative generation follow the sampler's exact distribution,
//   computed by enumerating a tiny vocabulary, by a chi-square statistic with a bar exceeded by
//   chance about once in a million runs. A biased rule fails it: drawing the replacement without
//   leaving the guess out gave 670 and 863 against a bar of 164 (tried, 10,000 draws).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mhsa/error.h"
#include "mhsa/model.h"
#include "model/access.h"
#include "model/speculative.h"
#include "low_precision_models.h"

namespace mhsa {
namespace {

using json = nlohmann::json;

// Under AddressSanitizer (CI's second run) the sampling test checks the same paths for memory
// errors with fewer draws: it took 3 minutes there; the statistical power is the Release run's.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

json llama(int64_t heads, int64_t kv_heads, int64_t hidden = 256) {
  return {{"model_type", "llama"},      {"architectures", {"LlamaForCausalLM"}},
          {"vocab_size", 300},          {"hidden_size", hidden},
          {"intermediate_size", 512},   {"num_hidden_layers", 2},
          {"num_attention_heads", heads}, {"num_key_value_heads", kv_heads},
          {"max_position_embeddings", 1200}};
}

std::vector<std::pair<std::string, json>> configs() {
  json gemma = llama(4, 2);
  gemma["model_type"] = "gemma2";
  gemma["architectures"] = {"Gemma2ForCausalLM"};
  gemma["head_dim"] = 64;
  gemma["sliding_window"] = 37;
  const json gpt2 = {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", 300},
                     {"n_embd", 256},        {"n_layer", 2},                         {"n_head", 4},
                     {"n_positions", 1200}};
  return {{"llama group 2", llama(4, 2)}, {"llama group 4", llama(8, 2)}, {"llama group 8", llama(8, 1)},
          {"gemma2", gemma}, {"gpt2", gpt2}};
}

std::vector<int32_t> random_ids(size_t n, int64_t vocab, std::mt19937& gen) {
  std::vector<int32_t> v(n);
  for (int32_t& t : v) t = std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(vocab) - 1)(gen);
  return v;
}

TEST(Speculative, RowsOfOneForwardAreBitwiseOneTokenSteps) {
  std::mt19937 gen(11);
  for (const auto& [name, config] : configs())
    for (const WeightType dtype : {WeightType::f32, WeightType::bf16, WeightType::f16, WeightType::q8_0,
                                   WeightType::q4_k}) {
      const Model model = Model::random(ModelConfig::parse(config.dump()), gen(), dtype);
      const int64_t rows = detail::exact_rows(ModelAccess::stack(model));
      const int64_t group = model.config().num_heads / model.config().num_kv_heads;
      EXPECT_GE(rows, model.config().family == Family::gpt2 && dtype == WeightType::f32 ? 4 : std::min<int64_t>(8, 32 / group))
          << name;
      const int64_t V = model.config().vocab_size;
      for (const size_t prompt : {size_t{41}, size_t{530}}) {
        const std::vector<int32_t> ids = random_ids(prompt, V, gen), next = random_ids(static_cast<size_t>(rows), V, gen);
        ModelCache together = model.new_cache(1, 1100), alone = model.new_cache(1, 1100);
        model.extend(together, ids, 1, static_cast<int64_t>(prompt), true);
        model.extend(alone, ids, 1, static_cast<int64_t>(prompt), true);
        const Tensor all = model.extend(together, next, 1, rows, false);
        for (int64_t r = 0; r < rows; ++r) {
          const Tensor one = model.extend(alone, std::span(&next[static_cast<size_t>(r)], 1), 1, 1, true);
          ASSERT_EQ(std::memcmp(one.data(), all.data() + r * V, static_cast<size_t>(V) * sizeof(float)), 0)
              << name << " " << weight_type_name(dtype) << " prompt " << prompt << " row " << r << " of " << rows;
        }
      }
    }
}

// A prompt that repeats itself, so that prompt lookup has something to guess from.
std::vector<int32_t> repetitive_prompt(int64_t vocab, std::mt19937& gen) {
  const std::vector<int32_t> phrase = random_ids(23, vocab, gen);
  std::vector<int32_t> p;
  for (int i = 0; i < 4; ++i) p.insert(p.end(), phrase.begin(), phrase.end());
  return p;
}

TEST(Speculative, GreedyOutputIsPlainDecodingsTokenForToken) {
  std::mt19937 gen(12);
  for (const auto& [name, config] : configs())
    for (const WeightType dtype : {WeightType::f32, WeightType::bf16, WeightType::q8_0, WeightType::q4_k}) {
      // (Every layout in float32 and Q8_0, the 16- and 4-bit types on one: the rows test above
      // covers every pair bit for bit.)
      if ((dtype == WeightType::bf16 || dtype == WeightType::q4_k) && name != "llama group 2") continue;
      // Peaked logits (SavedModel scales the embedding): greedy choices are not near-ties.
      const test::SavedModel saved(config, gen());
      const Model model = Model::load(saved.dir, dtype);
      const Model draft = Model::random(ModelConfig::parse(config.dump()), gen(), dtype);
      const std::vector<int32_t> prompt = repetitive_prompt(model.config().vocab_size, gen);
      GenerationOptions o;
      o.max_new_tokens = 40;
      o.stop_at_eos = false;
      const auto plain = model.generate(prompt, 1, static_cast<int64_t>(prompt.size()), o);
      for (const bool with_model : {false, true}) {
        GenerationOptions s = o;
        s.speculation.draft_tokens = 7;
        s.speculation.adaptive = false;  // every step guesses (the adaptive count is checked below)
        if (with_model) s.speculation.draft_model = &draft;
        GenerationStats st;
        const auto fast = model.generate(prompt, 1, static_cast<int64_t>(prompt.size()), s, {}, &st);
        EXPECT_EQ(fast, plain) << name << " " << weight_type_name(dtype) << (with_model ? " draft model" : " lookup");
        EXPECT_GT(st.speculation.drafted, 0) << name;
        EXPECT_LE(st.speculation.accepted, st.speculation.drafted);
        EXPECT_EQ(st.decode_tokens, static_cast<int64_t>(fast[0].size()) - 1);
        if (!with_model) EXPECT_LT(st.speculation.forwards, st.decode_tokens) << name << ": no guess was kept";
      }
      GenerationOptions adaptive = o;  // however many guesses a step takes, the tokens are the same
      adaptive.speculation.draft_tokens = 7;
      EXPECT_EQ(model.generate(prompt, 1, static_cast<int64_t>(prompt.size()), adaptive), plain) << name;
      // The model as its own draft: every guess is its own greedy choice, so every one is kept.
      GenerationOptions self = o;
      self.speculation.draft_tokens = 5;
      self.speculation.adaptive = false;
      self.speculation.draft_model = &model;
      GenerationStats st;
      EXPECT_EQ(model.generate(prompt, 1, static_cast<int64_t>(prompt.size()), self, {}, &st), plain) << name;
      // (Not quite every one: the draft runs the last token in its own prefill, through other kernel
      // paths than the model's checking forward, so a near-tie may go the other way.)
      EXPECT_GE(st.speculation.accepted, st.speculation.drafted * 9 / 10) << name;
    }
}

TEST(Speculative, StopsAndLimitsHoldInsideAStep) {
  std::mt19937 gen(13);
  Model model = Model::random(ModelConfig::parse(llama(4, 2).dump()), gen());
  for (auto& [pname, t] : model.parameters())
    if (pname.find("embed_tokens") != std::string::npos)
      for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] *= 30.0f;
  const std::vector<int32_t> prompt = repetitive_prompt(300, gen);
  const int64_t T = static_cast<int64_t>(prompt.size());
  GenerationOptions o;
  o.max_new_tokens = 40;
  o.stop_at_eos = false;
  const auto plain = model.generate(prompt, 1, T, o)[0];
  GenerationOptions s = o;
  s.speculation.draft_tokens = 7;
  s.speculation.adaptive = false;
  for (int64_t n : {1, 2, 3, 9, 17}) {  // max_new_tokens falling inside a step's guesses
    s.max_new_tokens = n;
    const auto got = model.generate(prompt, 1, T, s)[0];
    EXPECT_EQ(got, std::vector<int32_t>(plain.begin(), plain.begin() + n)) << n;
  }
  s.max_new_tokens = 40;
  for (int64_t stop_at : {1, 5, 12}) {  // the callback stopping mid-step
    std::vector<int32_t> seen;
    const auto got = model.generate(prompt, 1, T, s, [&](int64_t step, std::span<const int32_t> t) {
      seen.push_back(t[0]);
      return step + 1 < stop_at;
    })[0];
    EXPECT_EQ(got, std::vector<int32_t>(plain.begin(), plain.begin() + stop_at)) << stop_at;
    EXPECT_EQ(seen, got);
  }
  // Up to the end of the context: a guess never writes past it.
  json small = llama(4, 2);
  small["max_position_embeddings"] = T + 13;
  const Model tight = Model::random(ModelConfig::parse(small.dump()), gen());
  GenerationOptions full = o;
  full.max_new_tokens = 13;
  GenerationOptions fs = full;
  fs.speculation.draft_tokens = 7;
  fs.speculation.adaptive = false;
  EXPECT_EQ(tight.generate(prompt, 1, T, fs), tight.generate(prompt, 1, T, full));
}

TEST(Speculative, RefusesWhatItCannotDo) {
  std::mt19937 gen(14);
  const Model model = Model::random(ModelConfig::parse(llama(4, 2).dump()), gen());
  json other = llama(4, 2);
  other["vocab_size"] = 301;
  const Model foreign = Model::random(ModelConfig::parse(other.dump()), gen());
  const std::vector<int32_t> ids = random_ids(10, 300, gen);
  GenerationOptions o;
  o.speculation.draft_tokens = 4;
  o.speculation.draft_model = &foreign;
  EXPECT_THROW(model.generate(ids, 1, 10, o), Error);
  o.speculation.draft_model = nullptr;
  EXPECT_THROW(model.generate(ids, 2, 5, o), Error);  // two prompts
  o.speculation.draft_tokens = 65;
  EXPECT_THROW(model.generate(ids, 1, 10, o), Error);
  o.speculation.draft_tokens = 4;
  o.speculation.ngram_min = 3;
  o.speculation.ngram_max = 2;
  EXPECT_THROW(model.generate(ids, 1, 10, o), Error);
}

// Wilson–Hilferty: the chi-square value with `df` degrees of freedom exceeded with probability
// about 1e-6 (z = 4.75).
double chi2_bar(double df) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + 4.75 * std::sqrt(a), 3.0);
}

std::vector<double> softmax(const float* x, int64_t V, float temperature) {
  std::vector<double> p(static_cast<size_t>(V));
  double m = -1e300, sum = 0;
  for (int64_t i = 0; i < V; ++i) m = std::max(m, double{x[i]} / temperature);
  for (int64_t i = 0; i < V; ++i) sum += p[static_cast<size_t>(i)] = std::exp(double{x[i]} / temperature - m);
  for (double& v : p) v /= sum;
  return p;
}

TEST(Speculative, SampledTokensFollowTheSamplersDistribution) {
  // A vocabulary of 10: the distribution of three sampled tokens is enumerable. Every token
  // appears in the prompt followed by others, so prompt lookup guesses two tokens after the first
  // whatever it is: the 2nd and 3rd tokens are decided by rows that check guesses.
  json c = llama(2, 1, 32);
  c["vocab_size"] = 10;
  c["intermediate_size"] = 64;
  c["num_hidden_layers"] = 1;
  const Model model = Model::random(ModelConfig::parse(c.dump()), 5);
  const Model draft = Model::random(ModelConfig::parse(c.dump()), 6);
  const std::vector<int32_t> prompt = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 5};
  const int64_t T = static_cast<int64_t>(prompt.size()), V = 10;
  constexpr float kTemperature = 0.1f;  // weights of std 0.02 give logits near 0: spread them
  // Exact: P(t1) P(t2 | t1) P(t3 | t1 t2).
  std::vector<double> joint12(V * V), marg3(V, 0.0);
  {
    const Tensor l1 = model.forward(prompt, 1, T);
    const std::vector<double> p1 = softmax(l1.data() + (T - 1) * V, V, kTemperature);
    for (int32_t a = 0; a < V; ++a) {
      std::vector<int32_t> s = prompt;
      s.push_back(a);
      const Tensor l2 = model.forward(s, 1, T + 1);
      const std::vector<double> p2 = softmax(l2.data() + T * V, V, kTemperature);
      for (int32_t b = 0; b < V; ++b) {
        joint12[static_cast<size_t>(a * V + b)] = p1[static_cast<size_t>(a)] * p2[static_cast<size_t>(b)];
        std::vector<int32_t> s3 = s;
        s3.push_back(b);
        const Tensor l3 = model.forward(s3, 1, T + 2);
        const std::vector<double> p3 = softmax(l3.data() + (T + 1) * V, V, kTemperature);
        for (int32_t t = 0; t < V; ++t) marg3[static_cast<size_t>(t)] += joint12[static_cast<size_t>(a * V + b)] * p3[static_cast<size_t>(t)];
      }
    }
  }
  constexpr int kDraws = kSanitized ? 1500 : 6000;
  for (const bool with_model : {false, true}) {
    std::vector<double> n12(V * V, 0.0), n3(V, 0.0);
    GenerationOptions o;
    o.max_new_tokens = 4;  // (the 1st token, then one forward checks two guesses; the 4th is not tested)
    o.temperature = kTemperature;
    o.stop_at_eos = false;
    o.speculation.draft_tokens = 2;
    o.speculation.adaptive = false;
    if (with_model) o.speculation.draft_model = &draft;
    int64_t drafted = 0, accepted = 0;
    for (int i = 0; i < kDraws; ++i) {
      o.seed = static_cast<uint64_t>(i);
      GenerationStats st;
      const auto out = model.generate(prompt, 1, T, o, {}, &st)[0];
      ASSERT_EQ(out.size(), 4u);
      n12[static_cast<size_t>(out[0] * V + out[1])] += 1;
      n3[static_cast<size_t>(out[2])] += 1;
      drafted += st.speculation.drafted;
      accepted += st.speculation.accepted;
    }
    // Guesses were checked, and some of each kind of outcome happened.
    EXPECT_GE(drafted, 19 * kDraws / 10);
    EXPECT_GT(accepted, drafted / 100);
    EXPECT_LT(accepted, drafted - drafted / 100);
    const auto chi2 = [&](const std::vector<double>& counts, const std::vector<double>& p) {
      double x = 0;
      int cells = 0;
      for (size_t i = 0; i < p.size(); ++i) {
        const double e = p[i] * kDraws;
        if (e < 5) continue;  // (pooled away: too few to test)
        x += (counts[i] - e) * (counts[i] - e) / e;
        ++cells;
      }
      return std::pair{x, cells - 1};
    };
    const auto [x12, df12] = chi2(n12, joint12);
    const auto [x3, df3] = chi2(n3, marg3);
    EXPECT_LT(x12, chi2_bar(df12)) << (with_model ? "draft model" : "lookup") << ": joint of tokens 1-2, df " << df12;
    EXPECT_LT(x3, chi2_bar(df3)) << (with_model ? "draft model" : "lookup") << ": token 3, df " << df3;
  }
}

}  // namespace
}  // namespace mhsa
