// kernels/rope.cpp — the rotary embedding's inverse frequencies and its cos/sin table (see
// elementwise.h), computed once per model rather than per call. The float32 version repeats
// transformers' float32 arithmetic operation by operation (ROPE_INIT_FUNCTIONS "default",
// "linear" and "llama3"; LlamaRotaryEmbedding.forward for the angles), so positions rotate by the
// same angles as in the model's reference implementation; the file is built without FMA
// contraction for that reason. A GGUF file's per-frequency factors (rope_freqs) divide the default
// frequencies, as llama.cpp's freq_factors do. Not the rotation itself (the rope kernel).
#include <cmath>
#include <vector>

#include "kernels/elementwise.h"

namespace mhsa::kernels {
namespace {

// "llama3": frequencies whose wavelength is above original_max / low_freq_factor are divided by
// factor, those below original_max / high_freq_factor are kept, those between interpolated.
// T is float (transformers' float32 tensors, Python scalars rounded to float32 where they meet
// one) or double (the oracle).
template <class T>
void llama3_scaling(std::vector<T>& inv_freq, const RopeScaling& s) {
  const double low_wavelen = double(s.original_max_position_embeddings) / s.low_freq_factor;
  const double high_wavelen = double(s.original_max_position_embeddings) / s.high_freq_factor;
  const T factor = T(s.factor), low = T(s.low_freq_factor), old_len = T(s.original_max_position_embeddings);
  const T span = T(s.high_freq_factor - s.low_freq_factor);
  for (T& f : inv_freq) {
    const T wavelen = T(2 * M_PI) / f;
    const T scaled = wavelen > T(low_wavelen) ? f / factor : f;
    const T smooth = (old_len / wavelen - low) / span;
    const T a = (T(1) - smooth) * scaled, b = smooth * scaled;
    const T smoothed = a / factor + b;
    const bool medium = !(wavelen < T(high_wavelen)) && !(wavelen > T(low_wavelen));
    f = medium ? smoothed : scaled;
  }
}

template <class T>
std::vector<T> inv_freq_as(int64_t rotary_dim, double theta, const RopeScaling& scaling) {
  std::vector<T> f(static_cast<size_t>(rotary_dim / 2));
  for (size_t i = 0; i < f.size(); ++i) {
    const T e = T(2 * static_cast<int64_t>(i)) / T(rotary_dim);  // arange(0, dim, 2).float() / dim
    f[i] = T(1) / T(std::pow(double(T(theta)), double(e)));       // 1.0 / (base ** e)
  }
  if (scaling.kind == RopeScalingKind::linear)
    for (T& x : f) x /= T(scaling.factor);
  else if (scaling.kind == RopeScalingKind::llama3)
    llama3_scaling(f, scaling);
  else if (scaling.kind == RopeScalingKind::factors)
    for (size_t i = 0; i < f.size(); ++i) f[i] /= T(scaling.factors[i]);  // llama.cpp's freq_factors
  return f;
}

}  // namespace

std::vector<float> rope_inv_freq(int64_t rotary_dim, double theta, const RopeScaling& scaling) {
  return inv_freq_as<float>(rotary_dim, theta, scaling);
}

std::vector<double> rope_inv_freq_ref(int64_t rotary_dim, double theta, const RopeScaling& scaling) {
  return inv_freq_as<double>(rotary_dim, theta, scaling);
}

void rope_table(const std::vector<float>& inv_freq, int64_t first, int64_t count, float* table) {
  const int64_t half = static_cast<int64_t>(inv_freq.size()), rotary_dim = 2 * half;
  for (int64_t p = 0; p < count; ++p) {
    float* row = table + p * rotary_dim;
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<float>(first + p) * inv_freq[static_cast<size_t>(i)];  // a float32 product
      row[i] = static_cast<float>(std::cos(angle));
      row[half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

}  // namespace mhsa::kernels
