// kernels/attention_backward_ref.cpp — the reference attention backward, written like the
// equations (σ the scale, P recomputed from the saved lse, never stored whole):
//   P_ij = exp(s_ij − lse_i) / Σ_j exp(s_ij − lse_i)   s_ij = cap(σ q_i·k_j) + mask_ij, visible keys only
//   dV_j = Σ_i P_ij dO_i        dP_ij = dO_i·v_j        D_i = Σ_j P_ij dP_ij
//   dS_ij = P_ij (dP_ij − D_i) cap'  dQ_i = σ Σ_j dS_ij k_j   dK_j = σ Σ_i dS_ij q_i
// with soft-capping cap(x) = c·tanh(x/c), cap' = 1 − tanh²(x/c); without it cap(x) = x, cap' = 1.
// Dropout's factors z_ij (0 or 1/(1 − p), regenerated from the seed) enter as the forward used
// them: dV_j = Σ_i P_ij z_ij dO_i, and z_ij dP_ij in place of dP_ij in D_i and dS_ij.
// With attention sinks, the sink is one more key of score sink_h and no value: it takes its share
// P_i,sink of the row's sum and gives dsink_h = Σ_b,i P_i,sink (0 − D_i).
// dK and dV sum over the query heads that share a kv head. Scalar, float64 accumulation; one
// (batch, kv head) per thread, so no two threads write the same gradient. The oracle for the
// fast backward; never tuned.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention_params.h"

namespace mhsa::kernels {
namespace {

const float* row(const float* base, const Strides4& s, int64_t b, int64_t h, int64_t i) {
  return base + b * s[0] + h * s[1] + i * s[2];
}
float* row(float* base, const Strides4& s, int64_t b, int64_t h, int64_t i) {
  return base + b * s[0] + h * s[1] + i * s[2];
}

}  // namespace

void attention_backward_ref(const AttentionParams& p) {
  const int64_t group = p.Hq / p.Hkv;
  // Each (batch, query head)'s share of dsinks, written by the one thread that owns the pair.
  std::vector<double> dsink(p.dsinks ? static_cast<size_t>(p.B * p.Hq) : 0, 0.0);
#pragma omp parallel
  {
    std::vector<double> dk(static_cast<size_t>(p.Tk * p.D)), dv(static_cast<size_t>(p.Tk * p.Dv));  // [Tk, D|Dv]
    std::vector<double> prob(static_cast<size_t>(p.Tk)), dprob(static_cast<size_t>(p.Tk));         // [Tk]
    std::vector<double> dcap(static_cast<size_t>(p.Tk));                                           // [Tk] cap'
    std::vector<double> dq(static_cast<size_t>(p.D));                                              // [D]
    std::vector<float> z(static_cast<size_t>(p.Tk), 1.0f);                                         // [Tk] dropout
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t hk = 0; hk < p.Hkv; ++hk) {
        std::fill(dk.begin(), dk.end(), 0.0);
        std::fill(dv.begin(), dv.end(), 0.0);
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
          for (int64_t i = 0; i < p.Tq; ++i) {
            const double lse = p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]];
            const auto [begin, end] =
                lse == -std::numeric_limits<double>::infinity() ? KeyRange{} : key_range(p, b, i);
            const float* qi = row(p.q, p.q_stride, b, h, i);
            const float* doi = row(p.dout, p.dout_stride, b, h, i);
            if (p.dropout > 0.0f) dropout_scales(p, b, h, i, 0, p.Tk, z.data());
            double d_i = 0.0, sum = 0.0;
            // The sink's weight exp(sink − lse); none in a fully masked row of a call without sinks.
            const double sink = p.sinks && lse != -std::numeric_limits<double>::infinity() ? std::exp(p.sinks[h] - lse) : 0.0;
            sum += sink;
            for (int64_t j = begin; j < end; ++j) {
              const float* kj = key_row(p, b, hk, j);
              const float* vj = value_row(p, b, hk, j);
              double dot = 0.0, dp = 0.0;
              for (int64_t d = 0; d < p.D; ++d) dot += double(qi[d * p.q_stride[3]]) * kj[d * p.k_stride[3]];
              double s = p.scale * dot;
              dcap[j] = 1.0;
              if (p.softcap > 0.0f) {
                const double t = std::tanh(s / p.softcap);
                s = p.softcap * t;
                dcap[j] = 1.0 - t * t;
              }
              if (p.mask) s += p.mask[b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2] +
                                      j * p.mask_stride[3]];
              for (int64_t d = 0; d < p.Dv; ++d) dp += double(doi[d * p.dout_stride[3]]) * vj[d * p.v_stride[3]];
              prob[j] = std::exp(s - lse);
              dprob[j] = dp * z[j];
              sum += prob[j];
            }
            // Normalised by the row's own sum: the float lse's rounding cancels, and a row with one
            // visible key gets P = 1 and dS = 0 exactly. A NaN score or lse makes the row NaN.
            for (int64_t j = begin; j < end; ++j) {
              prob[j] /= sum;
              d_i += prob[j] * dprob[j];
            }
            if (p.dsinks) dsink[b * p.Hq + h] -= sink / sum * d_i;
            std::fill(dq.begin(), dq.end(), 0.0);
            for (int64_t j = begin; j < end; ++j) {
              const double ds = prob[j] * (dprob[j] - d_i) * dcap[j] * p.scale;
              const float* kj = key_row(p, b, hk, j);
              for (int64_t d = 0; d < p.D; ++d) {
                dq[d] += ds * kj[d * p.k_stride[3]];
                dk[j * p.D + d] += ds * qi[d * p.q_stride[3]];
              }
              for (int64_t d = 0; d < p.Dv; ++d) dv[j * p.Dv + d] += prob[j] * z[j] * doi[d * p.dout_stride[3]];
            }
            float* dqi = row(p.dq, p.dq_stride, b, h, i);
            for (int64_t d = 0; d < p.D; ++d) dqi[d * p.dq_stride[3]] = static_cast<float>(dq[d]);
          }
        for (int64_t j = 0; j < p.Tk; ++j) {
          float* dkj = row(p.dk, p.dk_stride, b, hk, j);
          float* dvj = row(p.dv, p.dv_stride, b, hk, j);
          for (int64_t d = 0; d < p.D; ++d) dkj[d * p.dk_stride[3]] = static_cast<float>(dk[j * p.D + d]);
          for (int64_t d = 0; d < p.Dv; ++d) dvj[d * p.dv_stride[3]] = static_cast<float>(dv[j * p.Dv + d]);
        }
      }
  }
  if (p.dsinks)
    for (int64_t h = 0; h < p.Hq; ++h) {
      double total = 0.0;
      for (int64_t b = 0; b < p.B; ++b) total += dsink[b * p.Hq + h];
      p.dsinks[h] = static_cast<float>(total);
    }
}

}  // namespace mhsa::kernels
