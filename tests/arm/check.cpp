// tests/arm/check.cpp — run under qemu-aarch64 by scripts/test.sh: on ARM the library builds its
// portable kernels only; they must agree with the reference paths there too.
#include <cmath>
#include <cstdio>
#include <random>
#include <mhsa/mhsa.h>
int main() {
  std::mt19937 gen(1); std::normal_distribution<float> n;
  int bad = 0;
  for (auto [Tq, Tk, D] : {std::array<int64_t,3>{1, 3000, 64}, {97, 97, 40}, {300, 300, 80}}) {
    mhsa::Tensor q({2, 4, Tq, D}), k({2, 2, Tk, D}), v({2, 2, Tk, D});
    for (auto* t : {&q, &k, &v}) for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] = n(gen);
    mhsa::AttentionOptions fast; fast.causal = true;
    mhsa::AttentionOptions ref = fast; ref.backend = mhsa::Backend::reference;
    auto a = mhsa::scaled_dot_product_attention(q.view(), k.view(), v.view(), fast);
    auto b = mhsa::scaled_dot_product_attention(q.view(), k.view(), v.view(), ref);
    double num = 0, den = 0;
    for (int64_t i = 0; i < a.out.numel(); ++i) { num += std::pow(a.out.data()[i] - b.out.data()[i], 2); den += std::pow(b.out.data()[i], 2); }
    std::printf("Tq=%lld Tk=%lld D=%lld rel L2 %.3g\n", (long long)Tq, (long long)Tk, (long long)D, std::sqrt(num / den));
    bad += std::sqrt(num / den) > 1e-5;
  }
  mhsa::MultiHeadAttention m(96, 4); mhsa::Tensor x({1, 33, 96});
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = n(gen);
  mhsa::MhaOptions f, r; r.backend = mhsa::Backend::reference;
  auto y1 = m.forward(x.view(), f), y2 = m.forward(x.view(), r);
  double num = 0, den = 0;
  for (int64_t i = 0; i < y1.numel(); ++i) { num += std::pow(y1.data()[i] - y2.data()[i], 2); den += std::pow(y2.data()[i], 2); }
  std::printf("MHA rel L2 %.3g\n", std::sqrt(num / den));
  bad += std::sqrt(num / den) > 1e-5;
  std::printf("%s\n", bad ? "FAILED" : "ok");
  return bad;
}
