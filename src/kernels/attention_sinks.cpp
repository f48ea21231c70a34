// kernels/attention_sinks.cpp — attention sinks for the fast kernels, as a pass over each row
// after them. A sink is a key of score sink_h and no value, so it changes a row only through its
// sum: with L the row's log-sum-exp over its keys,
//   L' = log(exp(L) + exp(sink_h)),   out' = out·exp(L − L')
// (a fully masked row, L = −inf: out' = 0, L' = sink_h). The backward needs nothing else: given
// out' and L', the fast backward's P_ij = exp(s_ij − L') and D_i = dO_i·out'_i are already the
// sink's, and the sink's own gradient is dsink_h = −Σ_b,i exp(sink_h − L'_i)·D_i.
// A few operations per row against the O(Tk·D) of its attention; the reference kernels take the
// sink as one more key instead (attention_ref.cpp), so they check this pass.
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention_sinks.h"

namespace mhsa::kernels {

void apply_sinks(const AttentionParams& p) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
#pragma omp parallel for collapse(3) schedule(static) if (p.B * p.Hq * p.Tq >= 256)
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h)
      for (int64_t i = 0; i < p.Tq; ++i) {
        float& lse = p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]];
        const double l = lse, sink = p.sinks[h];
        const double hi = l > sink ? l : sink;  // NaN l (a NaN row) stays NaN below
        const double joined = l == kNegInf ? sink : hi + std::log(std::exp(l - hi) + std::exp(sink - hi));
        const double factor = l == kNegInf ? 0.0 : std::exp(l - joined);
        lse = static_cast<float>(joined);
        if (!p.out) continue;
        float* o = p.out + b * p.out_stride[0] + h * p.out_stride[1] + i * p.out_stride[2];
        for (int64_t d = 0; d < p.Dv; ++d) o[d * p.out_stride[3]] = static_cast<float>(o[d * p.out_stride[3]] * factor);
      }
}

void sinks_backward(const AttentionParams& p) {
  std::vector<double> share(static_cast<size_t>(p.B * p.Hq), 0.0);  // [B, Hq]
#pragma omp parallel for collapse(2) schedule(static) if (p.B * p.Hq * p.Tq >= 256)
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t h = 0; h < p.Hq; ++h) {
      double total = 0.0;
      for (int64_t i = 0; i < p.Tq; ++i) {
        const double lse = p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]];
        const float* o = p.out + b * p.out_stride[0] + h * p.out_stride[1] + i * p.out_stride[2];
        const float* g = p.dout + b * p.dout_stride[0] + h * p.dout_stride[1] + i * p.dout_stride[2];
        double di = 0.0;
        for (int64_t d = 0; d < p.Dv; ++d) di += double(g[d * p.dout_stride[3]]) * double(o[d * p.out_stride[3]]);
        total -= std::exp(p.sinks[h] - lse) * di;
      }
      share[b * p.Hq + h] = total;
    }
  for (int64_t h = 0; h < p.Hq; ++h) {
    double total = 0.0;
    for (int64_t b = 0; b < p.B; ++b) total += share[b * p.Hq + h];
    p.dsinks[h] = static_cast<float>(total);
  }
}

}  // namespace mhsa::kernels
