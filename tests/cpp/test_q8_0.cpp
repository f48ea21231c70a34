// tests/cpp/test_q8_0.cpp — the scalar formats under quantised and 16-bit files: f16 conversions
// (kernels/half.h) over every one of the 65,536 f16 values and against the hardware-independent
// float64 definition of nearest-even rounding, and the Q8_0 block quantiser (kernels/q8_0.h):
// per-element error within half a quantisation step, the scale's definition, zero blocks,
// and quantise(dequantise(q)) = q (what a GGUF round trip relies on).
#include <cmath>
#include <limits>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/half.h"
#include "kernels/q8_0.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

using kernels::BlockQ8_0;
using kernels::f16_to_float;
using kernels::float_to_f16;

TEST(Half, EveryF16WidensAndNarrowsBack) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f)))) << h;
      continue;
    }
    ASSERT_EQ(float_to_f16(f), h) << "f16 0x" << std::hex << h;
  }
  // The value of a few by definition: 1, the largest, the smallest subnormal.
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
}

// Nearest-even rounding checked against the nearest f16 found by search over the value lattice.
TEST(Half, NarrowingIsNearestEven) {
  auto gen = test_rng();
  std::uniform_int_distribution<uint32_t> bits;
  for (int t = 0; t < 20000; ++t) {
    uint32_t w = bits(gen);
    w = (w & 0x80000000u) | ((w & 0x7fffffffu) % 0x47800000u);  // |x| < 65536, finite
    float x;
    std::memcpy(&x, &w, 4);
    const uint16_t h = float_to_f16(x);
    if ((h & 0x7fffu) == 0x7c00u) {  // beyond 65504 by half a step or more: inf, as IEEE rounds
      ASSERT_GE(std::fabs(x), 65520.0f) << x;
      continue;
    }
    const double err = std::fabs(double{f16_to_float(h)} - x);
    for (int d : {-1, 1}) {  // the neighbours are no nearer, and a tie goes to the even one
      const uint16_t n = static_cast<uint16_t>(h + d);
      if ((n & 0x7c00u) == 0x7c00u || ((n ^ h) & 0x8000u)) continue;
      const double nerr = std::fabs(double{f16_to_float(n)} - x);
      ASSERT_LE(err, nerr) << x;
      if (err == nerr) ASSERT_EQ(h & 1u, 0u) << "tie not to even at " << x;
    }
  }
  EXPECT_EQ(float_to_f16(70000.0f), 0x7c00);  // overflow is inf
  EXPECT_EQ(float_to_f16(-70000.0f), 0xfc00);
}

// The edges of the branch-free narrowing: ties halfway between two f16 values in the subnormal
// range (rounded by a float add) and in the normal range (by the carry), the largest value that
// still rounds to 65504, the smallest subnormal and the boundary between the two ranges, and NaN
// of either sign.
TEST(Half, NarrowingTiesAndEdges) {
  for (uint32_t k = 0; k < 2048; ++k) {  // (k + 1/2)·2^-24: subnormals, then the first normal binade
    const float x = std::ldexp(static_cast<float>(k) + 0.5f, -24);
    const uint16_t want = static_cast<uint16_t>(k + (k & 1u));  // the even neighbour
    ASSERT_EQ(float_to_f16(x), want) << "tie at (" << k << " + 1/2)·2^-24";
    ASSERT_EQ(float_to_f16(-x), want | 0x8000u) << k;
    ASSERT_EQ(float_to_f16(std::nextafter(x, 1.0f)), k + 1) << "just above a tie, k " << k;
    ASSERT_EQ(float_to_f16(std::nextafter(x, 0.0f)), k) << "just below a tie, k " << k;
  }
  for (int e = -14; e <= 15; ++e)  // ties in every normal binade: 1 + (2j + 1)/2048
    for (uint32_t j : {0u, 1u, 511u, 1022u, 1023u}) {
      const float x = std::ldexp(1.0f + (2.0f * static_cast<float>(j) + 1.0f) / 2048.0f, e);
      const uint16_t low = static_cast<uint16_t>(((e + 15) << 10) | j);
      ASSERT_EQ(float_to_f16(x), low + (low & 1u)) << "binade " << e << " j " << j;
    }
  EXPECT_EQ(float_to_f16(std::nextafter(65520.0f, 0.0f)), 0x7bff);  // below the tie: 65504
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);                         // the tie goes to inf (even)
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -14)), 0x0400);            // the smallest normal
  EXPECT_EQ(float_to_f16(std::nextafter(std::ldexp(1.0f, -14), 0.0f)), 0x0400);  // rounds up to it
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);            // half the smallest subnormal: even
  EXPECT_EQ(float_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(float_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_f16(-std::numeric_limits<float>::quiet_NaN()) & 0xfe00u, 0xfe00u);
  EXPECT_EQ(float_to_f16(std::numeric_limits<float>::signaling_NaN()), 0x7e00);
}

TEST(Q8_0, QuantiseWithinHalfAStepAndRoundTrips) {
  auto gen = test_rng();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 32 * 37;
  std::vector<float> x(n), y(n), z(n);
  for (auto& v : x) v = normal(gen) * 3.0f;
  for (int64_t i = 0; i < 32; ++i) x[5 * 32 + i] = 0.0f;  // an all-zero block
  x[7 * 32 + 3] = 1e-30f;                               // a tiny block
  for (int64_t i = 0; i < 32; ++i) if (i != 3) x[7 * 32 + i] = 0.0f;
  std::vector<BlockQ8_0> q(n / 32), q2(n / 32);
  kernels::quantize_row_q8_0(x.data(), n, q.data());
  kernels::dequantize_row_q8_0(q.data(), n, y.data());
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0.0f;
    for (int64_t i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[b * 32 + i]));
    const float d = f16_to_float(q[b].d);
    EXPECT_EQ(q[b].d, float_to_f16(amax / 127.0f)) << "block " << b;
    for (int64_t i = 0; i < 32; ++i) {
      // Half a step of the unrounded scale, plus what rounding the scale to f16 moves q·d by.
      const double step = amax / 127.0, bound = 0.5 * step + 127.0 * std::fabs(d - step) + 1e-45;
      ASSERT_LE(std::fabs(double{y[b * 32 + i]} - x[b * 32 + i]), bound) << "block " << b << " i " << i;
    }
  }
  for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(y[5 * 32 + i], 0.0f);
  // Dequantised blocks quantise back to the same bytes.
  kernels::quantize_row_q8_0(y.data(), n, q2.data());
  kernels::dequantize_row_q8_0(q2.data(), n, z.data());
  EXPECT_EQ(std::memcmp(y.data(), z.data(), n * sizeof(float)), 0);
}

}  // namespace
}  // namespace mhsa::test
