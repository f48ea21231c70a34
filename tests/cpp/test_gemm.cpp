// tests/cpp/test_gemm.cpp — every ISA's GEMM against the float64 reference GEMM.
#include "kernels/dispatch.h"
#include "kernels/gemm.h"
#include "test_util.h"

namespace mhsa::test {
namespace {

TEST(Gemm, EveryIsaMatchesTheReference) {
  auto gen = test_rng();
  for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {97, 41, 80}, {33, 2304, 96}, {5, 7, 1025}}) {
    const Tensor a = random_tensor(gen, {M, K}), b = random_tensor(gen, {K, N}), bias = random_tensor(gen, {N});
    Tensor want({M, N});
    kernels::gemm_ref(M, N, K, a.data(), K, b.data(), N, bias.data(), want.data(), N);
    const std::vector<double> ref(want.data(), want.data() + want.numel());
    for (cpu::Isa isa : cpu::usable_isas()) {
      Tensor got({M, N});
      kernels::kernels_for(isa).gemm(M, N, K, a.data(), K, b.data(), N, bias.data(), got.data(), N);
      EXPECT_LE(rel_l2(got.data(), ref), 1e-6 * std::sqrt(static_cast<double>(K)))
          << cpu::isa_name(isa) << " M=" << M << " N=" << N << " K=" << K;
    }
  }
}

}  // namespace
}  // namespace mhsa::test
