// tests/cpp/low_precision_models.h — shared by the bf16, f16, Q8_0 and Q4_K tests: a random model
// saved as a Hugging Face directory, the check that a low-precision model computes what the float
// model computes on the weights it actually holds (rounded or dequantised), and the operands of
// the kernels over quantised weights (random A, B quantised to Q8_0 or Q4_K blocks, A quantised
// as the decode streams quantise it, the error measure).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/dispatch.h"
#include "kernels/q4_k.h"
#include "kernels/q8_0.h"
#include "mhsa/error.h"
#include "mhsa/model.h"
#include "mhsa/safetensors.h"
#include "test_util.h"

namespace mhsa::test {

// A random model of `config` (embeddings scaled up for lively logits, so that greedy choices are
// not near-ties; `poison` set to NaN when named) saved as a Hugging Face directory, removed at the end.
struct SavedModel {
  std::filesystem::path dir;
  SavedModel(const nlohmann::json& config, uint64_t seed, const std::string& poison = "")
      : dir(std::filesystem::temp_directory_path() /
            ("mhsa_lowp_" + std::to_string(seed) + "_" + std::to_string(getpid()))) {
    std::filesystem::create_directories(dir);
    std::ofstream(dir / "config.json") << config.dump();
    Model m = Model::random(ModelConfig::parse(config.dump()), seed);
    std::vector<std::pair<std::string, ConstTensorView>> tensors;
    for (auto& [name, t] : m.parameters()) {
      if (name.find("wte") != std::string::npos || name.find("embed_tokens") != std::string::npos)
        for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] *= 30.0f;
      if (name == poison) t->data()[t->numel() / 2] = std::numeric_limits<float>::quiet_NaN();
      tensors.emplace_back(name, t->view());
    }
    save_safetensors((dir / "model.safetensors").string(), tensors);
  }
  ~SavedModel() { std::filesystem::remove_all(dir); }
};

inline double max_rel(const Tensor& got, const Tensor& want) {
  double scale = 0, worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::abs(double{want.data()[i]}));
  for (int64_t i = 0; i < want.numel(); ++i)
    worst = std::max(worst, std::abs(double{got.data()[i]} - want.data()[i]));
  return worst / scale;
}

// `low` (16- or 8-bit weights) against `reference` (float32 holding the same values): logits and
// losses on the streaming (≤ 8 rows; the LM head up to 64) and GEMM paths within `tolerance`
// (relative to the largest logit), and no gradients for `low`. At the default 1e-5 (bf16) the
// greedy tokens are the reference's; above it (Q8_0, whose decode streams quantise their
// activations too) each of low's greedy tokens has a reference logit within `tolerance` of the
// reference's best there (after the prompt and low's own tokens, so every step is checked).
inline void expect_same_as_float_model(const Model& low, const Model& reference, std::mt19937_64& gen,
                                       double tolerance = 1e-5) {
  const int64_t V = low.config().vocab_size;
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
  for (int64_t T : {1, 5, 13}) {
    std::vector<int32_t> ids(static_cast<size_t>(2 * T)), targets(ids.size());
    for (auto& i : ids) i = tok(gen);
    for (auto& i : targets) i = tok(gen);
    const Tensor a = low.forward(ids, 2, T), b = reference.forward(ids, 2, T);
    EXPECT_LE(max_rel(a, b), tolerance) << "T=" << T;
    const double la = low.loss(ids, targets, 2, T), lb = reference.loss(ids, targets, 2, T);
    EXPECT_NEAR(la, lb, tolerance * std::abs(lb)) << "T=" << T;
  }
  std::vector<int32_t> prompt(7);
  for (auto& i : prompt) i = tok(gen);
  GenerationOptions o;
  o.max_new_tokens = 12;
  o.stop_at_eos = false;
  const std::vector<int32_t> got = low.generate(prompt, 1, 7, o)[0];
  if (tolerance <= 1e-5) {
    EXPECT_EQ(got, reference.generate(prompt, 1, 7, o)[0]);
  } else {  // the reference's logits after the prompt and low's tokens: each token near its best
    ASSERT_EQ(got.size(), 12u);
    std::vector<int32_t> ids = prompt;
    ids.insert(ids.end(), got.begin(), got.end() - 1);
    const Tensor logits = reference.forward(ids, 1, static_cast<int64_t>(ids.size()));  // [1, T, V]
    double scale = 0;
    for (int64_t i = 0; i < logits.numel(); ++i) scale = std::max(scale, std::abs(double{logits.data()[i]}));
    for (size_t i = 0; i < got.size(); ++i) {
      const float* row = logits.data() + static_cast<int64_t>(prompt.size() + i - 1) * V;
      const float best = *std::max_element(row, row + V);
      EXPECT_LE(double{best} - row[got[i]], tolerance * scale) << "token " << i << ": far from the greedy choice";
    }
  }
  EXPECT_THROW(low.zero_gradients(), Error);
  std::vector<Tensor> grads;
  EXPECT_THROW(low.loss_and_gradients(prompt, prompt, 1, 7, grads), Error);
}

// A 16-bit model (dtype bf16 or f16) of a random `config` against the float32 model of the same
// file with its matrices passed through `round` (every matrix but learned positions is kept in 16
// bits; norms and biases stay float32, as float tensors in both). Where bfloat16 GEMMs run on
// AVX512_BF16's dot product (kernels::gemm_bt_bf16_dot), the rows past the streams' 8 are rounded
// to bfloat16 too: logits within 5e-4 of the largest (2^-9 a value; seen up to 9e-5 at 2 layers)
// and greedy tokens near the reference's best. ctest also runs these with MHSA_BF16_DOT=0 for
// the exact weights-only rounding.
template <class Round>
void check_16bit_family(const nlohmann::json& config, WeightType dtype, const Round& round) {
  auto gen = test_rng();
  const SavedModel saved(config, gen());
  const Model half = Model::load(saved.dir, dtype);
  Model rounded = Model::load(saved.dir);
  EXPECT_EQ(half.weight_type(), dtype);
  EXPECT_EQ(rounded.weight_type(), WeightType::f32);
  int64_t rounded_count = 0;
  for (auto& [name, t] : rounded.parameters()) {
    const Tensor* h = half.parameter(name);
    ASSERT_NE(h, nullptr) << name;
    if (t->shape().size() != 2 || name == "wpe.weight") {
      EXPECT_EQ(h->shape(), t->shape()) << name << " stays float32";
      continue;
    }
    EXPECT_FALSE(h->defined()) << name << " lives in 16-bit storage";
    for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = round(t->data()[i]);
    ++rounded_count;
  }
  EXPECT_GT(rounded_count, 2);
  const bool dot = dtype == WeightType::bf16 && kernels::kernels().gemm_bt_bf16_dot;
  expect_same_as_float_model(half, rounded, gen, dot ? 5e-4 : 1e-5);
}

// ---- kernels over quantised weights ---------------------------------------------------------

inline bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// The block formats of the operands below.
struct Q8Format {
  using Block = kernels::BlockQ8_0;
  static constexpr int64_t kWeights = kernels::kQ8Block;
  static void quantize(const float* x, int64_t n, Block* out) { kernels::quantize_row_q8_0(x, n, out); }
  static void dequantize(const Block* b, int64_t n, float* y) { kernels::dequantize_row_q8_0(b, n, y); }
};
struct Q4KFormat {  // blocks in the Q4_K kernels' order (kernels/q4_k.h), as nn::Q4Matrix keeps them
  using Block = kernels::BlockQ4_K;
  static constexpr int64_t kWeights = kernels::kQ4KBlock;
  static void quantize(const float* x, int64_t n, Block* out) {
    kernels::quantize_row_q4_k(x, n, out);
    kernels::interleave_q4_k(out, n / kWeights);
  }
  static void dequantize(const Block* b, int64_t n, float* y) { kernels::dequantize_row_q4_k_interleaved(b, n, y); }
};

template <class Format>
struct QuantOperands {
  int64_t M, N, K, lda, ldb;                // ldb in blocks
  std::vector<float> a;                     // [M, lda]
  std::vector<typename Format::Block> b;    // [N, ldb] blocks
  std::vector<float> b_wide;                // [N, ldb·kWeights] the dequantised values
};

// A [M, K] normal (lda = K + 3); B [N, K] rows of different magnitudes (and, with `shifted`,
// different means) quantised, one block more per row than K needs (ldb).
template <class Format>
QuantOperands<Format> make_operands(std::mt19937_64& gen, int64_t M, int64_t N, int64_t K, bool shifted) {
  constexpr int64_t W = Format::kWeights;
  QuantOperands<Format> o{M, N, K, K + 3, K / W + 1, {}, {}, {}};
  std::normal_distribution<float> d(0.0f, 1.0f);
  o.a.resize(static_cast<size_t>(M * o.lda));
  for (float& x : o.a) x = d(gen);
  o.b.resize(static_cast<size_t>(N * o.ldb));
  o.b_wide.resize(static_cast<size_t>(N * o.ldb * W));
  std::vector<float> row(static_cast<size_t>(o.ldb * W));
  for (int64_t j = 0; j < N; ++j) {
    const float spread = std::exp(d(gen)), shift = shifted ? d(gen) * spread : 0.0f;
    for (float& x : row) x = d(gen) * spread + shift;
    Format::quantize(row.data(), o.ldb * W, o.b.data() + j * o.ldb);
    Format::dequantize(o.b.data() + j * o.ldb, o.ldb * W, o.b_wide.data() + j * o.ldb * W);
  }
  return o;
}

// max |got − ref| / (|A row| · |B row|) over C [M, N] (ldc): the error relative to the dot
// product's scale.
template <class Format>
double scaled_error(const QuantOperands<Format>& o, const std::vector<float>& got, const std::vector<float>& ref,
                    int64_t ldc) {
  const int64_t ldw = o.ldb * Format::kWeights;
  std::vector<double> na(static_cast<size_t>(o.M)), nb(static_cast<size_t>(o.N));
  for (int64_t i = 0; i < o.M; ++i)
    for (int64_t k = 0; k < o.K; ++k) na[i] += double{o.a[i * o.lda + k]} * o.a[i * o.lda + k];
  for (int64_t j = 0; j < o.N; ++j)
    for (int64_t k = 0; k < o.K; ++k) nb[j] += double{o.b_wide[j * ldw + k]} * o.b_wide[j * ldw + k];
  double worst = 0;
  for (int64_t i = 0; i < o.M; ++i)
    for (int64_t j = 0; j < o.N; ++j)
      worst = std::max(worst, std::abs(double{got[i * ldc + j]} - ref[i * ldc + j]) / std::sqrt(na[i] * nb[j]));
  return worst;
}

// A's rows quantised as the decode streams quantise them (quantize_activations_q8): q [M, K],
// d [M, K/32].
struct QuantizedA {
  std::vector<int8_t> q;
  std::vector<float> d;
};

template <class Format>
QuantizedA quantize_a(const QuantOperands<Format>& o) {
  const int64_t nb = o.K / kernels::kQ8Block;
  QuantizedA a{std::vector<int8_t>(static_cast<size_t>(o.M * o.K)), std::vector<float>(static_cast<size_t>(o.M * nb))};
  for (int64_t i = 0; i < o.M; ++i)
    kernels::quantize_activations_q8(o.a.data() + i * o.lda, o.K, a.q.data() + i * o.K, a.d.data() + i * nb);
  return a;
}

}  // namespace mhsa::test
