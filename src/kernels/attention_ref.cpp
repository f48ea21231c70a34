// kernels/attention_ref.cpp — the reference attention kernels, written like the equations:
//   s_ij = cap(scale · q_i·k_j) + mask_ij   (for the keys j the causal, window and padding limits
//   cap(x) = softcap·tanh(x / softcap), or x without soft-capping   leave: key_range)
//   lse_i = log Σ_j exp(s_ij),  P_ij = exp(s_ij − lse_i),  out_i = Σ_j P_ij z_ij v_j
// (with attention sinks, exp(sink_h) joins each row's sum: a key with a score and no value)
// with z_ij dropout's factor (dropout_scales: 0 or 1/(1 − p)), 1 without dropout. Keys and values
// of a 16-bit or q8_0 KV cache are widened (dequantised) exactly as they are read (kv_at): the
// float64 attention on the dequantised keys and values.
// Scalar, float64 accumulation, one query row at a time with an O(Tk) score buffer. They are the
// oracle for the fast kernels and the fallback for shapes those do not take; never tuned.
// Rows are independent, so the OpenMP split over rows cannot change any result.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention_params.h"

namespace mhsa::kernels {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Scaled, masked score of query row (b, h, i) against key j of kv head hk; T: the keys' element
// type (a 16-bit key widened exactly, a Q8_0 one dequantised).
template <class T>
double score(const AttentionParams& p, int64_t b, int64_t h, int64_t hk, int64_t i, int64_t j) {
  const float* qi = p.q + b * p.q_stride[0] + h * p.q_stride[1] + i * p.q_stride[2];
  const T* kj = key_row<T>(p, b, hk, j);
  double dot = 0.0;
  for (int64_t d = 0; d < p.D; ++d)
    dot += static_cast<double>(qi[d * p.q_stride[3]]) * static_cast<double>(kv_at(kj, d, p.k_stride[3]));
  double s = static_cast<double>(p.scale) * dot;
  if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
  if (p.mask)
    s += p.mask[b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2] + j * p.mask_stride[3]];
  return s;
}

float& lse_at(const AttentionParams& p, int64_t b, int64_t h, int64_t i) {
  return p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]];
}

template <class T, class TV>
void forward_ref(const AttentionParams& p) {
  const int64_t group = p.Hq / p.Hkv;
#pragma omp parallel
  {
    std::vector<double> scores(static_cast<size_t>(p.Tk));  // [Tk] one query row
    std::vector<double> acc(static_cast<size_t>(p.Dv));      // [Dv]
    std::vector<float> z(static_cast<size_t>(p.Tk), 1.0f);   // [Tk] dropout factors
#pragma omp for collapse(3) schedule(static)
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.Hq; ++h)
        for (int64_t i = 0; i < p.Tq; ++i) {
          const int64_t hk = h / group;
          const auto [begin, end] = key_range(p, b, i);
          const double sink = p.sinks ? static_cast<double>(p.sinks[h]) : kNegInf;
          double row_max = sink;  // NaN when a score is NaN: then so are out and lse (IEEE)
          for (int64_t j = begin; j < end; ++j) {
            scores[j] = score<T>(p, b, h, hk, i, j);
            if (!(scores[j] <= row_max)) row_max = scores[j];
          }
          double sum = p.sinks && row_max != kNegInf ? std::exp(sink - row_max) : 0.0;
          std::fill(acc.begin(), acc.end(), 0.0);
          const bool masked = row_max == kNegInf;  // every visible score -inf
          if (p.dropout > 0.0f) dropout_scales(p, b, h, i, 0, p.Tk, z.data());
          if (!masked) {
            for (int64_t j = begin; j < end; ++j) {
              const double w = std::exp(scores[j] - row_max);
              sum += w;
              if (p.out) {
                const TV* vj = value_row<TV>(p, b, hk, j);
                for (int64_t d = 0; d < p.Dv; ++d)
                  acc[d] += w * z[j] * static_cast<double>(kv_at(vj, d, p.v_stride[3]));
              }
            }
          }
          // A fully masked row (no key, or every score -inf) gives out = 0 and lse = -inf (with a
          // sink, out = 0 and lse = the sink).
          if (p.out) {
            float* oi = p.out + b * p.out_stride[0] + h * p.out_stride[1] + i * p.out_stride[2];
            for (int64_t d = 0; d < p.Dv; ++d) oi[d * p.out_stride[3]] = masked ? 0.0f : static_cast<float>(acc[d] / sum);
          }
          if (p.lse) lse_at(p, b, h, i) = masked ? -std::numeric_limits<float>::infinity()
                                                 : static_cast<float>(row_max + std::log(sum));
        }
  }
}

}  // namespace

void attention_forward_ref(const AttentionParams& p) {
  with_kv_element(p, [&](auto key, auto value) { forward_ref<decltype(key), decltype(value)>(p); });
}

void attention_probabilities_ref(const AttentionParams& p, const int64_t* heads, int64_t n_heads,
                                 float* probs, const Strides4& ps) {
  const int64_t group = p.Hq / p.Hkv;
#pragma omp parallel for collapse(3) schedule(static)
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t s = 0; s < n_heads; ++s)
      for (int64_t i = 0; i < p.Tq; ++i) {
        const int64_t h = heads[s];
        const double lse = lse_at(p, b, h, i);
        const KeyRange keys = lse == kNegInf ? KeyRange{} : key_range(p, b, i);  // a fully masked row stays 0
        float* row = probs + b * ps[0] + s * ps[1] + i * ps[2];
        // exp(s - lse) with a float lse is off by a factor exp(lse_exact - lse) = 1 + O(|lse|·2^-24);
        // dividing by the row's sum removes that factor, so the rows are exact whatever |lse| is.
        double sum = 0.0;
        for (int64_t j = 0; j < keys.begin; ++j) row[j * ps[3]] = 0.0f;
        for (int64_t j = keys.begin; j < keys.end; ++j) {
          const double e = std::exp(score<float>(p, b, h, h / group, i, j) - lse);
          row[j * ps[3]] = static_cast<float>(e);
          sum += e;
        }
        if (p.sinks) sum += std::exp(p.sinks[h] - lse);  // the sink's share, which no key receives
        const double norm = sum == 0.0 ? 0.0 : 1.0 / sum;  // NaN (a NaN row) stays NaN
        for (int64_t j = keys.begin; j < keys.end; ++j) row[j * ps[3]] = static_cast<float>(row[j * ps[3]] * norm);
        for (int64_t j = keys.end; j < p.Tk; ++j) row[j * ps[3]] = 0.0f;
      }
}

}  // namespace mhsa::kernels
