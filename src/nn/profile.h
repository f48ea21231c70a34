// nn/profile.h — where a forward's time goes, phase by phase (`mhsa bench --profile`). Off by
// default, when a phase costs one relaxed atomic load. On, each phase adds its wall time to the
// totals of the thread that runs the layers (the kernels' threads work inside a phase, so a
// phase's time is the whole team's wall time for it). Not public: the CLI (mhsa bench --profile)
// and the Python module (mhsa.profile) read it.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace mhsa::nn::profile {

// The phases of a decoder forward: the embedding; the layers' norms (pre and post); the q|k|v
// projection with its rotary positions and q/k norms; the attention itself (the cache written and
// read); the output projection; the MLP's input projections (c_fc, or gate and up), its activation
// (GELU, or the gated product) and its output projection; the residual adds; the final norm and
// the LM head.
enum class Phase : int { embed, norm, qkv, attention, out_proj, mlp_in, activation, mlp_out, residual, head };
inline constexpr int kPhases = static_cast<int>(Phase::head) + 1;  // head is the last
const char* phase_name(Phase p);
// Whether a phase is one per layer (the others are once per forward: embed, head).
bool per_layer(Phase p);

void set_enabled(bool on);
inline std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on{false};
  return on;
}
inline bool enabled() { return enabled_flag().load(std::memory_order_relaxed); }

struct Totals {
  std::array<double, kPhases> seconds{};
  std::array<int64_t, kPhases> calls{};
};
// This thread's totals since its last take(), which starts them again from zero.
Totals take();
void add(Phase p, double seconds);

// Times the code from construction to destruction as phase p (when enabled at construction);
// next(q) ends the running phase and starts q, stop() ends it (none runs until the next next()).
class Scope {
 public:
  explicit Scope(Phase p) : phase_(p), on_(enabled()), running_(on_) {
    if (on_) start_ = clock::now();
  }
  ~Scope() { stop(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  void next(Phase p) {
    stop();
    phase_ = p;
    running_ = on_;
    if (on_) start_ = clock::now();
  }
  void stop() {
    if (running_) add(phase_, std::chrono::duration<double>(clock::now() - start_).count());
    running_ = false;
  }

 private:
  using clock = std::chrono::steady_clock;
  Phase phase_;
  bool on_, running_;
  clock::time_point start_{};
};

}  // namespace mhsa::nn::profile
