// tests/cpp/test_f16_weights.cpp — 16-bit weights stored as IEEE float16 (WeightType::f16): the
// kernels (dispatch.h's matmul_bt_f16, matmul_bt_parts_f16, gemm_bt_f16) on every usable ISA
// against their float64 twin on odd sizes and subnormal, signed-zero and extreme values, bitwise
// equal to the float kernels on the widened B and for any thread count; models loaded with
// WeightType::f16 (GPT-2 and a grouped-query SwiGLU Llama) against the float32 model on the same
// weights rounded to float16; an F16 checkpoint kept bit for bit as stored; a weight beyond
// float16's range refused by name; no gradients.
#include <omp.h>

#include <cmath>
#include <filesystem>
#include <cstring>
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

struct Operands {
  int64_t M, N, K, lda, ldb;
  std::vector<float> a;        // [M, lda]
  std::vector<float16> b;      // [N, ldb] float16
  std::vector<uint16_t> bits;  // the same, as the reference takes them
  std::vector<float> b_wide;   // [N, ldb] the same values as float
};

// B's rows ldb = K + b_pad apart (b_pad 0: contiguous, as a weight matrix's are). Among B's normal
// values: subnormals, ±0 and ±65504 (float16's largest), so that the widening is checked where
// F16C and the portable conversion could disagree.
Operands make(std::mt19937_64& gen, int64_t M, int64_t N, int64_t K, int64_t b_pad = 5) {
  Operands o{M, N, K, K + 3, K + b_pad, {}, {}, {}, {}};
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 15);
  o.a.resize(static_cast<size_t>(M * o.lda));
  for (float& x : o.a) x = d(gen);
  const size_t n = static_cast<size_t>(N * o.ldb);
  o.b.resize(n);
  o.bits.resize(n);
  o.b_wide.resize(n);
  for (size_t i = 0; i < n; ++i) {
    float v = d(gen);
    switch (pick(gen)) {
      case 0: v *= 1e-6f; break;  // subnormal in float16
      case 1: v = -0.0f; break;
      case 2: v = v > 0 ? 65504.0f : -65504.0f; break;
      default: break;
    }
    o.bits[i] = float_to_f16(v);
    o.b[i].bits = o.bits[i];
    o.b_wide[i] = f16_to_float(o.bits[i]);
  }
  return o;
}

// max |got − ref| / (|A row| · |B row|): the error relative to the dot product's scale.
double scaled_error(const Operands& o, const std::vector<float>& got, const std::vector<float>& ref, int64_t ldc) {
  double worst = 0;
  for (int64_t i = 0; i < o.M; ++i)
    for (int64_t j = 0; j < o.N; ++j) {
      double na = 0, nb = 0;
      for (int64_t k = 0; k < o.K; ++k) {
        na += double{o.a[i * o.lda + k]} * o.a[i * o.lda + k];
        nb += double{o.b_wide[j * o.ldb + k]} * o.b_wide[j * o.ldb + k];
      }
      worst = std::max(worst, std::abs(double{got[i * ldc + j]} - ref[i * ldc + j]) / std::sqrt(na * nb));
    }
  return worst;
}

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

TEST(F16Weights, MatmulBtMatchesTheReferenceAndTheFloatKernel) {
  auto gen = test_rng();
  for (int64_t M : {1, 3, 17})
    for (int64_t K : {40, 97, 768})
      for (int64_t N : {1, 61, 1025})
        for (int64_t b_pad : {5, 0}) {
          const Operands o = make(gen, M, N, K, b_pad);
          const int64_t ldc = N + 2;
          std::vector<float> ref(static_cast<size_t>(M * ldc), 0.0f);
          kernels::matmul_bt_f16_ref(M, N, K, o.a.data(), o.lda, o.bits.data(), o.ldb, ref.data(), ldc);
          for (cpu::Isa isa : cpu::usable_isas()) {
            const kernels::KernelTable& k = kernels::kernels_for(isa);
            std::vector<float> got(ref.size(), 0.0f), wide(ref.size(), 0.0f), packed(ref.size(), 0.0f),
                packed_wide(ref.size(), 0.0f);
            k.matmul_bt_f16(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, got.data(), ldc);
            k.matmul_bt(M, N, K, o.a.data(), o.lda, o.b_wide.data(), o.ldb, wide.data(), ldc);
            k.gemm_bt_f16(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, packed.data(), ldc);
            k.gemm_ex(M, N, K, o.a.data(), o.lda, false, o.b_wide.data(), o.ldb, true, packed_wide.data(), ldc, false);
            const std::string what = ::testing::PrintToString(static_cast<int>(isa)) + " M=" + std::to_string(M) +
                                     " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                                     " ldb=" + std::to_string(o.ldb);
            EXPECT_LE(scaled_error(o, got, ref, ldc), 4e-7 * std::sqrt(double(K))) << what;
            EXPECT_LE(scaled_error(o, packed, ref, ldc), 4e-7 * std::sqrt(double(K))) << what;
            EXPECT_TRUE(same_bits(got, wide)) << what << ": matmul_bt_f16 vs matmul_bt on the widened B";
            EXPECT_TRUE(same_bits(packed, packed_wide)) << what << ": gemm_bt_f16 vs gemm_ex on the widened B";
          }
        }
}

TEST(F16Weights, PartsAreMatmulBtAndBitwiseIdenticalForAnyThreadCount) {
  auto gen = test_rng();
  const int saved = omp_get_max_threads();
  const int64_t M = 3, K = 97;
  const Operands q = make(gen, M, 61, K), kv = make(gen, M, 1025, K), one = make(gen, M, 1, K);
  const Operands big = make(gen, 17, 300, 768);
  for (cpu::Isa isa : cpu::usable_isas()) {
    const kernels::KernelTable& k = kernels::kernels_for(isa);
    std::vector<std::vector<float>> parts_out, single_out, gemm_out;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      const int64_t ldc = 61 + 1025 + 1;
      std::vector<float> c(static_cast<size_t>(M * ldc), 0.0f);  // [M, q | kv | one]
      const kernels::BtPartF16 parts[] = {{q.b.data(), q.ldb, 61, c.data(), ldc},
                                          {kv.b.data(), kv.ldb, 1025, c.data() + 61, ldc},
                                          {one.b.data(), one.ldb, 1, c.data() + 61 + 1025, ldc}};
      k.matmul_bt_parts_f16(M, K, q.a.data(), q.lda, parts, 3);
      parts_out.push_back(c);
      std::vector<float> s(c.size(), 0.0f);
      k.matmul_bt_f16(M, 61, K, q.a.data(), q.lda, q.b.data(), q.ldb, s.data(), ldc);
      k.matmul_bt_f16(M, 1025, K, q.a.data(), q.lda, kv.b.data(), kv.ldb, s.data() + 61, ldc);
      k.matmul_bt_f16(M, 1, K, q.a.data(), q.lda, one.b.data(), one.ldb, s.data() + 61 + 1025, ldc);
      single_out.push_back(s);
      std::vector<float> g(static_cast<size_t>(17 * 300), 0.0f);
      k.gemm_bt_f16(17, 300, 768, big.a.data(), big.lda, big.b.data(), big.ldb, g.data(), 300);
      gemm_out.push_back(g);
    }
    const int i = static_cast<int>(isa);
    EXPECT_TRUE(same_bits(parts_out[0], single_out[0])) << i << ": parts vs one call each";
    EXPECT_TRUE(same_bits(parts_out[0], parts_out[1])) << i << ": 1 vs 2 threads";
    EXPECT_TRUE(same_bits(parts_out[0], parts_out[2])) << i << ": 1 vs 3 threads";
    EXPECT_TRUE(same_bits(single_out[0], single_out[2])) << i << ": 1 vs 3 threads";
    EXPECT_TRUE(same_bits(gemm_out[0], gemm_out[1])) << i << ": gemm 1 vs 2 threads";
  }
  omp_set_num_threads(saved);
}

// What a 16-bit model keeps in 16 bits: every matrix but learned positions.
bool stored_16bit(const std::string& name, const Tensor& t) { return t.shape().size() == 2 && name != "wpe.weight"; }

void check_family(const nlohmann::json& config) {
  auto gen = test_rng();
  const SavedModel saved(config, gen());
  const Model half = Model::load(saved.dir, WeightType::f16);
  Model rounded = Model::load(saved.dir);
  EXPECT_EQ(half.weight_type(), WeightType::f16);
  int64_t rounded_count = 0;
  for (auto& [name, t] : rounded.parameters()) {
    const Tensor* h = half.parameter(name);
    ASSERT_NE(h, nullptr) << name;
    if (!stored_16bit(name, *t)) {
      EXPECT_EQ(h->shape(), t->shape()) << name << " stays float32";
      continue;
    }
    EXPECT_FALSE(h->defined()) << name << " lives in float16 storage";
    for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = f16_to_float(float_to_f16(t->data()[i]));
    ++rounded_count;
  }
  EXPECT_GT(rounded_count, 2);
  expect_same_as_float_model(half, rounded, gen);
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
