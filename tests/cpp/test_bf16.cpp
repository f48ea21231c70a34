// tests/cpp/test_bf16.cpp — the kernels over 16-bit weights (kernels/bf16.h, dispatch.h's
// matmul_bt_bf16, matmul_bt_parts_bf16, gemm_bt_bf16, and their float16 twins _f16) on every
// usable ISA: against the float64 twin on odd sizes, bitwise equal to the float kernels on the
// widened B, bitwise identical for any thread count; the float -> bfloat16 rounding (nearest-even, NaN kept); and models loaded
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
#include "kernels/half.h"
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

// The two formats of 16-bit weights: how a float is narrowed and widened, the bits the float64
// twin reads, and the kernels of each.
struct Bf16Format {
  using Elem = uint16_t;
  using Part = kernels::BtPart16;
  static Elem narrow(float x) { return float_to_bf16(x); }
  static uint16_t bits(Elem h) { return h; }
  static constexpr auto matmul = &kernels::KernelTable::matmul_bt_bf16;
  static constexpr auto parts = &kernels::KernelTable::matmul_bt_parts_bf16;
  static constexpr auto gemm = &kernels::KernelTable::gemm_bt_bf16;
  static constexpr auto ref = &kernels::matmul_bt_bf16_ref;
  static float widen(uint16_t h) { return bf16_to_float(h); }
};
struct F16Format {
  using Elem = float16;
  using Part = kernels::BtPartF16;
  static Elem narrow(float x) { return {kernels::float_to_f16(x)}; }
  static uint16_t bits(Elem h) { return h.bits; }
  static constexpr auto matmul = &kernels::KernelTable::matmul_bt_f16;
  static constexpr auto parts = &kernels::KernelTable::matmul_bt_parts_f16;
  static constexpr auto gemm = &kernels::KernelTable::gemm_bt_f16;
  static constexpr auto ref = &kernels::matmul_bt_f16_ref;
  static float widen(uint16_t h) { return kernels::f16_to_float(h); }
};

template <class Format>
struct Operands {
  int64_t M, N, K, lda, ldb;
  std::vector<float> a;                        // [M, lda]
  std::vector<typename Format::Elem> b;        // [N, ldb] 16-bit
  std::vector<uint16_t> bits;                  // the same, as the float64 twin reads them
  std::vector<float> b_wide;                   // [N, ldb] the same values as float
};

// B's rows ldb = K + b_pad apart: padded, or contiguous (b_pad 0) as a weight matrix's are, which
// the one-row stream prefetches differently (matmul_bt.cpp's dot_cols). Among B's normal values:
// tiny ones (float16 subnormals), −0 and ±65504 (float16's largest), where conversions could differ.
template <class Format>
Operands<Format> make(std::mt19937_64& gen, int64_t M, int64_t N, int64_t K, int64_t b_pad = 5) {
  Operands<Format> o{M, N, K, K + 3, K + b_pad, {}, {}, {}, {}};
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
      case 0: v *= 1e-6f; break;
      case 1: v = -0.0f; break;
      case 2: v = v > 0 ? 65504.0f : -65504.0f; break;
      default: break;
    }
    o.b[i] = Format::narrow(v);
    o.bits[i] = Format::bits(o.b[i]);
    o.b_wide[i] = Format::widen(o.bits[i]);
  }
  return o;
}

// max |got − ref| / (|A row| · |B row|): the error relative to the dot product's scale.
template <class Format>
double scaled_error(const Operands<Format>& o, const std::vector<float>& got, const std::vector<float>& ref,
                    int64_t ldc) {
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

// matmul_bt_*, gemm_bt_* of every ISA against the float64 twin, and bitwise the float kernels on
// the widened B.
template <class Format>
void check_against_reference_and_float_kernels() {
  auto gen = test_rng();
  for (int64_t M : {1, 2, 3, 8, 17})  // 8: a serving step; the 16-bit streams block 2..8 rows
    for (int64_t K : {40, 97, 768})
      for (int64_t N : {1, 61, 1025})
        for (int64_t b_pad : {5, 0}) {
          const Operands<Format> o = make<Format>(gen, M, N, K, b_pad);
          const int64_t ldc = N + 2;
          std::vector<float> ref(static_cast<size_t>(M * ldc), 0.0f);
          Format::ref(M, N, K, o.a.data(), o.lda, o.bits.data(), o.ldb, ref.data(), ldc);
          for (cpu::Isa isa : cpu::usable_isas()) {
            const kernels::KernelTable& k = kernels::kernels_for(isa);
            std::vector<float> got(ref.size(), 0.0f), wide(ref.size(), 0.0f), packed(ref.size(), 0.0f),
                packed_wide(ref.size(), 0.0f);
            (k.*Format::matmul)(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, got.data(), ldc);
            k.matmul_bt(M, N, K, o.a.data(), o.lda, o.b_wide.data(), o.ldb, wide.data(), ldc);
            (k.*Format::gemm)(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, packed.data(), ldc);
            k.gemm_ex(M, N, K, o.a.data(), o.lda, false, o.b_wide.data(), o.ldb, true, packed_wide.data(), ldc, false);
            const std::string what = ::testing::PrintToString(static_cast<int>(isa)) + " M=" + std::to_string(M) +
                                     " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                                     " ldb=" + std::to_string(o.ldb);
            EXPECT_LE(scaled_error(o, got, ref, ldc), 4e-7 * std::sqrt(double(K))) << what;
            EXPECT_LE(scaled_error(o, packed, ref, ldc), 4e-7 * std::sqrt(double(K))) << what;
            EXPECT_TRUE(same_bits(got, wide)) << what << ": the stream vs matmul_bt on the widened B";
            EXPECT_TRUE(same_bits(packed, packed_wide)) << what << ": the packed GEMM vs gemm_ex on the widened B";
          }
        }
}

// matmul_bt_parts_* is matmul_bt_* per part, bitwise identical for 1, 2 and 3 threads, as is the GEMM.
template <class Format>
void check_parts_and_threads() {
  auto gen = test_rng();
  const int saved = omp_get_max_threads();
  const int64_t M = 3, K = 97;
  const Operands<Format> q = make<Format>(gen, M, 61, K), kv = make<Format>(gen, M, 1025, K),
                         one = make<Format>(gen, M, 1, K), big = make<Format>(gen, 17, 300, 768);
  for (cpu::Isa isa : cpu::usable_isas()) {
    const kernels::KernelTable& k = kernels::kernels_for(isa);
    std::vector<std::vector<float>> parts_out, single_out, gemm_out;
    for (int threads : {1, 2, 3}) {  // the threads claim ranges as they go: 3 on 2 cores interleave them
      omp_set_num_threads(threads);
      const int64_t ldc = 61 + 1025 + 1;
      std::vector<float> c(static_cast<size_t>(M * ldc), 0.0f);  // [M, q | kv | one]
      const typename Format::Part parts[] = {{q.b.data(), q.ldb, 61, c.data(), ldc},
                                             {kv.b.data(), kv.ldb, 1025, c.data() + 61, ldc},
                                             {one.b.data(), one.ldb, 1, c.data() + 61 + 1025, ldc}};
      (k.*Format::parts)(M, K, q.a.data(), q.lda, parts, 3);
      parts_out.push_back(c);
      std::vector<float> s(c.size(), 0.0f);
      (k.*Format::matmul)(M, 61, K, q.a.data(), q.lda, q.b.data(), q.ldb, s.data(), ldc);
      (k.*Format::matmul)(M, 1025, K, q.a.data(), q.lda, kv.b.data(), kv.ldb, s.data() + 61, ldc);
      (k.*Format::matmul)(M, 1, K, q.a.data(), q.lda, one.b.data(), one.ldb, s.data() + 61 + 1025, ldc);
      single_out.push_back(s);
      std::vector<float> g(static_cast<size_t>(17 * 300), 0.0f);
      (k.*Format::gemm)(17, 300, 768, big.a.data(), big.lda, big.b.data(), big.ldb, g.data(), 300);
      gemm_out.push_back(g);
    }
    const int i = static_cast<int>(isa);
    EXPECT_TRUE(same_bits(parts_out[0], single_out[0])) << i << ": parts vs one call each";
    EXPECT_TRUE(same_bits(parts_out[0], parts_out[1])) << i << ": 1 vs 2 threads";
    EXPECT_TRUE(same_bits(parts_out[0], parts_out[2])) << i << ": 1 vs 3 threads";
    EXPECT_TRUE(same_bits(single_out[0], single_out[1])) << i << ": 1 vs 2 threads";
    EXPECT_TRUE(same_bits(single_out[0], single_out[2])) << i << ": 1 vs 3 threads";
    EXPECT_TRUE(same_bits(gemm_out[0], gemm_out[1])) << i << ": gemm 1 vs 2 threads";
  }
  omp_set_num_threads(saved);
}

TEST(Bf16, MatmulBtMatchesTheReferenceAndTheFloatKernel) { check_against_reference_and_float_kernels<Bf16Format>(); }
TEST(Bf16, PartsAreMatmulBtAndBitwiseIdenticalForAnyThreadCount) { check_parts_and_threads<Bf16Format>(); }
TEST(F16Weights, MatmulBtMatchesTheReferenceAndTheFloatKernel) { check_against_reference_and_float_kernels<F16Format>(); }
TEST(F16Weights, PartsAreMatmulBtAndBitwiseIdenticalForAnyThreadCount) { check_parts_and_threads<F16Format>(); }

// gemm_bt_bf16_dot (AVX512_BF16's vdpbf16ps; only where the CPU has it): against its float64 twin
// (A rounded to bfloat16) within a float32 chain's error and much further from the product of the
// unrounded A (so A is rounded); odd K (a half pair), edge panels and rows, several K blocks.
TEST(Bf16, DotProductGemmMatchesItsTwin) {
  const kernels::KernelTable& k = kernels::kernels_for(cpu::usable_isas().back());
  if (!k.gemm_bt_bf16_dot) GTEST_SKIP() << "no AVX512_BF16 on this CPU (or MHSA_BF16_DOT=0): nothing to test";
  auto gen = test_rng();
  for (int64_t M : {9, 13, 50, 97})
    for (int64_t K : {1, 2, 3, 31, 40, 97, 600})
      for (int64_t N : {1, 31, 33, 100})
        for (int64_t b_pad : {5, 0}) {
          const Operands<Bf16Format> o = make<Bf16Format>(gen, M, N, K, b_pad);
          const int64_t ldc = N + 2;
          std::vector<float> twin(static_cast<size_t>(M * ldc), 0.0f), unrounded(twin), got(twin);
          kernels::gemm_bt_bf16_dot_ref(M, N, K, o.a.data(), o.lda, o.bits.data(), o.ldb, twin.data(), ldc);
          kernels::matmul_bt_bf16_ref(M, N, K, o.a.data(), o.lda, o.bits.data(), o.ldb, unrounded.data(), ldc);
          k.gemm_bt_bf16_dot(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, got.data(), ldc);
          const std::string what = "M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                                   " ldb=" + std::to_string(o.ldb);
          const double e = scaled_error(o, got, twin, ldc);
          EXPECT_LE(e, 4e-7 * std::sqrt(double(K))) << what;
          if (K >= 31) EXPECT_GT(scaled_error(o, got, unrounded, ldc), 10 * e) << what << ": A not rounded?";
        }
}

// gemm_bt_bf16_dot's bits depend on A, B and K only: the same for 1, 2 and 3 threads and for a
// block of A's rows run alone; a NaN in A reaches its own row of C and no other.
TEST(Bf16, DotProductGemmIsBitwiseIdenticalForAnySplit) {
  const kernels::KernelTable& k = kernels::kernels_for(cpu::usable_isas().back());
  if (!k.gemm_bt_bf16_dot) GTEST_SKIP() << "no AVX512_BF16 on this CPU (or MHSA_BF16_DOT=0): nothing to test";
  auto gen = test_rng();
  const int saved = omp_get_max_threads();
  const int64_t M = 200, N = 300, K = 601, ldc = N;
  Operands<Bf16Format> o = make<Bf16Format>(gen, M, N, K);
  o.a[5 * o.lda + 17] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::vector<float>> out;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    std::vector<float> c(static_cast<size_t>(M * ldc), 0.0f);
    k.gemm_bt_bf16_dot(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, c.data(), ldc);
    out.push_back(c);
  }
  omp_set_num_threads(saved);
  EXPECT_TRUE(same_bits(out[0], out[1])) << "1 vs 2 threads";
  EXPECT_TRUE(same_bits(out[0], out[2])) << "1 vs 3 threads";
  const int64_t r0 = 37, rows = 50;
  std::vector<float> part(static_cast<size_t>(rows * ldc), 0.0f);
  k.gemm_bt_bf16_dot(rows, N, K, o.a.data() + r0 * o.lda, o.lda, o.b.data(), o.ldb, part.data(), ldc);
  EXPECT_TRUE(same_bits(part, std::vector<float>(out[0].begin() + r0 * ldc, out[0].begin() + (r0 + rows) * ldc)))
      << "rows 37..86 alone vs in the whole";
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) ASSERT_EQ(std::isnan(out[0][i * ldc + j]), i == 5) << i << "," << j;
}

void check_family(const nlohmann::json& config) {
  check_16bit_family(config, WeightType::bf16, [](float x) { return bf16_to_float(float_to_bf16(x)); });
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
