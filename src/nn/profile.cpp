// nn/profile.cpp — the phase totals of nn/profile.h, one set per thread.
#include "nn/profile.h"

namespace mhsa::nn::profile {
namespace {

thread_local Totals totals;

}  // namespace

const char* phase_name(Phase p) {
  static constexpr const char* names[kPhases] = {"embed",   "norm",       "qkv",     "attention", "out_proj",
                                                 "mlp_in",  "activation", "mlp_out", "residual",  "head"};
  return names[static_cast<int>(p)];
}

bool per_layer(Phase p) { return p != Phase::embed && p != Phase::head; }

void set_enabled(bool on) { enabled_flag().store(on, std::memory_order_relaxed); }

Totals take() {
  const Totals t = totals;
  totals = Totals{};
  return t;
}

void add(Phase p, double seconds) {
  totals.seconds[static_cast<size_t>(p)] += seconds;
  ++totals.calls[static_cast<size_t>(p)];
}

}  // namespace mhsa::nn::profile
