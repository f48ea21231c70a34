// tests/cpp/test_gemm.cpp — every ISA's GEMM against the float64 reference GEMM: odd shapes around
// the block sizes (kMR 6/12, kNR 8/16/32, kKC 256, kMC 24/48, kNCP 16 panels, 256 rows in place),
// leading dimensions wider than the rows, B as a column block of a wider matrix, null bias, zero
// sizes, and bitwise determinism across thread counts and across how C is cut into calls.
#include <omp.h>

#include <cstring>

#include "kernels/dispatch.h"
#include "kernels/gemm.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

struct Case {
  int64_t M, N, K;
  int64_t lda_pad = 0, ldb_pad = 0, ldc_pad = 0;  // extra elements after each row
  int64_t b_col = 0;                              // B starts at this column of its storage
  bool bias = true;
};

// Inputs of a case, in storage with the case's leading dimensions; C's padding is NaN.
struct Operands {
  int64_t lda, ldb, ldc;
  Tensor a, b, bias;  // [M, lda], [K, ldb], [N]
  const float* b_data() const { return b.data() + b_col; }
  int64_t b_col;
};
Operands make_operands(std::mt19937_64& gen, const Case& c) {
  Operands o{c.K + c.lda_pad, c.b_col + c.N + c.ldb_pad, c.N + c.ldc_pad,
             random_tensor(gen, {std::max<int64_t>(c.M, 1), c.K + c.lda_pad}),
             random_tensor(gen, {std::max<int64_t>(c.K, 1), c.b_col + c.N + c.ldb_pad}),
             random_tensor(gen, {std::max<int64_t>(c.N, 1)}), c.b_col};
  return o;
}
std::vector<float> poisoned_c(const Case& c, int64_t ldc) {
  return std::vector<float>(static_cast<size_t>(std::max<int64_t>(c.M, 1) * ldc),
                            std::numeric_limits<float>::quiet_NaN());
}

std::string describe(cpu::Isa isa, const Case& c) {
  return std::string(cpu::isa_name(isa)) + " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) +
         " K=" + std::to_string(c.K) + " pads=" + std::to_string(c.lda_pad) + "," + std::to_string(c.ldb_pad) + "," +
         std::to_string(c.ldc_pad) + " b_col=" + std::to_string(c.b_col) + (c.bias ? "" : " no bias");
}

// The shapes: 1s, primes, and sizes just below, at and above every block size of every ISA.
std::vector<Case> shape_grid() {
  std::vector<Case> cases;
  for (int64_t M : {1, 5, 6, 7, 8, 12, 13, 97, 256, 257, 300})
    for (int64_t N : {1, 7, 31, 32, 33, 97})
      for (int64_t K : {1, 97, 255, 256, 257, 513}) cases.push_back({M, N, K});
  // Wide N: more than one kNCP block of panels (512 columns with AVX-512), in both paths.
  for (int64_t M : {13, 301}) cases.push_back({M, 1025, 97});
  cases.push_back({1024, 549, 300});
  // B's rows 1024 floats apart (4 KiB: all in one L1 set) and 64 apart (16 sets): the in-place
  // path copies a panel's block of B for the tiles after the first (fresh and long K blocks).
  for (int64_t M : {8, 13, 40, 200}) {
    cases.push_back({M, 40, 300, 0, 1024 - 40});
    cases.push_back({M, 64, 513});
  }
  return cases;
}

std::vector<float> abs_of(const Tensor& t) {
  std::vector<float> v(t.data(), t.data() + t.numel());
  for (float& x : v) x = std::fabs(x);
  return v;
}

// ||got − want|| / ||scale|| over the M × N block of row-major storage ldc apart (see below).
double scaled_error(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& scale,
                    int64_t M, int64_t N, int64_t ldc) {
  double err = 0.0, norm = 0.0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const double d = double(got[i * ldc + j]) - want[i * ldc + j];
      err += d * d;
      norm += double(scale[i * ldc + j]) * scale[i * ldc + j];
    }
  return std::sqrt(err / norm);
}

// Compares every ISA with the float64 reference. The error is measured against the scale of the
// terms, ||got - ref|| / || |A|·|B| + |bias| ||, not against ||A·B||: a single dot product can
// cancel to almost nothing (M = N = 1 makes that a coin toss), and no fp32 summation owes more than
// its terms' rounding. fp32 summation in order with random-sign errors gives about 2^-24 on that
// scale whatever K; the bound 4·2^-24·sqrt(K) leaves a margin that grows with K.
void expect_matches_reference(const Case& c, std::mt19937_64& gen) {
  const Operands o = make_operands(gen, c);
  const float* bias = c.bias ? o.bias.data() : nullptr;
  std::vector<float> want = poisoned_c(c, o.ldc), scale = poisoned_c(c, o.ldc);
  kernels::gemm_ref(c.M, c.N, c.K, o.a.data(), o.lda, o.b_data(), o.ldb, bias, want.data(), o.ldc);
  const std::vector<float> a_abs = abs_of(o.a), b_abs = abs_of(o.b), bias_abs = abs_of(o.bias);
  kernels::gemm_ref(c.M, c.N, c.K, a_abs.data(), o.lda, b_abs.data() + o.b_col, o.ldb,
                    c.bias ? bias_abs.data() : nullptr, scale.data(), o.ldc);
  const double tolerance = 4.0 * std::ldexp(1.0, -24) * std::sqrt(static_cast<double>(std::max<int64_t>(c.K, 1)));
  for (cpu::Isa isa : cpu::usable_isas()) {
    std::vector<float> got = poisoned_c(c, o.ldc);
    kernels::kernels_for(isa).gemm(c.M, c.N, c.K, o.a.data(), o.lda, o.b_data(), o.ldb, bias, got.data(), o.ldc);
    bool padding_untouched = true;
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = c.N; j < o.ldc; ++j) padding_untouched &= std::isnan(got[i * o.ldc + j]);
    EXPECT_LE(scaled_error(got, want, scale, c.M, c.N, o.ldc), tolerance) << describe(isa, c);
    EXPECT_TRUE(padding_untouched) << describe(isa, c) << ": wrote into C's padding";
  }
}

TEST(Gemm, EveryIsaMatchesTheReferenceOnOddShapes) {
  auto gen = test_rng();
  for (const Case& c : shape_grid()) expect_matches_reference(c, gen);
}

TEST(Gemm, LeadingDimensionsAndColumnBlocks) {
  auto gen = test_rng();
  for (int64_t M : {1, 8, 61, 300})
    for (int64_t N : {5, 64, 77})
      for (int64_t K : {3, 260}) {
        expect_matches_reference({M, N, K, 3, 5, 7}, gen);
        expect_matches_reference({M, N, K, 0, 0, 0, /*b_col=*/N, false}, gen);  // W_kv inside W_qkv
        expect_matches_reference({M, N, K, 16, 1, 0, /*b_col=*/1, true}, gen);
      }
}

TEST(Gemm, NullBias) {
  auto gen = test_rng();
  for (const Case& c : std::vector<Case>{{1, 33, 97, 0, 0, 0, 0, false}, {300, 97, 513, 0, 0, 0, 0, false}})
    expect_matches_reference(c, gen);
}

TEST(Gemm, ZeroSizes) {
  auto gen = test_rng();
  for (cpu::Isa isa : cpu::usable_isas()) {
    const auto gemm = kernels::kernels_for(isa).gemm;
    for (const Case& c : std::vector<Case>{{0, 5, 7}, {5, 0, 7}, {0, 0, 0}}) {
      std::vector<float> out(4, 42.0f);
      gemm(c.M, c.N, c.K, nullptr, std::max<int64_t>(c.K, 1), nullptr, std::max<int64_t>(c.N, 1), nullptr,
           out.data(), std::max<int64_t>(c.N, 1));
      EXPECT_EQ(out, std::vector<float>(4, 42.0f)) << describe(isa, c) << ": an empty C must stay untouched";
    }
    // K = 0: C = bias, or 0 without one.
    for (int64_t M : {1, 300}) {
      const Tensor bias = random_tensor(gen, {37});
      std::vector<float> c_bias(static_cast<size_t>(M * 40), 7.0f), c_zero(static_cast<size_t>(M * 40), 7.0f);
      gemm(M, 37, 0, nullptr, 1, nullptr, 37, bias.data(), c_bias.data(), 40);
      gemm(M, 37, 0, nullptr, 1, nullptr, 37, nullptr, c_zero.data(), 40);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < 37; ++j) {
          ASSERT_EQ(c_bias[i * 40 + j], bias.data()[j]) << cpu::isa_name(isa) << " M=" << M;
          ASSERT_EQ(c_zero[i * 40 + j], 0.0f) << cpu::isa_name(isa) << " M=" << M;
        }
    }
  }
}

bool bitwise_equal(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

TEST(Gemm, BitwiseIdenticalForAnyThreadCount) {
  auto gen = test_rng();
  const int saved = omp_get_max_threads();
  for (const Case& c : std::vector<Case>{{1, 2304, 768}, {8, 97, 513}, {200, 333, 300}, {301, 1025, 257}}) {
    const Operands o = make_operands(gen, c);
    for (cpu::Isa isa : cpu::usable_isas()) {
      std::vector<std::vector<float>> results;
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        results.push_back(poisoned_c(c, o.ldc));
        kernels::kernels_for(isa).gemm(c.M, c.N, c.K, o.a.data(), o.lda, o.b_data(), o.ldb, o.bias.data(),
                                       results.back().data(), o.ldc);
      }
      EXPECT_TRUE(bitwise_equal(results[0], results[1])) << describe(isa, c) << ": 1 vs 2 threads";
      EXPECT_TRUE(bitwise_equal(results[0], results[2])) << describe(isa, c) << ": 1 vs 3 threads";
    }
  }
  omp_set_num_threads(saved);
}

// B stored blocked (gemm.h): block_b and unblock_b are inverses, and gemm_blocked on the blocked B
// is gemm on B bit for bit, on every ISA, in every class of M (the stream up to 4 rows, the fresh
// in-place path up to 16 with K cut in parts, in place up to 256, packed beyond), at 1, 2 and 3
// threads, with and without bias, A's rows wider than K and C's than N (its padding untouched).
TEST(Gemm, BlockedBIsBitwiseGemm) {
  auto gen = test_rng();
  const int saved = omp_get_max_threads();
  for (int64_t K : {16, 48, 768})
    for (int64_t N : {32, 96, 2304}) {
      ASSERT_TRUE(kernels::can_block(K, N));
      const Tensor b = random_tensor(gen, {K, N});
      Tensor blocked({K, N}), back({K, N});
      kernels::block_b(K, N, b.data(), blocked.data());
      kernels::unblock_b(K, N, blocked.data(), back.data());
      ASSERT_EQ(std::memcmp(back.data(), b.data(), sizeof(float) * K * N), 0);
      EXPECT_NE(std::memcmp(blocked.data(), b.data(), sizeof(float) * K * N), 0);
      for (int64_t k = 0; k < K; ++k)  // the layout gemm.h describes
        for (int64_t j = 0; j < N; j += 7) ASSERT_EQ(blocked.data()[kernels::blocked_index(k, j, N)], b.data()[k * N + j]);
      Tensor in_place({K, N});
      std::memcpy(in_place.data(), b.data(), sizeof(float) * K * N);
      kernels::block_b_in_place(K, N, in_place.data());
      ASSERT_EQ(std::memcmp(in_place.data(), blocked.data(), sizeof(float) * K * N), 0);
      for (int64_t M : {1, 2, 3, 4, 5, 6, 8, 9, 12, 13, 15, 16, 17, 40, 256, 257, 300}) {
        if (N == 2304 && M > 40 && K == 768) continue;  // the packed path at this size: covered by N 96
        const Case c{M, N, K, 3, 0, 5};
        const Operands o = make_operands(gen, c);
        for (cpu::Isa isa : cpu::usable_isas())
          for (int threads : {1, 2, 3})
            for (bool with_bias : {true, false}) {
              omp_set_num_threads(threads);
              const float* bias = with_bias ? o.bias.data() : nullptr;
              std::vector<float> want = poisoned_c(c, o.ldc), got = poisoned_c(c, o.ldc);
              kernels::kernels_for(isa).gemm(M, N, K, o.a.data(), o.lda, b.data(), N, bias, want.data(), o.ldc);
              kernels::kernels_for(isa).gemm_blocked(M, N, K, o.a.data(), o.lda, blocked.data(), bias, got.data(),
                                                     o.ldc);
              EXPECT_TRUE(bitwise_equal(got, want)) << describe(isa, c) << " threads " << threads
                                                    << (with_bias ? "" : " no bias");
            }
      }
    }
  omp_set_num_threads(saved);
  EXPECT_FALSE(kernels::can_block(40, 64));   // K not a multiple of 16
  EXPECT_FALSE(kernels::can_block(64, 48));   // N not a multiple of 32
  EXPECT_FALSE(kernels::can_block(0, 64));
}

// Every element is the same fma chain whatever the blocking (gemm.cpp's header): C computed in one
// call equals C computed in row blocks and in column blocks of odd widths, bit for bit, in the
// small-M (M <= 16, blocked-chain), in-place (M <= 256) and packed paths. Row blocks stay in the
// regime of the whole call (M = 8: single rows; otherwise blocks of 20 rows).
TEST(Gemm, ElementsDoNotDependOnHowCIsCut) {
  auto gen = test_rng();
  // Within each class of M (<= 4 rows: K split in fixed parts; <= 16: fresh chains; more: one
  // chain) the order of every sum is fixed, so cutting C into row blocks of the same class or
  // into column blocks changes no bit.
  // (N = 600 at M = 3: more than one of the streamed path's column chunks.)
  // ({12, 100, 300} with B's rows 4 KiB apart: the whole call's second tile reads the first's copy
  // of B, the 6-row blocks read B itself.)
  for (const Case& c : std::vector<Case>{
           {3, 600, 300}, {12, 100, 300}, {12, 100, 300, 0, 1024 - 100}, {40, 100, 300}, {400, 100, 300}}) {
    const Operands o = make_operands(gen, c);
    for (cpu::Isa isa : cpu::usable_isas()) {
      const auto gemm = kernels::kernels_for(isa).gemm;
      std::vector<float> whole = poisoned_c(c, o.ldc), by_row = whole, by_col = whole;
      gemm(c.M, c.N, c.K, o.a.data(), o.lda, o.b_data(), o.ldb, o.bias.data(), whole.data(), o.ldc);
      const int64_t rows = c.M <= 4 ? 1 : c.M <= 16 ? 6 : 20;
      for (int64_t i = 0; i < c.M; i += rows)
        gemm(rows, c.N, c.K, o.a.data() + i * o.lda, o.lda, o.b_data(), o.ldb, o.bias.data(),
             by_row.data() + i * o.ldc, o.ldc);
      for (int64_t j = 0; j < c.N; j += 23) {
        const int64_t n = std::min<int64_t>(23, c.N - j);
        gemm(c.M, n, c.K, o.a.data(), o.lda, o.b_data() + j, o.ldb, o.bias.data() + j, by_col.data() + j, o.ldc);
      }
      EXPECT_TRUE(bitwise_equal(whole, by_row)) << describe(isa, c) << ": whole vs row blocks";
      EXPECT_TRUE(bitwise_equal(whole, by_col)) << describe(isa, c) << ": whole vs column blocks";
    }
  }
}

// gemm_in_place cuts M rows into tiles of kMR rows and a shorter last one (8 rows on AVX2: 6 + 2;
// 13: 6 + 6 + 1), so a row's tile differs between calls of different M in the same class (5..16
// rows: fresh chains). Its bits must not: the first M rows of a 16-row call (tiles 6 + 6 + 4 on
// AVX2, 12 + 4 on AVX-512) equal the M-row call, with B's rows apart by N + 7 floats and by 4 KiB
// (the tiles after the first read the first's copy of B). Guards any change of the tiling.
TEST(Gemm, RowsDoNotDependOnTheirTileInTheFreshClass) {
  auto gen = test_rng();
  for (int64_t M : {5, 7, 8, 10, 13})
    for (int64_t ldb_pad : {7, 1024 - 100}) {
      const Case whole_case{16, 100, 300, 0, ldb_pad};
      const Operands o = make_operands(gen, whole_case);
      const Case c{M, 100, 300, 0, ldb_pad};
      for (cpu::Isa isa : cpu::usable_isas()) {
        const auto gemm = kernels::kernels_for(isa).gemm;
        std::vector<float> sixteen = poisoned_c(whole_case, o.ldc), part = poisoned_c(c, o.ldc);
        gemm(16, c.N, c.K, o.a.data(), o.lda, o.b_data(), o.ldb, o.bias.data(), sixteen.data(), o.ldc);
        gemm(M, c.N, c.K, o.a.data(), o.lda, o.b_data(), o.ldb, o.bias.data(), part.data(), o.ldc);
        sixteen.resize(part.size());
        EXPECT_TRUE(bitwise_equal(sixteen, part)) << describe(isa, c) << ": " << M << " rows alone vs inside 16";
      }
    }
}

// gemm_ex: op(A)·op(B) with either operand stored transposed, optionally added to C, against the
// float64 reference on explicit transposes (C's start value playing the bias), on odd shapes, with
// leading dimensions wider than the stored rows; and bitwise the same for any thread count.
struct ExCase {
  int64_t M, N, K;
  bool trans_a, trans_b, accumulate;
};
struct ExOperands {
  int64_t lda, ldb, ldc;
  Tensor a, b, c0;  // stored as the case says: a [M|K, lda], b [K|N, ldb], c0 [M, ldc]
};
ExOperands make_ex_operands(std::mt19937_64& gen, const ExCase& c) {
  const int64_t a_rows = c.trans_a ? c.K : c.M, a_cols = c.trans_a ? c.M : c.K;
  const int64_t b_rows = c.trans_b ? c.N : c.K, b_cols = c.trans_b ? c.K : c.N;
  return {a_cols + 3, b_cols + 5, c.N + 2, random_tensor(gen, {std::max<int64_t>(a_rows, 1), a_cols + 3}),
          random_tensor(gen, {std::max<int64_t>(b_rows, 1), b_cols + 5}),
          random_tensor(gen, {std::max<int64_t>(c.M, 1), c.N + 2})};
}
// op(X) as a plain row-major [rows, cols] copy
std::vector<float> op_of(const Tensor& x, int64_t ld, bool trans, int64_t rows, int64_t cols, bool absolute) {
  std::vector<float> out(static_cast<size_t>(std::max<int64_t>(rows * cols, 1)));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const float v = trans ? x.data()[j * ld + i] : x.data()[i * ld + j];
      out[static_cast<size_t>(i * cols + j)] = absolute ? std::fabs(v) : v;
    }
  return out;
}

TEST(GemmEx, TransposedOperandsAndAccumulationMatchTheReference) {
  auto gen = test_rng();
  std::vector<ExCase> cases;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (int acc = 0; acc < 2; ++acc)
        for (int64_t M : {1, 13, 97, 300})
          for (int64_t N : {1, 33, 97})
            for (int64_t K : {1, 97, 257}) cases.push_back({M, N, K, ta == 1, tb == 1, acc == 1});
  cases.push_back({1025, 768, 256, true, false, true});  // dW += Xᵀ·dY at a GPT-2 shape
  cases.push_back({256, 1030, 768, false, true, false});  // dX = dY·Wᵀ
  cases.push_back({50, 8, 40000, true, false, true});  // a K past what gemm_packed keeps packed per thread
  cases.push_back({50, 8, 40000, false, true, false});
  for (const ExCase& c : cases) {
    const ExOperands o = make_ex_operands(gen, c);
    const auto a = op_of(o.a, o.lda, c.trans_a, c.M, c.K, false), b = op_of(o.b, o.ldb, c.trans_b, c.K, c.N, false);
    const auto a_abs = op_of(o.a, o.lda, c.trans_a, c.M, c.K, true), b_abs = op_of(o.b, o.ldb, c.trans_b, c.K, c.N, true);
    std::vector<float> want(static_cast<size_t>(c.M * o.ldc)), scale = want;
    for (int64_t i = 0; i < c.M; ++i) {  // C's start as a per-row bias: one reference call per row
      std::vector<float> start(o.c0.data() + i * o.ldc, o.c0.data() + i * o.ldc + c.N), start_abs = start;
      for (float& x : start_abs) x = std::fabs(x);
      kernels::gemm_ref(1, c.N, c.K, a.data() + i * c.K, c.K, b.data(), c.N, c.accumulate ? start.data() : nullptr,
                        want.data() + i * o.ldc, o.ldc);
      kernels::gemm_ref(1, c.N, c.K, a_abs.data() + i * c.K, c.K, b_abs.data(), c.N,
                        c.accumulate ? start_abs.data() : nullptr, scale.data() + i * o.ldc, o.ldc);
    }
    const double tolerance = 4.0 * std::ldexp(1.0, -24) * std::sqrt(static_cast<double>(c.K + 1));
    const std::string what = " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                             " trans_a=" + std::to_string(c.trans_a) + " trans_b=" + std::to_string(c.trans_b) +
                             " accumulate=" + std::to_string(c.accumulate);
    for (cpu::Isa isa : cpu::usable_isas()) {
      std::vector<float> got(o.c0.data(), o.c0.data() + c.M * o.ldc);
      kernels::kernels_for(isa).gemm_ex(c.M, c.N, c.K, o.a.data(), o.lda, c.trans_a, o.b.data(), o.ldb, c.trans_b,
                                        got.data(), o.ldc, c.accumulate);
      bool padding_untouched = true;
      for (int64_t i = 0; i < c.M; ++i)
        for (int64_t j = c.N; j < o.ldc; ++j) padding_untouched &= got[i * o.ldc + j] == o.c0.data()[i * o.ldc + j];
      EXPECT_LE(scaled_error(got, want, scale, c.M, c.N, o.ldc), tolerance) << cpu::isa_name(isa) << what;
      EXPECT_TRUE(padding_untouched) << cpu::isa_name(isa) << what << ": wrote into C's padding";
    }
  }
}

TEST(GemmEx, BitwiseIdenticalForAnyThreadCount) {
  auto gen = test_rng();
  const int saved = omp_get_max_threads();
  for (const ExCase& c : std::vector<ExCase>{{301, 1025, 257, true, false, true}, {200, 333, 300, false, true, false},
                                             {97, 50, 513, true, true, true},
                                             {50, 8, 40000, true, false, true}}) {
    const ExOperands o = make_ex_operands(gen, c);
    for (cpu::Isa isa : cpu::usable_isas()) {
      std::vector<std::vector<float>> results;
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        results.emplace_back(o.c0.data(), o.c0.data() + c.M * o.ldc);
        kernels::kernels_for(isa).gemm_ex(c.M, c.N, c.K, o.a.data(), o.lda, c.trans_a, o.b.data(), o.ldb, c.trans_b,
                                          results.back().data(), o.ldc, c.accumulate);
      }
      EXPECT_TRUE(bitwise_equal(results[0], results[1])) << cpu::isa_name(isa) << " M=" << c.M << ": 1 vs 2 threads";
      EXPECT_TRUE(bitwise_equal(results[0], results[2])) << cpu::isa_name(isa) << " M=" << c.M << ": 1 vs 3 threads";
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace mhsa::test
