// kernels/attention_sinks.h — attention sinks applied around the fast kernels (see the .cpp).
#pragma once

#include "kernels/attention_params.h"

namespace mhsa::kernels {

// After a forward that ran without sinks: each row's lse (required) and out (if bound) become
// those with p.sinks in the softmax's sum.
void apply_sinks(const AttentionParams& p);
// After a backward given the sinks' out and lse: p.dsinks[h] = −Σ_b,i exp(sink_h − lse_i)·(dO_i·out_i).
void sinks_backward(const AttentionParams& p);

}  // namespace mhsa::kernels
