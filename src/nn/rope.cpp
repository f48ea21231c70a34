// nn/rope.cpp — see rope.h. cos and sin are computed per (row, pair) in float64 from the float32
// angle, as transformers rounds it (positions·inv_freq in float32).
#include "nn/rope.h"

#include <cmath>
#include <numbers>

namespace mhsa::nn {
namespace {

void rotate(const Rope& rope, int64_t rows, int64_t T, int64_t pos0, int64_t heads, int64_t D, float* x, int64_t ld,
            float sign) {
  const int64_t half = rope.rotary_dim / 2;
#pragma omp parallel for schedule(static) if (rows * heads * half >= (int64_t{1} << 15))
  for (int64_t r = 0; r < rows; ++r) {
    const auto pos = static_cast<float>(pos0 + r % T);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * rope.inv_freq[static_cast<size_t>(i)];
      const auto c = static_cast<float>(std::cos(static_cast<double>(angle)));
      const float s = sign * static_cast<float>(std::sin(static_cast<double>(angle)));
      for (int64_t h = 0; h < heads; ++h) {
        float* p = x + r * ld + h * D;
        const float a = p[i], b = p[i + half];
        p[i] = a * c - b * s;
        p[i + half] = b * c + a * s;
      }
    }
  }
}

}  // namespace

Rope make_rope(const ModelConfig& c) {
  Rope rope;
  rope.rotary_dim = c.rotary_dim > 0 ? c.rotary_dim : c.head_dim;
  const int64_t half = rope.rotary_dim / 2;
  const RopeScaling& s = c.rope_scaling;
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(rope.rotary_dim);
    float f = 1.0f / std::pow(static_cast<float>(c.rope_theta), exponent);
    if (s.kind == RopeScalingKind::linear) {
      f = static_cast<float>(f / s.factor);
    } else if (s.kind == RopeScalingKind::llama3) {
      const double old_len = static_cast<double>(s.original_max_position_embeddings);
      const double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / s.factor);
      } else if (wavelen >= high_wavelen) {  // between the two: a smooth blend
        const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = static_cast<float>((1 - smooth) * f / s.factor + smooth * f);
      }
    }
    rope.inv_freq.push_back(f);
  }
  return rope;
}

void rope_forward(const Rope& rope, int64_t rows, int64_t T, int64_t pos0, int64_t heads, int64_t D, float* x,
                  int64_t ld) {
  rotate(rope, rows, T, pos0, heads, D, x, ld, 1.0f);
}

void rope_backward(const Rope& rope, int64_t rows, int64_t T, int64_t pos0, int64_t heads, int64_t D, float* dx,
                   int64_t ld) {
  rotate(rope, rows, T, pos0, heads, D, dx, ld, -1.0f);
}

}  // namespace mhsa::nn
