// tests/cpp/test_q4_k.cpp — 4-bit weights: the Q4_K block (kernels/q4_k.h) and mhsa's quantiser
// (its error against the plain min/max rule on the same grid, zero, constant, all-positive and
// outlier blocks; its bytes dequantised by the GGUF reader's own Q4_K code equal our dequantiser's
// values), the kernels over Q4_K weights on every usable ISA (matmul_bt_q4_k and its parts form,
// which quantise A per 32-value block: against their float64 twin within their chain's rounding
// bound and bit for bit the chain matmul_q4_k.cpp states, the same bits on every ISA with FMA, on
// 1, 2, 3 and 17 rows of A; non-finite activations give NaN rows; gemm_bt_q4_k against its twin and
// bitwise gemm_ex on the dequantised B; every result the same for 1, 2 and 3 threads and for any
// grouping), models loaded with WeightType::q4_k against
// the float model on the weights they hold (Q4_K matrices, Q8_0 output and odd-width matrices),
// and q4_k GGUF files: the tensor types written, and a file loaded as q4_k keeping its blocks (the
// same logits as quantising at load). The gguf package's view is tests/python/test_gguf.py's.
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "kernels/dispatch.h"
#include "kernels/half.h"
#include "kernels/q4_k.h"
#include "kernels/q8_0.h"
#include "mhsa/error.h"
#include "mhsa/model.h"
#include "model/gguf_model.h"
#include "nn/linear.h"
#include "low_precision_models.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

using kernels::BlockQ4_K;
using kernels::kQ4KBlock;
using kernels::kQ8Block;

std::vector<float> quantised_round_trip(const std::vector<float>& x) {
  std::vector<BlockQ4_K> q(x.size() / kQ4KBlock);
  std::vector<float> y(x.size());
  kernels::quantize_row_q4_k(x.data(), static_cast<int64_t>(x.size()), q.data());
  kernels::dequantize_row_q4_k(q.data(), static_cast<int64_t>(x.size()), y.data());
  return y;
}

// The plain rule on the same grid: per sub-block the range [min(0, lo), hi] in 15 steps, the
// 6-bit scales and mins rounded against the largest, quants rounded (the baseline to beat).
std::vector<float> min_max_round_trip(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t b0 = 0; b0 < x.size(); b0 += kQ4KBlock) {
    float scale[8], offset[8], smax = 0, omax = 0;
    for (int s = 0; s < 8; ++s) {
      float lo = 0, hi = x[b0 + 32 * s];
      for (int i = 0; i < 32; ++i) lo = std::min(lo, x[b0 + 32 * s + i]), hi = std::max(hi, x[b0 + 32 * s + i]);
      scale[s] = (hi - lo) / 15, offset[s] = -lo;
      smax = std::max(smax, scale[s]), omax = std::max(omax, offset[s]);
    }
    const float d = kernels::f16_to_float(kernels::float_to_f16(smax / 63));
    const float dmin = kernels::f16_to_float(kernels::float_to_f16(omax / 63));
    for (int s = 0; s < 8; ++s) {
      const float a = d * std::round(scale[s] / d), o = dmin > 0 ? dmin * std::round(offset[s] / dmin) : 0.0f;
      for (int i = 0; i < 32; ++i) {
        const float v = x[b0 + 32 * s + i];
        const float q = a > 0 ? std::clamp(std::round((v + o) / a), 0.0f, 15.0f) : 0.0f;
        y[b0 + 32 * s + i] = a * q - o;
      }
    }
  }
  return y;
}

double rms(const std::vector<float>& x, const std::vector<float>& y) {
  double e = 0;
  for (size_t i = 0; i < x.size(); ++i) e += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
  return std::sqrt(e / static_cast<double>(x.size()));
}

// The error of y against x block by block, each relative to its block's own size, then their
// root mean square: every 256-weight block counts alike, whatever its magnitude.
double block_relative_rms(const std::vector<float>& x, const std::vector<float>& y) {
  double total = 0;
  const size_t blocks = x.size() / kQ4KBlock;
  for (size_t b = 0; b < blocks; ++b) {
    double e = 0, s = 0;
    for (size_t i = b * kQ4KBlock; i < (b + 1) * kQ4KBlock; ++i) {
      e += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
      s += double{x[i]} * x[i];
    }
    total += e / s;
  }
  return std::sqrt(total / static_cast<double>(blocks));
}

TEST(Q4_K, QuantiserBeatsTheMinMaxRuleAndHandlesEdgeBlocks) {
  auto gen = test_rng();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  const int64_t n = kQ4KBlock * 67;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t b = 0; b < n / kQ4KBlock; ++b) {
    const float spread = 0.02f * std::exp(normal(gen));  // blocks of different magnitudes
    for (int64_t i = 0; i < kQ4KBlock; ++i) {
      float v = normal(gen) * spread;
      if (uniform(gen) < 0.01f) v *= 8.0f;  // outliers, as real weights have
      x[static_cast<size_t>(b * kQ4KBlock + i)] = v;
    }
  }
  const std::vector<float> ours = quantised_round_trip(x), plain = min_max_round_trip(x);
  double norm = 0;
  for (float v : x) norm += double{v} * v;
  norm = std::sqrt(norm / static_cast<double>(n));
  // Block by block, each block's error relative to its own size (600 seeds: ours / min-max 0.883
  // to 0.919, median 0.902). Compared over all weights at once instead, the few largest blocks of
  // the log-normal spread decide alone, and the ratio wandered from 0.82 to 0.985 (seed 2329361615
  // missed a 0.98 bar).
  EXPECT_LT(block_relative_rms(x, ours), 0.95 * block_relative_rms(x, plain))
      << "ours " << block_relative_rms(x, ours) << ", min/max " << block_relative_rms(x, plain);
  // About a tenth of the signal (0.1 was exceeded by 1 seed in 400: blocks of log-normal spread
  // with outliers): a sanity bound; the comparison above is the test.
  EXPECT_LT(rms(x, ours), 0.125 * norm);
  // Edge blocks: zeros; a constant negative and a constant positive block; all positive (the min
  // clamps at 0); one sub-block 1000× the others.
  std::vector<float> e(static_cast<size_t>(5 * kQ4KBlock), 0.0f);
  for (int i = 0; i < kQ4KBlock; ++i) {
    e[static_cast<size_t>(kQ4KBlock + i)] = i < 128 ? -0.75f : 0.5f;
    e[static_cast<size_t>(2 * kQ4KBlock + i)] = 1.0f + uniform(gen);
    e[static_cast<size_t>(3 * kQ4KBlock + i)] = normal(gen) * (i < 32 ? 1000.0f : 1.0f);
    e[static_cast<size_t>(4 * kQ4KBlock + i)] = -uniform(gen);
  }
  const std::vector<float> r = quantised_round_trip(e);
  for (int i = 0; i < kQ4KBlock; ++i) EXPECT_EQ(r[static_cast<size_t>(i)], 0.0f);
  for (int i = 0; i < kQ4KBlock; ++i) {
    const size_t k = static_cast<size_t>(kQ4KBlock + i);
    EXPECT_NEAR(r[k], e[k], 0.01) << i;  // each half constant: exact up to the 6-bit, f16 coefficients
    const size_t p = static_cast<size_t>(2 * kQ4KBlock + i);
    // values in [1, 2): the range from 0 in 15 steps of 2/15; the search for the least squared
    // error may clip the largest by up to a step (0.104 seen, 7 seeds in 400)
    EXPECT_NEAR(r[p], e[p], 2.0 / 15) << i;
    const size_t m = static_cast<size_t>(4 * kQ4KBlock + i);
    EXPECT_NEAR(r[m], e[m], 1.0 / 15) << i;
  }
  // One sub-block 1000× the others: 6-bit scales relative to the block's largest leave the small
  // ones (std 1) a step of about 6, so they may read as their best constant, never worse than 0.
  // The large one: within half of its own step (its range over 15) in RMS; rounding to the nearest
  // level gives about 0.29 of a step, clipping an extreme a step at most. (A fixed bound of 100, a
  // tenth of the std, failed for 4 seeds in 1500: 32 normal values span 3.5 to 7 std.)
  double big = 0, small = 0, small_norm = 0, lo = INFINITY, hi = -INFINITY;
  for (int i = 0; i < kQ4KBlock; ++i) {
    const size_t k = static_cast<size_t>(3 * kQ4KBlock + i);
    (i < 32 ? big : small) += (double{r[k]} - e[k]) * (double{r[k]} - e[k]);
    if (i >= 32) small_norm += double{e[k]} * e[k];
    if (i < 32) lo = std::min(lo, double{e[k]}), hi = std::max(hi, double{e[k]});
  }
  EXPECT_LE(small, small_norm) << "the small sub-blocks";
  EXPECT_LT(std::sqrt(big / 32), 0.5 * (hi - lo) / 15) << "the large sub-block, std 1000";
}

// The bytes written to a GGUF file dequantise, by the reader's own Q4_K code (io/gguf_load.cpp),
// to exactly dequantize_row_q4_k's values.
TEST(Q4_K, GgufReaderDequantisesOurBlocksToOurValues) {
  auto gen = test_rng();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor w({3, 2 * kQ4KBlock});
  for (int64_t i = 0; i < w.numel(); ++i) w.data()[i] = normal(gen) * (i % 97 == 0 ? 5.0f : 0.1f);
  std::vector<BlockQ4_K> q(static_cast<size_t>(w.numel() / kQ4KBlock));
  std::vector<float> want(static_cast<size_t>(w.numel()));
  kernels::quantize_row_q4_k(w.data(), w.numel(), q.data());
  kernels::dequantize_row_q4_k(q.data(), w.numel(), want.data());
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("mhsa_q4k_" + std::to_string(getpid()) + ".gguf");
  detail::GgufWriter writer;
  writer.add_tensor("w", w, detail::GgufType::q4_k);
  Tensor odd({2, 288});
  EXPECT_THROW(writer.add_tensor("odd", odd, detail::GgufType::q4_k), Error);  // rows of no whole block
  writer.write(path, true);
  const detail::GgufFile f = detail::GgufFile::open(path);
  const detail::GgufTensorInfo* t = f.find("w");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(detail::gguf_type_name(t->type), "Q4_K");
  EXPECT_EQ(std::memcmp(f.data(*t).data(), q.data(), q.size() * sizeof(BlockQ4_K)), 0);
  const Tensor got = f.load(*t);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
  std::filesystem::remove(path);
}

// The kernels' order of quants (kernels/q4_k.h) holds the same quants as ggml's where the header
// says, leaves d, dmin and the scales alone, dequantises to the same values, and goes back.
TEST(Q4_K, KernelOrderIsTheStatedPermutationOfGgmls) {
  auto gen = test_rng();
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<BlockQ4_K> ggml(3);
  for (BlockQ4_K& b : ggml) {
    auto* p = reinterpret_cast<uint8_t*>(&b);
    for (size_t i = 0; i < sizeof(BlockQ4_K); ++i) p[i] = static_cast<uint8_t>(byte(gen));
    b.d = 0x3c00 ^ static_cast<uint16_t>(byte(gen));  // finite f16 scales
    b.dmin = 0x3800 ^ static_cast<uint16_t>(byte(gen));
  }
  std::vector<BlockQ4_K> ours = ggml;
  kernels::interleave_q4_k(ours.data(), 3);
  const auto quant = [](const BlockQ4_K& b, int k) {  // ggml's k-th quant of a block
    return (b.qs[32 * (k / 64) + k % 32] >> (4 * (k % 64 / 32))) & 15;
  };
  for (size_t i = 0; i < ggml.size(); ++i) {
    EXPECT_EQ(std::memcmp(&ours[i], &ggml[i], offsetof(BlockQ4_K, qs)), 0) << "d, dmin, scales unchanged";
    for (int c = 0; c < 4; ++c)
      for (int s = 0; s < 8; ++s)
        for (int u = 0; u < 4; ++u) {
          const int byte_at = ours[i].qs[32 * c + 4 * s + u];
          ASSERT_EQ(byte_at & 15, quant(ggml[i], 32 * s + 8 * c + u)) << "block " << i << " c " << c << " s " << s;
          ASSERT_EQ(byte_at >> 4, quant(ggml[i], 32 * s + 8 * c + 4 + u)) << "block " << i << " c " << c << " s " << s;
        }
  }
  std::vector<float> want(3 * kQ4KBlock), got(3 * kQ4KBlock);
  kernels::dequantize_row_q4_k(ggml.data(), 3 * kQ4KBlock, want.data());
  kernels::dequantize_row_q4_k_interleaved(ours.data(), 3 * kQ4KBlock, got.data());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
  kernels::deinterleave_q4_k(ours.data(), 3);
  EXPECT_EQ(std::memcmp(ours.data(), ggml.data(), ggml.size() * sizeof(BlockQ4_K)), 0) << "and back";
}

// ---- kernels ---------------------------------------------------------------------------------

using Operands = QuantOperands<Q4KFormat>;

Operands make(std::mt19937_64& gen, int64_t M, int64_t N, int64_t K) {
  return make_operands<Q4KFormat>(gen, M, N, K, true);
}

// Sub-block s of B row j's block b against A row i: the exact Σ q·qa and Σ qa, and the
// dequantiser's scale = d·sc and offset = dmin·m.
struct SubBlock {
  int32_t dot = 0, sum = 0;
  float scale, offset, da;
};
SubBlock sub_block(const Operands& o, const QuantizedA& a, int64_t i, int64_t j, int64_t b, int s) {
  BlockQ4_K blk = o.b[j * o.ldb + b];
  kernels::deinterleave_q4_k(&blk, 1);  // ggml's order: weight 32s + l in byte 32·(s/2) + l
  int sc, m;
  kernels::q4_k_scale_min(blk, s, &sc, &m);
  SubBlock r;
  r.scale = kernels::f16_to_float(blk.d) * static_cast<float>(sc);
  r.offset = kernels::f16_to_float(blk.dmin) * static_cast<float>(m);
  r.da = a.d[i * (o.K / kQ8Block) + b * 8 + s];
  for (int l = 0; l < 32; ++l) {
    const int32_t x = a.q[i * o.K + b * kQ4KBlock + 32 * s + l];
    r.dot += x * ((blk.qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 15);
    r.sum += x;
  }
  return r;
}

// The streams' chain for C[i, j] as matmul_q4_k.cpp states it, written out in scalar float: lane
// s the sub-block, per block fma(scale·dA, Σ q·qa) then fma(−offset, dA·Σqa) (with fused false,
// products and sums), and the fixed 8-lane tree.
float chain(const Operands& o, const QuantizedA& a, int64_t i, int64_t j, bool fused) {
  float acc[8] = {};
  for (int64_t b = 0; b < o.K / kQ4KBlock; ++b)
    for (int s = 0; s < 8; ++s) {
      const SubBlock t = sub_block(o, a, i, j, b, s);
      const float p = t.scale * t.da, am = t.da * static_cast<float>(t.sum);
      if (fused) {
        acc[s] = std::fma(p, static_cast<float>(t.dot), acc[s]);
        acc[s] = std::fma(-t.offset, am, acc[s]);
      } else {
        const volatile float x = p * static_cast<float>(t.dot);
        acc[s] = x + acc[s];
        const volatile float y = -t.offset * am;
        acc[s] = y + acc[s];
      }
    }
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// The streams' error bound against their float64 twin: each lane's chain of 2·nb FMAs (2
// roundings each without FMA), the products scale·dA and dA·Σqa, the tree:
// 2·(2·nb + 5)·2⁻²⁴ · Σ |dA|·(|scale·Σ q·qa| + |offset·Σ qa|).
double chain_bound(const Operands& o, const QuantizedA& a, int64_t i, int64_t j) {
  const int64_t nb = o.K / kQ4KBlock;
  double sum = 0;
  for (int64_t b = 0; b < nb; ++b)
    for (int s = 0; s < 8; ++s) {
      const SubBlock t = sub_block(o, a, i, j, b, s);
      sum += std::abs(double{t.da}) * (std::abs(double{t.scale} * t.dot) + std::abs(double{t.offset} * t.sum));
    }
  return 2.0 * static_cast<double>(2 * nb + 5) * std::ldexp(1.0, -24) * sum;
}

TEST(Q4_KKernels, MatchTheReferenceAndGemmIsTheFloatGemmOnDequantisedWeights) {
  auto gen = test_rng();
  for (int64_t M : {1, 2, 3, 17})  // 17: four passes of 4 rows and one of 1
    for (int64_t K : {256, 768, 2304})
      for (int64_t N : {1, 7, 61, 133}) {
        const Operands o = make(gen, M, N, K);
        const QuantizedA qa = quantize_a(o);
        const int64_t ldc = N + 2, ldw = o.ldb * kQ4KBlock;
        std::vector<float> ref(static_cast<size_t>(M * ldc), 0.0f), gemm_ref(ref.size(), 0.0f);
        std::vector<float> fused(ref.size(), 0.0f), unfused(ref.size(), 0.0f);
        kernels::matmul_bt_q4_k_ref(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, ref.data(), ldc);
        kernels::gemm_bt_q4_k_ref(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, gemm_ref.data(), ldc);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            fused[i * ldc + j] = chain(o, qa, i, j, true);
            unfused[i * ldc + j] = chain(o, qa, i, j, false);
          }
        // The twin holds the quantised A: near the float product (activation quantisation moves a
        // dot product by ~0.3% of its scale, as for Q8_0).
        EXPECT_LE(scaled_error(o, ref, gemm_ref, ldc), 0.01) << "M=" << M << " K=" << K << " N=" << N;
        std::vector<float> first;  // the first ISA with FMA's result: every other one's bits
        for (cpu::Isa isa : cpu::usable_isas()) {
          const kernels::KernelTable& k = kernels::kernels_for(isa);
          std::vector<float> got(ref.size(), 0.0f), packed(ref.size(), 0.0f), packed_wide(ref.size(), 0.0f);
          k.matmul_bt_q4_k(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, got.data(), ldc);
          k.gemm_bt_q4_k(M, N, K, o.a.data(), o.lda, o.b.data(), o.ldb, packed.data(), ldc);
          k.gemm_ex(M, N, K, o.a.data(), o.lda, false, o.b_wide.data(), ldw, true, packed_wide.data(), ldc, false);
          const std::string what = std::string(cpu::isa_name(isa)) + " M=" + std::to_string(M) +
                                   " K=" + std::to_string(K) + " N=" + std::to_string(N);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j)
              ASSERT_LE(std::abs(double{got[i * ldc + j]} - ref[i * ldc + j]), chain_bound(o, qa, i, j))
                  << what << " i=" << i << " j=" << j;
          // The stated chain, bit for bit: fused on every ISA with FMA; the portable build fuses
          // where its target has FMA (aarch64), not on x86-64's baseline.
          if (isa == cpu::Isa::portable) {
            EXPECT_TRUE(same_bits(got, fused) || same_bits(got, unfused)) << what;
          } else {
            EXPECT_TRUE(same_bits(got, fused)) << what;
            if (first.empty()) first = got;
            EXPECT_TRUE(same_bits(got, first)) << what << ": ISAs differ";
          }
          EXPECT_LE(scaled_error(o, packed, gemm_ref, ldc), 4e-7 * std::sqrt(double(K))) << what;
          EXPECT_TRUE(same_bits(packed, packed_wide)) << what << ": gemm_bt_q4_k vs gemm_ex on the dequantised B";
        }
      }
}

// A row holding a NaN or an inf gives NaN in every output of that row (as the float product of
// any weight with it would be NaN or ±inf), the other rows untouched; a block of A too small for
// a normal scale counts as zero.
TEST(Q4_KKernels, NonFiniteActivationsGiveNaNRows) {
  auto gen = test_rng();
  Operands o = make(gen, 4, 9, 512);
  const std::vector<float> clean = o.a;
  o.a[1 * o.lda + 300] = std::numeric_limits<float>::quiet_NaN();
  o.a[2 * o.lda + 7] = -std::numeric_limits<float>::infinity();
  for (int64_t k = 0; k < 32; ++k) o.a[3 * o.lda + 64 + k] = std::ldexp(o.a[3 * o.lda + 64 + k], -130);
  Operands zeroed = o;
  for (int64_t k = 0; k < 32; ++k) zeroed.a[3 * o.lda + 64 + k] = 0.0f;
  for (cpu::Isa isa : cpu::usable_isas()) {
    const kernels::KernelTable& k = kernels::kernels_for(isa);
    std::vector<float> c(static_cast<size_t>(4 * 9)), want(c.size());
    k.matmul_bt_q4_k(4, 9, 512, o.a.data(), o.lda, o.b.data(), o.ldb, c.data(), 9);
    k.matmul_bt_q4_k(4, 9, 512, zeroed.a.data(), o.lda, o.b.data(), o.ldb, want.data(), 9);
    for (int64_t j = 0; j < 9; ++j) {
      EXPECT_TRUE(std::isfinite(c[j])) << cpu::isa_name(isa) << " clean row, column " << j;
      EXPECT_TRUE(std::isnan(c[9 + j])) << cpu::isa_name(isa) << " NaN row, column " << j;
      EXPECT_TRUE(std::isnan(c[18 + j])) << cpu::isa_name(isa) << " inf row, column " << j;
      EXPECT_EQ(c[27 + j], want[27 + j]) << cpu::isa_name(isa) << " tiny block, column " << j;
    }
    std::vector<float> row(9);
    k.matmul_bt_q4_k(1, 9, 512, clean.data(), o.lda, o.b.data(), o.ldb, row.data(), 9);
    EXPECT_TRUE(same_bits(row, std::vector<float>(c.begin(), c.begin() + 9))) << cpu::isa_name(isa);
  }
}

TEST(Q4_KKernels, PartsAreOneCallEachAndEveryResultIsTheSameForAnyThreadCount) {
  auto gen = test_rng();
  const int saved = omp_get_max_threads();
  for (int64_t M : {1, 3}) {
    const int64_t K = 512, ldc = 61 + 261 + 1;
    const Operands q = make(gen, M, 61, K), kv = make(gen, M, 261, K), one = make(gen, M, 1, K);
    const Operands big = make(gen, 17, 133, 768);
    for (cpu::Isa isa : cpu::usable_isas()) {
      const kernels::KernelTable& k = kernels::kernels_for(isa);
      std::vector<std::vector<float>> parts_out, single_out, gemm_out;
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        std::vector<float> c(static_cast<size_t>(M * ldc), 0.0f);  // [M, q | kv | one]
        const kernels::BtPartQ4K parts[] = {{q.b.data(), q.ldb, 61, c.data(), ldc},
                                            {kv.b.data(), kv.ldb, 261, c.data() + 61, ldc},
                                            {one.b.data(), one.ldb, 1, c.data() + 61 + 261, ldc}};
        k.matmul_bt_parts_q4_k(M, K, q.a.data(), q.lda, parts, 3);
        parts_out.push_back(c);
        std::vector<float> s(c.size(), 0.0f);
        k.matmul_bt_q4_k(M, 61, K, q.a.data(), q.lda, q.b.data(), q.ldb, s.data(), ldc);
        k.matmul_bt_q4_k(M, 261, K, q.a.data(), q.lda, kv.b.data(), kv.ldb, s.data() + 61, ldc);
        k.matmul_bt_q4_k(M, 1, K, q.a.data(), q.lda, one.b.data(), one.ldb, s.data() + 61 + 261, ldc);
        single_out.push_back(s);
        std::vector<float> g(static_cast<size_t>(17 * 133), 0.0f);
        k.gemm_bt_q4_k(17, 133, 768, big.a.data(), big.lda, big.b.data(), big.ldb, g.data(), 133);
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

// One row of A against a group of B rows (the decode path) and the same rows as rows of a taller
// A: every C element is one chain whatever the grouping.
TEST(Q4_KKernels, GroupingDoesNotChangeBits) {
  auto gen = test_rng();
  const Operands o = make(gen, 5, 9, 512);
  for (cpu::Isa isa : cpu::usable_isas()) {
    const kernels::KernelTable& k = kernels::kernels_for(isa);
    std::vector<float> all(static_cast<size_t>(5 * 9)), row(all.size());
    k.matmul_bt_q4_k(5, 9, 512, o.a.data(), o.lda, o.b.data(), o.ldb, all.data(), 9);
    for (int64_t i = 0; i < 5; ++i)
      k.matmul_bt_q4_k(1, 9, 512, o.a.data() + i * o.lda, o.lda, o.b.data(), o.ldb, row.data() + i * 9, 9);
    EXPECT_TRUE(same_bits(all, row)) << cpu::isa_name(isa);
  }
}

// ---- models ----------------------------------------------------------------------------------

// m [out, in] replaced by its round trip through Q4_K (q4) or Q8_0 along its rows.
void round_trip_rows(Tensor& m, bool q4) {
  const int64_t cols = m.dim(1);
  for (int64_t r = 0; r < m.dim(0); ++r) {
    float* row = m.data() + r * cols;
    if (q4) {
      std::vector<BlockQ4_K> b(static_cast<size_t>(cols / kQ4KBlock));
      kernels::quantize_row_q4_k(row, cols, b.data());
      kernels::dequantize_row_q4_k(b.data(), cols, row);
    } else {
      std::vector<kernels::BlockQ8_0> b(static_cast<size_t>(cols / kernels::kQ8Block));
      kernels::quantize_row_q8_0(row, cols, b.data());
      kernels::dequantize_row_q8_0(b.data(), cols, row);
    }
  }
}

// kept_q8: the matrices kept as Q8_0 (the output matrix, rows not of whole 256-weight blocks).
void check_family(const nlohmann::json& config, const std::vector<std::string>& kept_q8) {
  auto gen = test_rng();
  const SavedModel saved(config, gen());
  const Model q4 = Model::load(saved.dir, WeightType::q4_k);
  Model dequantised = Model::load(saved.dir);
  EXPECT_EQ(q4.weight_type(), WeightType::q4_k);
  const bool gpt2 = q4.family() == Family::gpt2;
  int64_t quantised = 0;
  for (auto& [name, t] : dequantised.parameters()) {
    const Tensor* q = q4.parameter(name);
    ASSERT_NE(q, nullptr) << name;
    if (t->shape().size() != 2 || name == "wpe.weight") {
      EXPECT_EQ(q->shape(), t->shape()) << name << " stays float32";
      continue;
    }
    EXPECT_FALSE(q->defined()) << name << " lives in Q4_K or Q8_0 storage";
    const bool as_q8 = std::find(kept_q8.begin(), kept_q8.end(), name) != kept_q8.end();
    const bool transposed = gpt2 && name != "wte.weight";
    Tensor m = transposed ? nn::transposed(t->data(), t->dim(0), t->dim(1), t->dim(1)) : *t;  // [out, in]
    round_trip_rows(m, !as_q8);
    *t = transposed ? nn::transposed(m.data(), m.dim(0), m.dim(1), m.dim(1)) : m;
    quantised += !as_q8;
  }
  EXPECT_GT(quantised, 2);
  // The decode streams (Q4_K, and the Q8_0 output matrix and odd rows) quantise their activations
  // per block: the Q8_0 models' bound (test_q8_0_kernels.cpp), not bf16's 1e-5.
  expect_same_as_float_model(q4, dequantised, gen, 1.5e-2);
}

const nlohmann::json kGpt2 = {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"vocab_size", 97},
                              {"n_embd", 256}, {"n_layer", 2}, {"n_head", 4}, {"n_positions", 64}};
// intermediate_size 288: down_proj's rows are no whole Q4_K block (Q8_0 instead); an untied head.
const nlohmann::json kLlama = {{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}},
                               {"vocab_size", 101}, {"hidden_size", 256}, {"intermediate_size", 288},
                               {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                               {"max_position_embeddings", 64}, {"tie_word_embeddings", false}};

TEST(Q4_KModel, Gpt2MatchesTheFloatModelOnDequantisedWeights) { check_family(kGpt2, {"wte.weight"}); }

TEST(Q4_KModel, LlamaMatchesTheFloatModelOnDequantisedWeights) {
  check_family(kLlama, {"lm_head.weight", "model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"});
}

TEST(Q4_KModel, NonFiniteWeightsAreRefusedByName) {
  const SavedModel saved(kGpt2, test_rng()(), "h.1.mlp.c_fc.weight");
  try {
    (void)Model::load(saved.dir, WeightType::q4_k);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("h.1.mlp.c_fc.weight"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_weight_type("q4_k", "--dtype"), WeightType::q4_k);
  EXPECT_EQ(weight_type_name(WeightType::q4_k), "q4_k");
}

// A q4_k GGUF file: Q4_K matrices, the output matrix and odd rows Q8_0; loaded as q4_k it keeps
// the stored blocks, which are the ones quantising at load makes (Llama's q/k rows un-permuted):
// the same logits bit for bit.
TEST(Q4_KGguf, FilesKeepTheirBlocksAndGiveTheLogitsOfQuantisingAtLoad) {
  auto gen = test_rng();
  for (const nlohmann::json& config : {kGpt2, kLlama}) {
    const SavedModel saved(config, gen());
    const std::filesystem::path file = saved.dir / "m.gguf";
    detail::save_gguf(Model::load(saved.dir), file, detail::GgufType::q4_k, false);
    const detail::GgufFile f = detail::GgufFile::open(file);
    const bool gpt2 = config["model_type"] == "gpt2";
    EXPECT_EQ(detail::gguf_type_name(f.find("blk.0.attn_q.weight") ? f.find("blk.0.attn_q.weight")->type
                                                                   : f.find("blk.0.attn_qkv.weight")->type),
              "Q4_K");
    EXPECT_EQ(detail::gguf_type_name(f.find(gpt2 ? "token_embd.weight" : "output.weight")->type), "Q8_0");
    if (!gpt2) {
      EXPECT_EQ(detail::gguf_type_name(f.find("token_embd.weight")->type), "Q4_K");
      EXPECT_EQ(detail::gguf_type_name(f.find("blk.1.ffn_down.weight")->type), "Q8_0");
    }
    const Model from_file = Model::load(file, WeightType::q4_k), at_load = Model::load(saved.dir, WeightType::q4_k);
    for (int64_t T : {1, 7}) {
      std::vector<int32_t> ids(static_cast<size_t>(2 * T));
      for (auto& i : ids) i = static_cast<int32_t>(gen() % 97);
      const Tensor a = from_file.forward(ids, 2, T), b = at_load.forward(ids, 2, T);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), static_cast<size_t>(a.numel()) * sizeof(float)), 0)
          << config["model_type"] << " T=" << T;
    }
  }
}

}  // namespace
}  // namespace mhsa::test
