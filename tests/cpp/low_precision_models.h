// tests/cpp/low_precision_models.h — shared by the bf16 and Q8_0 model tests: a random model saved
// as a Hugging Face directory, and the check that a low-precision model computes what the float
// model computes on the weights it actually holds (rounded or dequantised).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

}  // namespace mhsa::test
