// tests/cpp/test_q8_0_kernels.cpp — the kernels over Q8_0 weights (dispatch.h's matmul_bt_q8_0,
// matmul_bt_parts_q8_0, gemm_bt_q8_0) on every usable ISA: against the float64 twin on odd M and
// N and K from one block to thousands, gemm_bt_q8_0 bitwise gemm_ex on the dequantised B, the
// parts bitwise one call each, and every result bitwise identical for 1, 2 and 3 threads.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/dispatch.h"
#include "kernels/q8_0.h"
#include "test_util.h"

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

}  // namespace
}  // namespace mhsa::test
