// tests/cpp/test_q8_0_kernels.cpp — the kernels over Q8_0 weights (dispatch.h's matmul_bt_q8_0,
// matmul_bt_parts_q8_0, gemm_bt_q8_0) on every usable ISA: the streams against their float64
// twin (A quantised too) within their chain's rounding bound and bit for bit the chain dispatch.h
// states, the activations' rounding (half away from zero) and non-finite rows; gemm_bt_q8_0
// against its twin and bitwise gemm_ex on the dequantised B; on odd M and N and K from one block
// to thousands; the parts bitwise one call each, and every result bitwise identical for 1, 2 and
// 3 threads and any grouping of rows; and
// models loaded with WeightType::q8_0 (GPT-2 and a grouped-query SwiGLU Llama with a matrix that
// stays float32): logits, losses and greedy tokens against the float32 model run on the
// dequantised weights (within what quantising the decode streams' activations costs), non-finite
// weights and gradients refused.
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
#include "kernels/half.h"
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

using Operands = QuantOperands<Q8Format>;

Operands make(std::mt19937_64& gen, int64_t M, int64_t N, int64_t K) {
  return make_operands<Q8Format>(gen, M, N, K, false);
}

// The streams' chain for C[i, j] as dispatch.h states it, written out in scalar float: per block
// the two scales' product, then 8 lanes of 4 exact integer products each, each lane one FMA (or,
// with fused false, a product and a sum) per block, and the fixed 8-lane tree.
float chain(const Operands& o, const QuantizedA& a, int64_t i, int64_t j, bool fused) {
  const int64_t nb = o.K / kQ8Block;
  float acc[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_0& w = o.b[j * o.ldb + b];
    const float p = kernels::f16_to_float(w.d) * a.d[i * nb + b];
    for (int l = 0; l < 8; ++l) {
      int32_t s = 0;
      for (int k = 4 * l; k < 4 * l + 4; ++k) s += int32_t{a.q[i * o.K + b * kQ8Block + k]} * w.qs[k];
      if (fused) {
        acc[l] = std::fma(p, static_cast<float>(s), acc[l]);
      } else {
        const volatile float product = p * static_cast<float>(s);
        acc[l] = product + acc[l];
      }
    }
  }
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// The streams' error bound against their float64 twin: each lane's chain of nb FMAs (2 roundings
// each without FMA), the scales' product, the tree: 2·(nb + 4)·2⁻²⁴ · Σ_b |dA·dB|·Σ|qa·qb|.
double chain_bound(const Operands& o, const QuantizedA& a, int64_t i, int64_t j) {
  const int64_t nb = o.K / kQ8Block;
  double sum = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_0& w = o.b[j * o.ldb + b];
    double s = 0;
    for (int64_t k = 0; k < kQ8Block; ++k) s += std::abs(static_cast<double>(a.q[i * o.K + b * kQ8Block + k]) * w.qs[k]);
    sum += std::abs(double{kernels::f16_to_float(w.d)} * a.d[i * nb + b]) * s;
  }
  return 2.0 * static_cast<double>(nb + 4) * std::ldexp(1.0, -24) * sum;
}

TEST(Q8_0Kernels, MatchTheReferenceAndGemmIsTheFloatGemmOnDequantisedWeights) {
  auto gen = test_rng();
  for (int64_t M : {1, 3, 5, 17})
    for (int64_t K : {32, 96, 2080})
      for (int64_t N : {1, 7, 61, 301}) {
        const Operands o = make(gen, M, N, K);
        const QuantizedA qa = quantize_a(o);
        const int64_t ldc = N + 2, ldw = o.ldb * kQ8Block;
        std::vector<float> ref(static_cast<size_t>(M * ldc), 0.0f), gemm_ref(ref.size(), 0.0f);
        std::vector<float> fused(ref.size(), 0.0f), unfused(ref.size(), 0.0f);
        kernels::matmul_bt_q8_0_ref(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, ref.data(), ldc);
        kernels::gemm_bt_q8_0_ref(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, gemm_ref.data(), ldc);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            fused[i * ldc + j] = chain(o, qa, i, j, true);
            unfused[i * ldc + j] = chain(o, qa, i, j, false);
          }
        // The twin holds the quantised A: the dequantised A times the dequantised B, near the
        // float product (activation quantisation moves a dot product by ~0.3% of its scale).
        const double quantisation = scaled_error(o, ref, gemm_ref, ldc);
        EXPECT_LE(quantisation, 0.01) << "M=" << M << " K=" << K << " N=" << N;
        for (cpu::Isa isa : cpu::usable_isas()) {
          const kernels::KernelTable& k = kernels::kernels_for(isa);
          std::vector<float> got(ref.size(), 0.0f), packed(ref.size(), 0.0f), packed_wide(ref.size(), 0.0f);
          k.matmul_bt_q8_0(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, got.data(), ldc);
          k.gemm_bt_q8_0(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, packed.data(), ldc);
          k.gemm_ex(M, N, K, o.a.data(), o.lda, false, o.b_wide.data(), ldw, true, packed_wide.data(), ldc, false);
          const std::string what = std::string(cpu::isa_name(isa)) + " M=" + std::to_string(M) +
                                   " K=" + std::to_string(K) + " N=" + std::to_string(N);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j)
              ASSERT_LE(std::abs(double{got[i * ldc + j]} - ref[i * ldc + j]), chain_bound(o, qa, i, j))
                  << what << " i=" << i << " j=" << j;
          // The stated chain, bit for bit: fused on every ISA with FMA; the portable build fuses
          // where its target has FMA (aarch64), not on x86-64's baseline.
          if (isa == cpu::Isa::portable)
            EXPECT_TRUE(same_bits(got, fused) || same_bits(got, unfused)) << what;
          else
            EXPECT_TRUE(same_bits(got, fused)) << what;
          EXPECT_LE(scaled_error(o, packed, gemm_ref, ldc), 4e-7 * std::sqrt(double(K))) << what;
          EXPECT_TRUE(same_bits(packed, packed_wide)) << what << ": gemm_bt_q8_0 vs gemm_ex on the dequantised B";
        }
      }
}

// The activations' quantiser through the streams, on values chosen so that its rounding shows:
// B row n holds a single weight 1 at column n (so C[i, n] = fl(dB · dA) · 127 · qa[n]), A row 0 a
// block with max |x| = 127 (scale 1: the quants are x rounded half away from zero) and one with
// max 254 (scale 2), row 1 a NaN and row 2 an inf (every output of the row NaN, as the float
// product would be NaN: a zero weight times NaN or inf), row 3 a block too small for a normal
// scale (its outputs 0) beside a normal one.
TEST(Q8_0Kernels, ActivationsRoundHalfAwayFromZeroAndNonFiniteRowsAreNaN) {
  constexpr int64_t M = 4, K = 64, N = 64, nb = K / kQ8Block;
  std::vector<float> a(static_cast<size_t>(M * K), 0.0f);
  std::vector<int8_t> want(static_cast<size_t>(K));
  const float ties[] = {0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 126.5f, -126.5f, 0.49999997f, -0.49999997f, 3.5000002f,
                        -3.4999998f, 127.0f, -127.0f, 0.0f, -0.0f, 64.25f};
  const int8_t rounded[] = {1, 2, 3, -1, -3, 127, -127, 0, 0, 4, -3, 127, -127, 0, 0, 64};
  for (int64_t k = 0; k < 32; ++k) {
    a[k] = ties[k % 16];
    want[k] = rounded[k % 16];
    a[32 + k] = 2.0f * ties[(k + 5) % 16];  // scale 2: the same quants
    want[32 + k] = rounded[(k + 5) % 16];
  }
  a[32 + 7] = 254.0f, want[32 + 7] = 127;
  for (int64_t k = 0; k < K; ++k) a[K + k] = a[2 * K + k] = a[k];
  a[K + 40] = std::numeric_limits<float>::quiet_NaN();
  a[2 * K + 3] = -std::numeric_limits<float>::infinity();
  for (int64_t k = 0; k < 32; ++k) a[3 * K + k] = std::ldexp(ties[k % 16], -130), a[3 * K + 32 + k] = a[32 + k];
  std::vector<BlockQ8_0> b(static_cast<size_t>(N * nb));
  std::vector<float> row(static_cast<size_t>(K));
  for (int64_t n = 0; n < N; ++n) {
    std::fill(row.begin(), row.end(), 0.0f);
    row[n] = 1.0f;
    kernels::quantize_row_q8_0(row.data(), K, b.data() + n * nb);
  }
  const float dw = kernels::f16_to_float(b[0].d);
  ASSERT_EQ(b[0].qs[0], 127);
  for (cpu::Isa isa : cpu::usable_isas()) {
    std::vector<float> c(static_cast<size_t>(M * N), 0.0f);
    kernels::kernels_for(isa).matmul_bt_q8_0(M, N, K, a.data(), K, b.data(), nb, c.data(), N);
    for (int64_t n = 0; n < N; ++n) {
      const float da = n < 32 ? 1.0f : 2.0f;
      EXPECT_EQ(c[n], dw * da * static_cast<float>(127 * want[n])) << cpu::isa_name(isa) << " column " << n;
      EXPECT_TRUE(std::isnan(c[N + n])) << cpu::isa_name(isa) << " NaN row, column " << n;
      EXPECT_TRUE(std::isnan(c[2 * N + n])) << cpu::isa_name(isa) << " inf row, column " << n;
      EXPECT_EQ(c[3 * N + n], n < 32 ? 0.0f : c[n]) << cpu::isa_name(isa) << " tiny block, column " << n;
    }
  }
  std::vector<int8_t> q(static_cast<size_t>(K));
  std::vector<float> d(static_cast<size_t>(nb));
  kernels::quantize_activations_q8(a.data(), K, q.data(), d.data());
  EXPECT_EQ(q, want);
  EXPECT_EQ(d[0], 1.0f);
  EXPECT_EQ(d[1], 2.0f);
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

// The VNNI streams (vpdpbusd on B's quants biased by 128: avx512vnni where the CPU has AVX512_VNNI,
// avx2vnni where it has AVX-VNNI) against their ISA's plain ones (the sign trick) bit for bit:
// quants over the whole int8 range, −128 included (a foreign file's; mhsa's quantiser never
// writes it), A rows of every size the streams take, large and tiny scales, a non-finite A row;
// and the ISA's table uses them (its entry is not the plain stream).
void check_vnni_streams(cpu::Isa isa, decltype(&kernels::avx2::matmul_bt_parts_q8_0) plain_product) {
  const auto vnni_product = kernels::kernels_for(isa).matmul_bt_parts_q8_0;  // the VNNI build's
  EXPECT_NE(vnni_product, plain_product) << cpu::isa_name(isa) << ": the table keeps the plain stream";
  auto gen = test_rng();
  std::uniform_int_distribution<int> byte(-128, 127), scale(0x0400, 0x6bff);  // f16 2^-14 .. ~3800
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int64_t M : {1, 2, 3, 4, 5, 8})
    for (int64_t K : {32, 96, 576, 3072})
      for (int64_t N : {1, 7, 61, 300}) {
        const int64_t nb = K / kQ8Block, ldb = nb + 1, lda = K + 5, ldc = N + 3;
        std::vector<BlockQ8_0> b(static_cast<size_t>(N * ldb));
        for (BlockQ8_0& blk : b) {
          blk.d = static_cast<uint16_t>(scale(gen));
          for (int8_t& q : blk.qs) q = static_cast<int8_t>(gen() % 8 == 0 ? (gen() % 2 ? -128 : 127) : byte(gen));
        }
        std::vector<float> a(static_cast<size_t>(M * lda));
        for (float& x : a) x = d(gen) * (gen() % 4 == 0 ? 1e4f : 1.0f);
        if (M > 2) a[2 * lda + K / 2] = std::numeric_limits<float>::infinity();
        std::vector<float> plain(static_cast<size_t>(M * ldc), -1.0f), vnni(plain);
        const kernels::BtPartQ8 p{b.data(), ldb, N, plain.data(), ldc}, v{b.data(), ldb, N, vnni.data(), ldc};
        plain_product(M, K, a.data(), lda, &p, 1);
        vnni_product(M, K, a.data(), lda, &v, 1);
        EXPECT_TRUE(same_bits(plain, vnni)) << cpu::isa_name(isa) << " M=" << M << " K=" << K << " N=" << N;
      }
}

TEST(Q8_0Kernels, VnniStreamsAreThePlainStreamsBitForBit) {
#if defined(__x86_64__)
  int checked = 0;
  if (cpu::vnni(cpu::Isa::avx512)) {
    check_vnni_streams(cpu::Isa::avx512, &kernels::avx512::matmul_bt_parts_q8_0);
    ++checked;
  }
  if (cpu::vnni(cpu::Isa::avx2)) {
    check_vnni_streams(cpu::Isa::avx2, &kernels::avx2::matmul_bt_parts_q8_0);
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no AVX512_VNNI or AVX-VNNI on this CPU (or MHSA_VNNI=0): nothing to compare";
#else
  GTEST_SKIP() << "not an x86 build";
#endif
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

// The streams quantise their activations per block: the logits of these tiny random models move
// by up to 5.6e-3 of the largest logit (losses 8e-4 relative; 12 seeds, both families, every T).
constexpr double kModelTolerance = 1.5e-2;

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
  expect_same_as_float_model(q8, dequantised, gen, kModelTolerance);
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
