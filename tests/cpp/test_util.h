// tests/cpp/test_util.h — shared helpers for the C++ tests: fresh random inputs with a printed,
// overridable seed (MHSA_TEST_SEED), error norms, and a straightforward float64 attention oracle
// that materialises the whole score matrix — deliberately unlike the kernels it checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mhsa/mhsa.h"

namespace mhsa::test {

inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("MHSA_TEST_SEED");
    const uint64_t s = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("[mhsa tests] MHSA_TEST_SEED=%llu\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// A generator seeded from the run's seed and the test's name, so each test draws fresh inputs per
// run and a failure reproduces with MHSA_TEST_SEED.
inline std::mt19937_64 test_rng() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "";
  return std::mt19937_64(test_seed() ^ std::hash<std::string>{}(name));
}

inline Tensor random_tensor(std::mt19937_64& gen, std::vector<int64_t> dims, float stddev = 1.0f) {
  Tensor t(std::move(dims));
  std::normal_distribution<float> normal(0.0f, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = normal(gen);
  return t;
}

// k [1, Hkv, Tk, D] and v [1, Hkv, Tk, Dv] copied into blocks of bs tokens (a paged KV cache's
// [Hkv, bs, D] and [Hkv, bs, Dv] blocks), placed in shuffled order when `shuffle` is given; the
// rows past Tk are NaN, which a kernel must never read.
struct PagedCopy {
  std::vector<float> storage;
  std::vector<const float*> k_blocks, v_blocks;
};
inline PagedCopy paged_copy(const Tensor& k, const Tensor& v, int64_t bs, std::mt19937_64* shuffle = nullptr) {
  const int64_t Hkv = k.shape()[1], Tk = k.shape()[2], D = k.shape()[3], Dv = v.shape()[3];
  const int64_t n = (Tk + bs - 1) / bs, block = Hkv * bs * (D + Dv);
  std::vector<int64_t> where(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) where[static_cast<size_t>(i)] = i;
  if (shuffle) std::shuffle(where.begin(), where.end(), *shuffle);
  PagedCopy c;
  c.storage.assign(static_cast<size_t>(n * block), std::numeric_limits<float>::quiet_NaN());
  for (int64_t i = 0; i < n; ++i) {
    float* kp = c.storage.data() + where[static_cast<size_t>(i)] * block;
    float* vp = kp + Hkv * bs * D;
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t t = 0; t < bs && i * bs + t < Tk; ++t) {
        for (int64_t d = 0; d < D; ++d) kp[(h * bs + t) * D + d] = k.view().at(0, h, i * bs + t, d);
        for (int64_t d = 0; d < Dv; ++d) vp[(h * bs + t) * Dv + d] = v.view().at(0, h, i * bs + t, d);
      }
    c.k_blocks.push_back(kp);
    c.v_blocks.push_back(vp);
  }
  return c;
}

// Copies a logical 4-D tensor into storage of another layout and returns a view with the same
// logical shape: `perm` is the storage order of the logical axes (outermost first), `pad` extra
// elements after each innermost row, `reverse_axis` an axis walked backwards (negative stride).
struct StridedCopy {
  std::vector<float> storage;
  ConstTensorView view;
};
inline StridedCopy strided_copy(const Tensor& t, std::array<int, 4> perm, int64_t pad, int reverse_axis = -1) {
  const ConstTensorView src = t.view();
  std::array<int64_t, 4> stride{};
  int64_t step = 1;
  for (int p = 3; p >= 0; --p) {
    stride[perm[p]] = step;
    step *= src.shape[perm[p]] + (p == 3 ? pad : 0);
  }
  StridedCopy c;
  c.storage.assign(static_cast<size_t>(step), std::numeric_limits<float>::quiet_NaN());  // padding is poison
  int64_t offset = 0;
  if (reverse_axis >= 0) {
    offset = (src.shape[reverse_axis] - 1) * stride[reverse_axis];
    stride[reverse_axis] = -stride[reverse_axis];
  }
  float* base = c.storage.data() + offset;
  for (int64_t a = 0; a < src.shape[0]; ++a)
    for (int64_t b = 0; b < src.shape[1]; ++b)
      for (int64_t i = 0; i < src.shape[2]; ++i)
        for (int64_t d = 0; d < src.shape[3]; ++d)
          base[a * stride[0] + b * stride[1] + i * stride[2] + d * stride[3]] = src.at(a, b, i, d);
  c.view = ConstTensorView(base, {src.shape[0], src.shape[1], src.shape[2], src.shape[3]},
                           {stride[0], stride[1], stride[2], stride[3]});
  return c;
}

// ||a - ref|| / ||ref|| over all elements (plain L2 norms in double).
inline double rel_l2(const float* a, const std::vector<double>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The attention options beyond the first contract: a sliding window (-1: unlimited), top-left
// alignment of the causal and window limits, soft-capping (0: none).
struct Variant {
  int64_t left = -1, right = -1;
  bool top_left = false;
  float softcap = 0.0f;
  void apply(AttentionOptions& o) const {
    o.window = {left, right};
    if (top_left) o.causal_alignment = CausalAlignment::top_left;
    if (softcap > 0.0f) o.softcap = softcap;
  }
  std::string name() const {
    std::string s;
    if (left >= 0) s += "_left" + std::to_string(left);
    if (right >= 0) s += "_right" + std::to_string(right);
    if (top_left) s += "_topleft";
    if (softcap > 0.0f) s += "_cap" + std::to_string(static_cast<int>(softcap));
    return s;
  }
};

// The oracle: full [Tq, Tk] score matrix per (b, h) in double, the mask rules written out
// literally, softmax, weighted sum. Outputs are contiguous [B, Hq, Tq, Dv], [B, Hq, Tq] and
// [B, Hq, Tq, Tk] (probs, and dcap: d score / d (scale·q·k), 1 − tanh² with soft-capping).
// `mask` is [B|1, Hq|1, Tq, Tk] (or undefined).
struct Oracle {
  std::vector<double> out, lse, probs, dcap;
};
inline Oracle naive_attention(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                              bool causal, double scale, const ConstTensorView& mask,
                              const std::vector<int64_t>& kv_lengths, const Variant& var = {}) {
  const int64_t B = q.shape[0], Hq = q.shape[1], Tq = q.shape[2], D = q.shape[3];
  const int64_t Hkv = k.shape[1], Tk = k.shape[2], Dv = v.shape[3];
  const double inf = std::numeric_limits<double>::infinity();
  Oracle o;
  o.out.assign(static_cast<size_t>(B * Hq * Tq * Dv), 0.0);
  o.lse.assign(static_cast<size_t>(B * Hq * Tq), -inf);
  o.probs.assign(static_cast<size_t>(B * Hq * Tq * Tk), 0.0);
  o.dcap.assign(static_cast<size_t>(B * Hq * Tq * Tk), 1.0);
  const int64_t offset = var.top_left ? 0 : Tk - Tq;  // query i stands at key position i + offset
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h * Hkv / Hq;  // = h / (Hq / Hkv)
      std::vector<double> s(static_cast<size_t>(Tq * Tk));
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t j = 0; j < Tk; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) dot += double(q.at(b, h, i, d)) * double(k.at(b, hk, j, d));
          double x = dot * scale;
          if (var.softcap > 0.0f) {
            const double t = std::tanh(x / var.softcap);
            x = var.softcap * t;
            o.dcap[static_cast<size_t>(((b * Hq + h) * Tq + i) * Tk + j)] = 1.0 - t * t;
          }
          if (mask.defined())
            x += mask.at(mask.shape[0] == 1 ? 0 : b, mask.shape[1] == 1 ? 0 : h, i, j);
          if (causal && j > i + offset) x = -inf;
          if (var.left >= 0 && j < i + offset - var.left) x = -inf;
          if (var.right >= 0 && j > i + offset + var.right) x = -inf;
          if (!kv_lengths.empty() && j >= kv_lengths[static_cast<size_t>(b)]) x = -inf;
          s[i * Tk + j] = x;
        }
      for (int64_t i = 0; i < Tq; ++i) {
        double m = -inf;
        for (int64_t j = 0; j < Tk; ++j) m = std::max(m, s[i * Tk + j]);
        if (m == -inf) continue;  // fully masked: out 0, lse -inf, probs 0
        double sum = 0.0;
        for (int64_t j = 0; j < Tk; ++j) sum += std::exp(s[i * Tk + j] - m);
        const size_t row = static_cast<size_t>((b * Hq + h) * Tq + i);
        o.lse[row] = m + std::log(sum);
        for (int64_t j = 0; j < Tk; ++j) {
          const double p = std::exp(s[i * Tk + j] - m) / sum;
          o.probs[row * Tk + j] = p;
          for (int64_t d = 0; d < Dv; ++d) o.out[row * Dv + d] += p * v.at(b, hk, j, d);
        }
      }
    }
  return o;
}

// Asserts that fn() throws mhsa::Error whose message contains every fragment.
template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "expected mhsa::Error, nothing was thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
  }
}

}  // namespace mhsa::test
