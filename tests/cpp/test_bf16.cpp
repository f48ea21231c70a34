// tests/cpp/test_bf16.cpp — the kernels over bfloat16 weights (kernels/bf16.h, dispatch.h's
// matmul_bt_bf16, matmul_bt_parts_bf16, gemm_bt_bf16) on every usable ISA: against the float64
// twin on odd sizes, bitwise equal to the float kernels on the widened B, bitwise identical for
// any thread count; the float -> bfloat16 rounding (nearest-even, NaN kept); and models loaded
// with WeightType::bf16 (GPT-2 and a grouped-query SwiGLU Llama): their logits, losses and greedy
// tokens against the float32 model run on the same weights pre-rounded to bfloat16, and the
// refusal to compute gradients.
#include <omp.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/bf16.h"
#include "kernels/dispatch.h"
#include "mhsa/error.h"
#include "mhsa/model.h"
#include "mhsa/safetensors.h"
#include "low_precision_models.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

using kernels::bf16_to_float;
using kernels::float_to_bf16;

struct Operands {
  int64_t M, N, K, lda, ldb;
  std::vector<float> a;         // [M, lda]
  std::vector<uint16_t> b;      // [N, ldb] bfloat16
  std::vector<float> b_wide;    // [N, ldb] the same values as float
};

// B's rows ldb = K + b_pad apart: padded, or contiguous (b_pad 0) as a weight matrix's are, which
// the one-row stream prefetches differently (matmul_bt.cpp's dot_cols).
Operands make(std::mt19937_64& gen, int64_t M, int64_t N, int64_t K, int64_t b_pad = 5) {
  Operands o{M, N, K, K + 3, K + b_pad, {}, {}, {}};
  std::normal_distribution<float> d(0.0f, 1.0f);
  o.a.resize(static_cast<size_t>(M * o.lda));
  for (float& x : o.a) x = d(gen);
  o.b.resize(static_cast<size_t>(N * o.ldb));
  o.b_wide.resize(o.b.size());
  for (size_t i = 0; i < o.b.size(); ++i) {
    o.b[i] = float_to_bf16(d(gen));
    o.b_wide[i] = bf16_to_float(o.b[i]);
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
      const double e = std::abs(double{got[i * ldc + j]} - ref[i * ldc + j]) / std::sqrt(na * nb);
      worst = std::max(worst, e);
    }
  return worst;
}

TEST(Bf16, RoundingIsNearestEvenAndKeepsNaN) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1); a hair above rounds up.
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(float_to_bf16(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3f81);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);  // halfway from an odd one: up to even
  EXPECT_EQ(float_to_bf16(-2.5f), 0xc020);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  uint32_t signalling = 0xff800001u;  // a NaN whose payload is only in the low bits
  float s;
  std::memcpy(&s, &signalling, sizeof s);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(s))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(std::numeric_limits<float>::infinity())),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16_to_float(float_to_bf16(std::numeric_limits<float>::max())), std::numeric_limits<float>::infinity());
  auto gen = test_rng();
  std::normal_distribution<float> d(0.0f, 100.0f);
  for (int i = 0; i < 1000; ++i) {  // the nearest bfloat16: no other is closer
    const float x = d(gen);
    const uint16_t h = float_to_bf16(x);
    const double e = std::abs(double{bf16_to_float(h)} - x);
    EXPECT_LE(e, std::abs(double{bf16_to_float(static_cast<uint16_t>(h + 1))} - x));
    EXPECT_LE(e, std::abs(double{bf16_to_float(static_cast<uint16_t>(h - 1))} - x));
  }
}

TEST(Bf16, MatmulBtMatchesTheReferenceAndTheFloatKernel) {
  auto gen = test_rng();
  for (int64_t M : {1, 3, 17})
    for (int64_t K : {40, 97, 768})
      for (int64_t N : {1, 61, 1025})
        for (int64_t b_pad : {5, 0}) {
          const Operands o = make(gen, M, N, K, b_pad);
          const int64_t ldc = N + 2;
          std::vector<float> ref(static_cast<size_t>(M * ldc), 0.0f);
          kernels::matmul_bt_bf16_ref(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, ref.data(), ldc);
          for (cpu::Isa isa : cpu::usable_isas()) {
            const kernels::KernelTable& k = kernels::kernels_for(isa);
            std::vector<float> got(ref.size(), 0.0f), wide(ref.size(), 0.0f), packed(ref.size(), 0.0f),
                packed_wide(ref.size(), 0.0f);
            k.matmul_bt_bf16(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, got.data(), ldc);
            k.matmul_bt(M, N, K, o.a.data(), o.lda, o.b_wide.data(), o.ldb, wide.data(), ldc);
            k.gemm_bt_bf16(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, packed.data(), ldc);
            k.gemm_ex(M, N, K, o.a.data(), o.lda, false, o.b_wide.data(), o.ldb, true, packed_wide.data(), ldc, false);
            const std::string what = ::testing::PrintToString(static_cast<int>(isa)) + " M=" + std::to_string(M) +
                                     " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                                     " ldb=" + std::to_string(o.ldb);
            EXPECT_LE(scaled_error(o, got, ref, ldc), 4e-7 * std::sqrt(double(K))) << what;
            EXPECT_LE(scaled_error(o, packed, ref, ldc), 4e-7 * std::sqrt(double(K))) << what;
            EXPECT_TRUE(same_bits(got, wide)) << what << ": matmul_bt_bf16 vs matmul_bt on the widened B";
            EXPECT_TRUE(same_bits(packed, packed_wide)) << what << ": gemm_bt_bf16 vs gemm_ex on the widened B";
          }
        }
}

TEST(Bf16, PartsAreMatmulBtAndBitwiseIdenticalForAnyThreadCount) {
  auto gen = test_rng();
  const int saved = omp_get_max_threads();
  const int64_t M = 3, K = 97;
  const Operands q = make(gen, M, 61, K), kv = make(gen, M, 1025, K), one = make(gen, M, 1, K);
  const Operands big = make(gen, 17, 300, 768);
  for (cpu::Isa isa : cpu::usable_isas()) {
    const kernels::KernelTable& k = kernels::kernels_for(isa);
    std::vector<std::vector<float>> parts_out, single_out, gemm_out;
    for (int threads : {1, 2, 3}) {  // the threads claim ranges as they go: 3 on 2 cores interleave them
      omp_set_num_threads(threads);
      std::vector<float> c(static_cast<size_t>(M * (61 + 1025 + 1)), 0.0f);  // [M, q | kv | one]
      const int64_t ldc = 61 + 1025 + 1;
      const kernels::BtPart16 parts[] = {{q.b.data(), q.ldb, 61, c.data(), ldc},
                                         {kv.b.data(), kv.ldb, 1025, c.data() + 61, ldc},
                                         {one.b.data(), one.ldb, 1, c.data() + 61 + 1025, ldc}};
      k.matmul_bt_parts_bf16(M, K, q.a.data(), q.lda, parts, 3);
      parts_out.push_back(c);
      std::vector<float> s(c.size(), 0.0f);
      k.matmul_bt_bf16(M, 61, K, q.a.data(), q.lda, q.b.data(), q.ldb, s.data(), ldc);
      k.matmul_bt_bf16(M, 1025, K, q.a.data(), q.lda, kv.b.data(), kv.ldb, s.data() + 61, ldc);
      k.matmul_bt_bf16(M, 1, K, q.a.data(), q.lda, one.b.data(), one.ldb, s.data() + 61 + 1025, ldc);
      single_out.push_back(s);
      std::vector<float> g(static_cast<size_t>(17 * 300), 0.0f);
      k.gemm_bt_bf16(17, 300, 768, big.a.data(), big.lda, big.b.data(), big.ldb, g.data(), 300);
      gemm_out.push_back(g);
    }
    EXPECT_TRUE(same_bits(parts_out[0], single_out[0])) << static_cast<int>(isa) << ": parts vs one call each";
    EXPECT_TRUE(same_bits(parts_out[0], parts_out[1])) << static_cast<int>(isa) << ": 1 vs 2 threads";
    EXPECT_TRUE(same_bits(parts_out[0], parts_out[2])) << static_cast<int>(isa) << ": 1 vs 3 threads";
    EXPECT_TRUE(same_bits(single_out[0], single_out[1])) << static_cast<int>(isa) << ": 1 vs 2 threads";
    EXPECT_TRUE(same_bits(single_out[0], single_out[2])) << static_cast<int>(isa) << ": 1 vs 3 threads";
    EXPECT_TRUE(same_bits(gemm_out[0], gemm_out[1])) << static_cast<int>(isa) << ": gemm 1 vs 2 threads";
  }
  omp_set_num_threads(saved);
}

// What a bf16 model keeps in bfloat16: every matrix but learned positions.
bool stored_16bit(const std::string& name, const Tensor& t) { return t.shape().size() == 2 && name != "wpe.weight"; }

void check_family(const nlohmann::json& config) {
  auto gen = test_rng();
  const SavedModel saved(config, gen());
  const Model half = Model::load(saved.dir, WeightType::bf16);
  Model rounded = Model::load(saved.dir);
  EXPECT_EQ(half.weight_type(), WeightType::bf16);
  EXPECT_EQ(rounded.weight_type(), WeightType::f32);
  int64_t rounded_count = 0;
  for (auto& [name, t] : rounded.parameters()) {
    const Tensor* h = half.parameter(name);
    ASSERT_NE(h, nullptr) << name;
    if (!stored_16bit(name, *t)) {
      EXPECT_EQ(h->shape(), t->shape()) << name << " stays float32";
      continue;
    }
    EXPECT_FALSE(h->defined()) << name << " lives in bfloat16 storage";
    for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = bf16_to_float(float_to_bf16(t->data()[i]));
    ++rounded_count;
  }
  EXPECT_GT(rounded_count, 2);
  expect_same_as_float_model(half, rounded, gen);
}

TEST(Bf16Model, Gpt2MatchesTheFloatModelOnRoundedWeights) {
  check_family({{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", 97}, {"n_embd", 48},
                {"n_layer", 2}, {"n_head", 3}, {"n_positions", 64}});
}

TEST(Bf16Model, LlamaMatchesTheFloatModelOnRoundedWeights) {
  check_family({{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 101},
                {"hidden_size", 40}, {"intermediate_size", 72}, {"num_hidden_layers", 2},
                {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 64},
                {"tie_word_embeddings", false}});
}

TEST(Bf16Model, BadWeightTypeNamesTheOptionAndTheChoices) {
  EXPECT_EQ(parse_weight_type("bf16", "--dtype"), WeightType::bf16);
  EXPECT_EQ(parse_weight_type("f32", "--dtype"), WeightType::f32);
  try {
    parse_weight_type("fp16", "--dtype");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--dtype"), std::string::npos) << m;
    EXPECT_NE(m.find("\"bf16\""), std::string::npos) << m;
    EXPECT_NE(m.find("fp16"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace mhsa::test
