// Uses the installed headers and library: one attention call, checked against its own sum.
#include <cmath>
#include <cstdio>

#include <mhsa/mhsa.h>

int main() {
  // One query against two keys with equal scores: the output is the mean of the two values.
  mhsa::Tensor q({1, 1, 1, 2}), k({1, 1, 2, 2}), v({1, 1, 2, 2});
  v.data()[0] = 1.0f;
  v.data()[3] = 3.0f;
  const mhsa::AttentionResult r = mhsa::scaled_dot_product_attention(q.view(), k.view(), v.view());
  const bool ok = std::fabs(r.out.data()[0] - 0.5f) < 1e-6f && std::fabs(r.out.data()[1] - 1.5f) < 1e-6f &&
                  std::fabs(r.lse.data()[0] - std::log(2.0f)) < 1e-6f;
  try {
    mhsa::MultiHeadAttention bad(10, 3);
    return 1;
  } catch (const mhsa::Error& e) {
    std::printf("consumer: caught expected error: %s\n", e.what());
  }
  std::printf("consumer: out = [%g, %g] %s\n", r.out.data()[0], r.out.data()[1], ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
