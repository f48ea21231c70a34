// tests/cpp/test_f16_weights.cpp — 16-bit weights stored as IEEE float16 (WeightType::f16): every
// finite float16 value widened exactly by matmul_bt_f16 on every ISA (its other checks, shared
// with bf16's kernels, are in test_bf16.cpp); models loaded with WeightType::f16 (GPT-2 and a
// grouped-query SwiGLU Llama) against the float32 model on the same weights rounded to float16; an F16 checkpoint kept bit for bit as stored; a weight beyond
// float16's range refused by name; no gradients.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/dispatch.h"
#include "kernels/half.h"
#include "low_precision_models.h"
#include "mhsa/error.h"
#include "mhsa/model.h"
#include "mhsa/safetensors.h"
#include "model/access.h"
#include "nn/block.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

using kernels::f16_to_float;
using kernels::float_to_f16;

TEST(F16Weights, WideningIsExactOnEveryIsa) {
  // Every finite float16 value but −0 (subnormals included) through the stream: B [8192, 8] holds
  // them 8 to a row, A [8, 8] is the identity, so C[i][j] = B[j][i] exactly (each product with 0
  // adds a +0; −0, infinities and NaNs would not survive that, so they are left out as 0).
  std::vector<float16> b(65536);
  std::vector<float> want(65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    const bool skip = h == 0x8000u || (h & 0x7c00u) == 0x7c00u;
    b[h].bits = skip ? 0 : static_cast<uint16_t>(h);
    want[h] = f16_to_float(b[h].bits);
  }
  std::vector<float> eye(64, 0.0f);
  for (int i = 0; i < 8; ++i) eye[static_cast<size_t>(i * 9)] = 1.0f;
  for (cpu::Isa isa : cpu::usable_isas()) {
    const kernels::KernelTable& k = kernels::kernels_for(isa);
    std::vector<float> c(65536, 0.0f);  // C [8, N = 8192] = eye · Bᵀ: C[i][j] = B[j][i]
    k.matmul_bt_f16(8, 8192, 8, eye.data(), 8, b.data(), 8, c.data(), 8192);
    int mismatches = 0;
    for (int64_t j = 0; j < 8192; ++j)
      for (int64_t i = 0; i < 8; ++i) {
        const float got = c[static_cast<size_t>(i * 8192 + j)], w = want[static_cast<size_t>(j * 8 + i)];
        mismatches += std::memcmp(&got, &w, sizeof w) != 0;
      }
    EXPECT_EQ(mismatches, 0) << static_cast<int>(isa);
  }
}

void check_family(const nlohmann::json& config) {
  check_16bit_family(config, WeightType::f16, [](float x) { return f16_to_float(float_to_f16(x)); });
}

const nlohmann::json kGpt2 = {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", 97},
                              {"n_embd", 48},        {"n_layer", 2},                         {"n_head", 3},
                              {"n_positions", 64}};
const nlohmann::json kLlama = {{"model_type", "llama"},      {"architectures", {"LlamaForCausalLM"}},
                               {"vocab_size", 101},          {"hidden_size", 40},
                               {"intermediate_size", 72},    {"num_hidden_layers", 2},
                               {"num_attention_heads", 4},   {"num_key_value_heads", 2},
                               {"max_position_embeddings", 64}, {"tie_word_embeddings", false}};

TEST(F16Model, Gpt2MatchesTheFloatModelOnRoundedWeights) { check_family(kGpt2); }
TEST(F16Model, LlamaMatchesTheFloatModelOnRoundedWeights) { check_family(kLlama); }

// The file's tensors saved again as `dtype`, with `edit` applied to each one first.
template <class Edit>
void resave(const std::filesystem::path& dir, DType dtype, const Edit& edit) {
  const std::string path = (dir / "model.safetensors").string();
  const SafeTensors st = SafeTensors::open(path);
  std::vector<Tensor> kept;
  for (const SafeTensorInfo& info : st.tensors()) {
    kept.push_back(st.load(info.name));
    edit(info.name, kept.back());
  }
  std::vector<std::pair<std::string, ConstTensorView>> tensors;
  for (size_t i = 0; i < kept.size(); ++i) tensors.emplace_back(st.tensors()[i].name, kept[i].view());
  save_safetensors(path, tensors, {}, dtype);
}

TEST(F16Model, AnF16CheckpointIsKeptBitForBit) {
  auto gen = test_rng();
  const SavedModel saved(kLlama, gen());
  resave(saved.dir, DType::f16, [](const std::string&, Tensor&) {});
  const SafeTensors file = SafeTensors::open((saved.dir / "model.safetensors").string());
  const Model m = Model::load(saved.dir, WeightType::f16);
  const nn::Stack s = ModelAccess::stack(m);
  const auto params = m.parameters();
  int64_t checked = 0;
  for (size_t i = 0; i < s.half.size(); ++i) {
    if (!s.half[i]) continue;
    const std::string& name = params[i].first;
    const SafeTensorInfo* info = file.find(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->dtype, DType::f16) << name;
    const Tensor stored = file.load(name);  // the F16 values, widened exactly
    ASSERT_EQ(static_cast<int64_t>(s.half[i]->data.size()), stored.numel()) << name;
    int64_t differ = 0;
    for (int64_t j = 0; j < stored.numel(); ++j) {
      const float got = f16_to_float(s.half[i]->data[static_cast<size_t>(j)]);
      differ += std::memcmp(&got, stored.data() + j, sizeof got) != 0;
    }
    EXPECT_EQ(differ, 0) << name << ": not as stored";
    ++checked;
  }
  EXPECT_EQ(checked, 2 + 2 * 7);  // embedding, head, and each layer's q k v o gate up down
  expect_same_as_float_model(m, Model::load(saved.dir), gen);  // what float32 computes on the same file
}

TEST(F16Model, AWeightBeyondFloat16sRangeIsRefusedByName) {
  auto gen = test_rng();
  const SavedModel saved(kGpt2, gen());
  resave(saved.dir, DType::f32, [](const std::string& name, Tensor& t) {
    if (name == "h.1.mlp.c_fc.weight") t.data()[5] = -70000.0f;
  });
  try {
    (void)Model::load(saved.dir, WeightType::f16);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("h.1.mlp.c_fc.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("-70000"), std::string::npos) << m;
    EXPECT_NE(m.find("bf16"), std::string::npos) << m;  // what to use instead
  }
  EXPECT_NO_THROW((void)Model::load(saved.dir, WeightType::bf16));  // bf16 holds it
  // float16's largest, and values that round to it, are kept
  resave(saved.dir, DType::f32, [](const std::string& name, Tensor& t) {
    if (name == "h.1.mlp.c_fc.weight") {
      t.data()[5] = -65504.0f;
      t.data()[6] = 65519.0f;
    }
  });
  EXPECT_NO_THROW((void)Model::load(saved.dir, WeightType::f16));
}

TEST(F16Model, ParsedAndNamedLikeTheOtherWeightTypes) {
  EXPECT_EQ(parse_weight_type("f16", "--dtype"), WeightType::f16);
  EXPECT_EQ(weight_type_name(WeightType::f16), "f16");
  try {
    parse_weight_type("fp16", "--dtype");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"f16\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mhsa::test
