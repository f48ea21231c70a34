// kernels/attention_sinks.h — attention sinks applied around the fast kernels (see the .cpp).
#pragma once

#include <cmath>
#include <limits>

#include "kernels/attention_params.h"

namespace mhsa::kernels {

// After a forward that ran without sinks: each row's lse (required) and out (if bound) become
// those with p.sinks in the softmax's sum.
void apply_sinks(const AttentionParams& p);
// After a backward given the sinks' out and lse: p.dsinks[h] = −Σ_b,i exp(sink_h − lse_i)·(dO_i·out_i).
void sinks_backward(const AttentionParams& p);

// An online softmax's running max m and sum l (of exp(s − m)) with the sink added as one more
// score: what the backward's recomputed rows (exact_rows) need. Static: each ISA's build of the
// kernels keeps its own copy, compiled with its own flags (an inline one could be taken from the
// AVX-512 build into a CPU without it).
static inline void fold_sink(float sink, float& m, double& l) {
  if (sink > m) {
    l = m == -std::numeric_limits<float>::infinity() ? 0.0 : l * std::exp(double(m) - double(sink));
    m = sink;
  }
  l += std::exp(double(sink) - double(m));
}

}  // namespace mhsa::kernels
