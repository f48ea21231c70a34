// tests/cpp/test_explain.cpp — the explainer's numbers (mhsa/explain.h): every head's
// probabilities from the model's fast path against attention_probabilities on the reference path,
// the step-by-step trace against the equations written out in float64, the per-head summaries on
// matrices whose answers are known, and the refusals. The report itself (HTML in a browser, JSON)
// is tested in tests/python/test_explain.py.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "mhsa/explain.h"
#include "mhsa/safetensors.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

namespace fs = std::filesystem;

constexpr int64_t V = 50, P = 32, C = 16, L = 3, H = 4, D = C / H, F = 4 * C;

// A GPT-2 checkpoint with weights large enough that heads attend sharply (Gpt2::random's GPT-2
// initialisation gives nearly even attention, which would make the comparisons weak).
class Checkpoint {
 public:
  explicit Checkpoint(std::mt19937_64& gen) : dir_(fs::temp_directory_path() / ("mhsa_explain_" + std::to_string(gen()))) {
    fs::create_directories(dir_);
    std::ofstream(dir_ / "config.json") << R"({"model_type": "gpt2", "vocab_size": 50, "n_positions": 32, "n_embd": 16,
      "n_layer": 3, "n_head": 4, "layer_norm_epsilon": 1e-5})";
    std::vector<std::pair<std::string, Tensor>> t;
    const auto add = [&](const std::string& name, std::vector<int64_t> dims, float stddev, float mean = 0.0f) {
      Tensor x = random_tensor(gen, std::move(dims), stddev);
      for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] += mean;
      t.emplace_back(name, std::move(x));
    };
    add("wte.weight", {V, C}, 1.0f);
    add("wpe.weight", {P, C}, 0.5f);
    add("ln_f.weight", {C}, 0.1f, 1.0f);
    add("ln_f.bias", {C}, 0.1f);
    for (int64_t l = 0; l < L; ++l) {
      const std::string h = "h." + std::to_string(l) + ".";
      add(h + "ln_1.weight", {C}, 0.1f, 1.0f);
      add(h + "ln_1.bias", {C}, 0.1f);
      add(h + "ln_2.weight", {C}, 0.1f, 1.0f);
      add(h + "ln_2.bias", {C}, 0.1f);
      add(h + "attn.c_attn.weight", {C, 3 * C}, 0.35f);
      add(h + "attn.c_attn.bias", {3 * C}, 0.1f);
      add(h + "attn.c_proj.weight", {C, C}, 0.25f);
      add(h + "attn.c_proj.bias", {C}, 0.1f);
      add(h + "mlp.c_fc.weight", {C, F}, 0.25f);
      add(h + "mlp.c_fc.bias", {F}, 0.1f);
      add(h + "mlp.c_proj.weight", {F, C}, 0.12f);
      add(h + "mlp.c_proj.bias", {C}, 0.1f);
    }
    std::vector<std::pair<std::string, ConstTensorView>> views;
    for (const auto& [name, tensor] : t) views.emplace_back(name, tensor.view());
    save_safetensors((dir_ / "model.safetensors").string(), views);
  }
  ~Checkpoint() { fs::remove_all(dir_); }
  Gpt2 load() const { return Gpt2::load(dir_); }

 private:
  fs::path dir_;
};

std::vector<int32_t> random_ids(std::mt19937_64& gen, int64_t T) {
  std::uniform_int_distribution<int32_t> id(0, V - 1);
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int32_t& i : ids) i = id(gen);
  return ids;
}

float max_abs_diff(const float* a, const float* b, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// y [T, N] = x [T, K] · w[:, col .. col + N) + b[col ..], with w [K, ld] — in float64.
std::vector<double> affine(const std::vector<double>& x, int64_t T, int64_t K, const Tensor& w, const Tensor& b,
                           int64_t col, int64_t N) {
  const int64_t ld = w.dim(1);
  std::vector<double> y(static_cast<size_t>(T * N));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t n = 0; n < N; ++n) {
      double s = b.data()[col + n];
      for (int64_t k = 0; k < K; ++k) s += x[i * K + k] * double(w.data()[k * ld + col + n]);
      y[i * N + n] = s;
    }
  return y;
}

std::vector<double> layer_norm(const std::vector<double>& x, int64_t T, const Tensor& g, const Tensor& b) {
  std::vector<double> y(x.size());
  for (int64_t i = 0; i < T; ++i) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += x[i * C + c] / C;
    for (int64_t c = 0; c < C; ++c) var += (x[i * C + c] - mean) * (x[i * C + c] - mean) / C;
    for (int64_t c = 0; c < C; ++c) y[i * C + c] = (x[i * C + c] - mean) / std::sqrt(var + 1e-5) * g.data()[c] + b.data()[c];
  }
  return y;
}

void expect_close(const Tensor& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got.data()[i], want[i], tol * (1.0 + std::abs(want[i]))) << what << "[" << i << "]";
}

TEST(Explain, ProbabilitiesEqualTheReferencePath) {
  auto gen = test_rng();
  const Checkpoint ckpt(gen);
  const Gpt2 m = ckpt.load();
  const int64_t T = 29;
  const std::vector<int32_t> ids = random_ids(gen, T);
  const Explanation e = explain(m, ids, 1, 2);
  ASSERT_EQ(e.attention.size(), static_cast<size_t>(L));
  double sharpest = 0;
  for (int64_t l = 0; l < L; ++l) {
    ASSERT_EQ(e.attention[l].shape(), (std::vector<int64_t>{1, H, T, T}));
    for (int64_t h = 0; h < H; ++h) {
      const HeadTrace t = trace_head(m, ids, l, h);
      AttentionOptions reference;
      reference.causal = true;
      reference.backend = Backend::reference;
      const Tensor want = attention_probabilities(ConstTensorView(t.q.data(), {1, 1, T, D}),
                                                  ConstTensorView(t.k.data(), {1, 1, T, D}), {}, reference);
      const float* got = e.attention[l].data() + h * T * T;
      EXPECT_LE(max_abs_diff(got, want.data(), T * T), 1e-6f) << "layer " << l << ", head " << h;
      EXPECT_EQ(max_abs_diff(t.probs.data(), want.data(), T * T), 0.0f);  // the trace's softmax is that one
      for (int64_t i = 0; i < T * T; ++i) sharpest = std::max(sharpest, double(got[i]) * (i / T > 4));
    }
  }
  EXPECT_GT(sharpest, 0.5);  // the checkpoint's heads do focus: the comparison is not of flat rows
}

TEST(Explain, TraceFollowsTheEquations) {
  auto gen = test_rng();
  const Checkpoint ckpt(gen);
  const Gpt2 m = ckpt.load();
  const int64_t T = 13, head = 3;
  const std::vector<int32_t> ids = random_ids(gen, T);
  const HeadTrace t0 = trace_head(m, ids, 0, head), t1 = trace_head(m, ids, 1, head);
  EXPECT_EQ(t1.layer, 1);
  EXPECT_EQ(t1.head, head);

  // Block 0 in float64 from the weights.
  std::vector<double> x(static_cast<size_t>(T * C));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_EQ(t0.token_embedding.data()[i * C + c], m.wte().data()[ids[i] * C + c]);
      EXPECT_EQ(t0.position_embedding.data()[i * C + c], m.wpe().data()[i * C + c]);
      x[i * C + c] = double(m.wte().data()[ids[i] * C + c]) + m.wpe().data()[i * C + c];
    }
  expect_close(t0.x, x, 1e-7, "x");
  const Gpt2Block& b = m.block(0);
  const std::vector<double> ln = layer_norm(x, T, b.ln1_g, b.ln1_b);
  expect_close(t0.ln, ln, 1e-5, "ln");
  const Tensor &w_qkv = b.attn.parameter("w_qkv"), &b_qkv = b.attn.parameter("b_qkv");
  const std::vector<double> q = affine(ln, T, C, w_qkv, b_qkv, head * D, D);
  const std::vector<double> k = affine(ln, T, C, w_qkv, b_qkv, C + head * D, D);
  const std::vector<double> v = affine(ln, T, C, w_qkv, b_qkv, 2 * C + head * D, D);
  expect_close(t0.q, q, 1e-5, "q");
  expect_close(t0.k, k, 1e-5, "k");
  expect_close(t0.v, v, 1e-5, "v");
  std::vector<double> scores(static_cast<size_t>(T * T)), probs(static_cast<size_t>(T * T)), out_h(static_cast<size_t>(T * D));
  for (int64_t i = 0; i < T; ++i) {
    double top = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t j = 0; j < T; ++j) {
      for (int64_t d = 0; d < D; ++d) scores[i * T + j] += q[i * D + d] * k[j * D + d];
      if (j <= i) top = std::max(top, scores[i * T + j] / std::sqrt(double(D)));
    }
    for (int64_t j = 0; j <= i; ++j) sum += std::exp(scores[i * T + j] / std::sqrt(double(D)) - top);
    for (int64_t j = 0; j <= i; ++j) {
      probs[i * T + j] = std::exp(scores[i * T + j] / std::sqrt(double(D)) - top) / sum;
      EXPECT_NEAR(t0.scaled.data()[i * T + j], scores[i * T + j] / std::sqrt(double(D)), 1e-4);
      for (int64_t d = 0; d < D; ++d) out_h[i * D + d] += probs[i * T + j] * v[j * D + d];
    }
    for (int64_t j = i + 1; j < T; ++j) EXPECT_EQ(t0.scaled.data()[i * T + j], -std::numeric_limits<float>::infinity());
  }
  expect_close(t0.scores, scores, 1e-4, "scores");
  expect_close(t0.probs, probs, 1e-5, "probs");
  expect_close(t0.head_out, out_h, 1e-5, "head_out");
  for (int64_t i = 0; i < T; ++i)  // the head's slice of the concatenation is its output
    for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(t0.concat.data()[i * C + head * D + d], out_h[i * D + d], 1e-5);
  std::vector<double> concat(t0.concat.data(), t0.concat.data() + T * C);
  const std::vector<double> attn = affine(concat, T, C, b.attn.parameter("w_o"), b.attn.parameter("b_o"), 0, C);
  expect_close(t0.out, attn, 1e-5, "out");

  // Block 1's input is block 0's output: x + attn, then + MLP(ln_2(x + attn)).
  for (size_t i = 0; i < x.size(); ++i) x[i] += attn[i];
  std::vector<double> u = affine(layer_norm(x, T, b.ln2_g, b.ln2_b), T, C, b.fc_w, b.fc_b, 0, F);
  for (double& a : u) a = 0.5 * a * (1 + std::tanh(std::sqrt(2 / M_PI) * (a + 0.044715 * a * a * a)));
  const std::vector<double> mlp = affine(u, T, F, b.proj_w, b.proj_b, 0, C);
  for (size_t i = 0; i < x.size(); ++i) x[i] += mlp[i];
  expect_close(t1.x, x, 1e-5, "block 1's x");
}

TEST(Explain, SummariesOfKnownHeads) {
  const int64_t T = 6;
  Tensor self({T, T}), previous({T, T}), even({T, T});
  double even_entropy = 0, even_first = 0;
  for (int64_t i = 0; i < T; ++i) {
    self.data()[i * T + i] = 1;
    previous.data()[i * T + std::max<int64_t>(i - 1, 0)] = 1;
    for (int64_t j = 0; j <= i; ++j) even.data()[i * T + j] = 1.0f / float(i + 1);
    if (i > 0) {
      even_entropy += std::log(double(i + 1)) / (T - 1);
      even_first += 1.0 / double(i + 1) / (T - 1);
    }
  }
  const HeadSummary s = summarize_head(self.view()), p = summarize_head(previous.view()), u = summarize_head(even.view());
  EXPECT_EQ(s.entropy, 0);
  EXPECT_EQ(s.self, 1);
  EXPECT_EQ(s.first_token, 0);
  EXPECT_EQ(s.previous_token, 0);
  EXPECT_EQ(p.previous_token, 1);
  EXPECT_EQ(p.self, 0);
  EXPECT_NEAR(p.first_token, 1.0 / (T - 1), 1e-12);  // row 1's previous token is the first
  EXPECT_NEAR(u.entropy, even_entropy, 1e-6);
  EXPECT_NEAR(u.first_token, even_first, 1e-6);
  const float one = 1;  // a one-token prompt: row 0 is all there is
  const HeadSummary single = summarize_head(ConstTensorView(&one, {1, 1}));
  EXPECT_EQ(single.self, 1);
  EXPECT_EQ(single.first_token, 1);
  // A transposed view (any strides) reads the same matrix.
  Tensor tr({T, T});
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < T; ++j) tr.data()[j * T + i] = even.data()[i * T + j];
  EXPECT_NEAR(summarize_head(ConstTensorView(tr.data(), {T, T}, {1, T})).entropy, even_entropy, 1e-6);
  expect_error([&] { summarize_head(ConstTensorView(tr.data(), {T, T - 1})); }, {"summarize_head: probs: expected a square"});
}

TEST(Explain, SummariesAreOfTheModelsProbabilities) {
  auto gen = test_rng();
  const Checkpoint ckpt(gen);
  const Gpt2 m = ckpt.load();
  const int64_t T = 17;
  const Explanation e = explain(m, random_ids(gen, T), 2, 0);
  ASSERT_EQ(e.summaries.size(), static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    ASSERT_EQ(e.summaries[l].size(), static_cast<size_t>(H));
    for (int64_t h = 0; h < H; ++h) {
      const HeadSummary want = summarize_head(ConstTensorView(e.attention[l].data() + h * T * T, {T, T}));
      EXPECT_EQ(e.summaries[l][h].entropy, want.entropy);
      EXPECT_EQ(e.summaries[l][h].previous_token, want.previous_token);
    }
  }
  EXPECT_EQ(e.trace.layer, 2);
  EXPECT_EQ(e.trace.probs.shape(), (std::vector<int64_t>{T, T}));
  EXPECT_EQ(e.trace.concat.shape(), (std::vector<int64_t>{T, C}));
}

TEST(Explain, BadRequestsAreClearErrors) {
  auto gen = test_rng();
  const Checkpoint ckpt(gen);
  const Gpt2 m = ckpt.load();
  const std::vector<int32_t> ids = random_ids(gen, 5);
  expect_error([&] { explain(m, {}, 0, 0); }, {"explain: ids: expected at least one token, got none"});
  expect_error([&] { explain(m, random_ids(gen, P + 1), 0, 0); },
               {"explain: ids: expected at most n_positions = 32 tokens (the model's context), got 33 tokens"});
  expect_error([&] { explain(m, ids, L, 0); }, {"explain: layer: expected a layer in [0, 3), got 3"});
  expect_error([&] { explain(m, ids, 0, -1); }, {"explain: head: expected a head in [0, 4), got -1"});
  expect_error([&] { trace_head(m, std::vector<int32_t>{1, V}, 0, 0); },
               {"trace_head: ids[1]: expected a token id in [0, 50), got 50"});
}

}  // namespace
}  // namespace mhsa::test
