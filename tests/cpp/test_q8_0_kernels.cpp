// tests/cpp/test_q8_0_kernels.cpp — the kernels over Q8_0 weights (dispatch.h's matmul_bt_q8_0,
// matmul_bt_parts_q8_0, gemm_bt_q8_0) on every usable ISA: against the float64 twin on odd M and
// N and K from one block to thousands, gemm_bt_q8_0 bitwise gemm_ex on the dequantised B, the
// parts bitwise one call each, and every result bitwise identical for 1, 2 and 3 threads; and
// models loaded with WeightType::q8_0 (GPT-2 and a grouped-query SwiGLU Llama with a matrix that
// stays float32): logits, losses and greedy tokens against the float32 model run on the
// dequantised weights, non-finite weights and gradients refused.
#include <omp.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/q8_0.h"
#include "mhsa/error.h"
#include "mhsa/model.h"
#include "mhsa/safetensors.h"
#include "nn/linear.h"
#include "low_precision_models.h"
#include "test_util.h"

#include <nlohmann/json.hpp>

namespace mhsa::test {
namespace {

using kernels::BlockQ8_0;
using kernels::kQ8Block;

struct Operands {
  int64_t M, N, K, lda, ldb;      // ldb in blocks
  std::vector<float> a;           // [M, lda]
  std::vector<BlockQ8_0> b;       // [N, ldb] blocks
  std::vector<float> b_wide;      // [N, ldb·32] the dequantised values
};

Operands make(std::mt19937_64& gen, int64_t M, int64_t N, int64_t K) {
  Operands o{M, N, K, K + 3, K / kQ8Block + 1, {}, {}, {}};
  std::normal_distribution<float> d(0.0f, 1.0f);
  o.a.resize(static_cast<size_t>(M * o.lda));
  for (float& x : o.a) x = d(gen);
  o.b.resize(static_cast<size_t>(N * o.ldb));
  o.b_wide.resize(static_cast<size_t>(N * o.ldb * kQ8Block));
  std::vector<float> row(static_cast<size_t>(o.ldb * kQ8Block));
  for (int64_t j = 0; j < N; ++j) {
    const float spread = std::exp(d(gen));  // rows of different magnitudes
    for (float& x : row) x = d(gen) * spread;
    kernels::quantize_row_q8_0(row.data(), o.ldb * kQ8Block, o.b.data() + j * o.ldb);
    kernels::dequantize_row_q8_0(o.b.data() + j * o.ldb, o.ldb * kQ8Block, o.b_wide.data() + j * o.ldb * kQ8Block);
  }
  return o;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// max |got − ref| / (|A row| · |B row|) over C [M, N] (ldc): the error relative to the dot
// product's scale.
double scaled_error(const Operands& o, const std::vector<float>& got, const std::vector<float>& ref, int64_t ldc) {
  const int64_t ldw = o.ldb * kQ8Block;
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

TEST(Q8_0Kernels, MatchTheReferenceAndGemmIsTheFloatGemmOnDequantisedWeights) {
  auto gen = test_rng();
  for (int64_t M : {1, 3, 5, 17})
    for (int64_t K : {32, 96, 2080})
      for (int64_t N : {1, 7, 61, 301}) {
        const Operands o = make(gen, M, N, K);
        const int64_t ldc = N + 2, ldw = o.ldb * kQ8Block;
        std::vector<float> ref(static_cast<size_t>(M * ldc), 0.0f);
        kernels::matmul_bt_q8_0_ref(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, ref.data(), ldc);
        for (cpu::Isa isa : cpu::usable_isas()) {
          const kernels::KernelTable& k = kernels::kernels_for(isa);
          std::vector<float> got(ref.size(), 0.0f), packed(ref.size(), 0.0f), packed_wide(ref.size(), 0.0f);
          k.matmul_bt_q8_0(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, got.data(), ldc);
          k.gemm_bt_q8_0(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, packed.data(), ldc);
          k.gemm_ex(M, N, K, o.a.data(), o.lda, false, o.b_wide.data(), ldw, true, packed_wide.data(), ldc, false);
          const std::string what = std::string(cpu::isa_name(isa)) + " M=" + std::to_string(M) +
                                   " K=" + std::to_string(K) + " N=" + std::to_string(N);
          EXPECT_LE(scaled_error(o, got, ref, ldc), 4e-7 * std::sqrt(double(K))) << what;
          EXPECT_LE(scaled_error(o, packed, ref, ldc), 4e-7 * std::sqrt(double(K))) << what;
          EXPECT_TRUE(same_bits(packed, packed_wide)) << what << ": gemm_bt_q8_0 vs gemm_ex on the dequantised B";
        }
      }
}

TEST(Q8_0Kernels, PartsAreOneCallEachAndEveryResultIsTheSameForAnyThreadCount) {
  auto gen = test_rng();
  const int saved = omp_get_max_threads();
  for (int64_t M : {1, 3}) {
    const int64_t K = 96, ldc = 61 + 1025 + 1;
    const Operands q = make(gen, M, 61, K), kv = make(gen, M, 1025, K), one = make(gen, M, 1, K);
    const Operands big = make(gen, 17, 301, 768);
    for (cpu::Isa isa : cpu::usable_isas()) {
      const kernels::KernelTable& k = kernels::kernels_for(isa);
      std::vector<std::vector<float>> parts_out, single_out, gemm_out;
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        std::vector<float> c(static_cast<size_t>(M * ldc), 0.0f);  // [M, q | kv | one]
        const kernels::BtPartQ8 parts[] = {{q.b.data(), q.ldb, 61, c.data(), ldc},
                                           {kv.b.data(), kv.ldb, 1025, c.data() + 61, ldc},
                                           {one.b.data(), one.ldb, 1, c.data() + 61 + 1025, ldc}};
        k.matmul_bt_parts_q8_0(M, K, q.a.data(), q.lda, parts, 3);
        parts_out.push_back(c);
        std::vector<float> s(c.size(), 0.0f);
        k.matmul_bt_q8_0(M, 61, K, q.a.data(), q.lda, q.b.data(), q.ldb, s.data(), ldc);
        k.matmul_bt_q8_0(M, 1025, K, q.a.data(), q.lda, kv.b.data(), kv.ldb, s.data() + 61, ldc);
        k.matmul_bt_q8_0(M, 1, K, q.a.data(), q.lda, one.b.data(), one.ldb, s.data() + 61 + 1025, ldc);
        single_out.push_back(s);
        std::vector<float> g(static_cast<size_t>(17 * 301), 0.0f);
        k.gemm_bt_q8_0(17, 301, 768, big.a.data(), big.lda, big.b.data(), big.ldb, g.data(), 301);
        gemm_out.push_back(g);
      }
      const std::string what = std::string(cpu::isa_name(isa)) + " M=" + std::to_string(M);
      EXPECT_TRUE(same_bits(parts_out[0], single_out[0])) << what << ": parts vs one call each";
      for (size_t t = 1; t < parts_out.size(); ++t) {
        EXPECT_TRUE(same_bits(parts_out[0], parts_out[t])) << what << ": parts, 1 vs " << t + 1 << " threads";
        EXPECT_TRUE(same_bits(single_out[0], single_out[t])) << what << ": 1 vs " << t + 1 << " threads";
        EXPECT_TRUE(same_bits(gemm_out[0], gemm_out[t])) << what << ": gemm, 1 vs " << t + 1 << " threads";
      }
    }
  }
  omp_set_num_threads(saved);
}

// One row of A against a group of B rows (the decode path) and the same rows one at a time, or
// as rows of a taller A: every C element is one chain whatever the grouping.
TEST(Q8_0Kernels, GroupingDoesNotChangeBits) {
  auto gen = test_rng();
  const Operands o = make(gen, 5, 9, 256);
  for (cpu::Isa isa : cpu::usable_isas()) {
    const kernels::KernelTable& k = kernels::kernels_for(isa);
    std::vector<float> all(static_cast<size_t>(5 * 9)), row(all.size());
    k.matmul_bt_q8_0(5, 9, 256, o.a.data(), o.lda, o.b.data(), o.ldb, all.data(), 9);
    for (int64_t i = 0; i < 5; ++i) k.matmul_bt_q8_0(1, 9, 256, o.a.data() + i * o.lda, o.lda, o.b.data(), o.ldb,
                                                     row.data() + i * 9, 9);
    EXPECT_TRUE(same_bits(all, row)) << cpu::isa_name(isa);
  }
}

// w [rows, cols] replaced by its Q8_0 round trip along its rows, or along its columns (transposed:
// GPT-2's Conv1D [in, out], quantised as [out, in]).
void round_trip(Tensor& w, bool transposed) {
  Tensor m = transposed ? nn::transposed(w.data(), w.dim(0), w.dim(1), w.dim(1)) : w;  // [out, in]
  const int64_t cols = m.dim(1);
  std::vector<BlockQ8_0> blocks(static_cast<size_t>(cols / kQ8Block));
  for (int64_t r = 0; r < m.dim(0); ++r) {
    kernels::quantize_row_q8_0(m.data() + r * cols, cols, blocks.data());
    kernels::dequantize_row_q8_0(blocks.data(), cols, m.data() + r * cols);
  }
  w = transposed ? nn::transposed(m.data(), m.dim(0), m.dim(1), m.dim(1)) : m;
}

// float_names: the matrices whose rows are not whole blocks, which stay float32.
void check_family(const nlohmann::json& config, const std::vector<std::string>& float_names) {
  auto gen = test_rng();
  const SavedModel saved(config, gen());
  const Model q8 = Model::load(saved.dir, WeightType::q8_0);
  Model dequantised = Model::load(saved.dir);
  EXPECT_EQ(q8.weight_type(), WeightType::q8_0);
  const bool gpt2 = q8.family() == Family::gpt2;
  int64_t quantised = 0;
  for (auto& [name, t] : dequantised.parameters()) {
    const Tensor* q = q8.parameter(name);
    ASSERT_NE(q, nullptr) << name;
    const bool kept = t->shape().size() == 2 && name != "wpe.weight" &&
                      std::find(float_names.begin(), float_names.end(), name) == float_names.end();
    if (!kept) {
      EXPECT_EQ(q->shape(), t->shape()) << name << " stays float32";
      continue;
    }
    EXPECT_FALSE(q->defined()) << name << " lives in Q8_0 storage";
    round_trip(*t, gpt2 && name != "wte.weight");
    ++quantised;
  }
  EXPECT_GT(quantised, 2);
  expect_same_as_float_model(q8, dequantised, gen);
}

const nlohmann::json kGpt2 = {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", 97},
                              {"n_embd", 64}, {"n_layer", 2}, {"n_head", 4}, {"n_positions", 64}};

TEST(Q8_0Model, Gpt2MatchesTheFloatModelOnDequantisedWeights) { check_family(kGpt2, {}); }

TEST(Q8_0Model, LlamaMatchesTheFloatModelOnDequantisedWeights) {
  // intermediate_size 72: down_proj's rows (72 weights) are not whole blocks and stay float32.
  check_family({{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 101},
                {"hidden_size", 64}, {"intermediate_size", 72}, {"num_hidden_layers", 2},
                {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 64},
                {"tie_word_embeddings", false}},
               {"model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"});
}

TEST(Q8_0Model, NonFiniteWeightsAreRefusedByName) {
  const SavedModel saved(kGpt2, test_rng()(), "h.1.mlp.c_fc.weight");
  try {
    (void)Model::load(saved.dir, WeightType::q8_0);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("h.1.mlp.c_fc.weight"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_weight_type("q8_0", "--dtype"), WeightType::q8_0);
  EXPECT_EQ(weight_type_name(WeightType::q8_0), "q8_0");
}

}  // namespace
}  // namespace mhsa::test
