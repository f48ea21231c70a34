// train/optimizer.cpp — the optimiser side of a training step (see mhsa/train.h): AdamW, global
// gradient-norm clipping and the learning-rate schedule. The state is one pair of moments per
// parameter tensor, updated tensor by tensor (a data-parallel run shards them: train/sharded_adamw.h);
// the gradient norm is a float64 sum in a fixed order.
#include "mhsa/train.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kernels/dispatch.h"
#include "train/options.h"
#include "train/sharded_adamw.h"

namespace mhsa {

using detail::check_range;
using detail::fail;
using detail::message;

void AdamWOptions::validate(std::string_view fn) const {
  constexpr double inf = HUGE_VAL;
  check_range(fn, "beta1", beta1, 0, 1, false, true);
  check_range(fn, "beta2", beta2, 0, 1, false, true);
  check_range(fn, "eps", eps, 0, inf, true);
  check_range(fn, "weight_decay", weight_decay, 0, inf);
}

AdamW::AdamW(const std::vector<std::pair<std::string, Tensor*>>& params, AdamWOptions options) : options_(options) {
  options.validate("AdamW");
  for (const auto& [name, t] : params) {
    m_.emplace_back(t->shape());
    v_.emplace_back(t->shape());
  }
}

void AdamW::step(const std::vector<std::pair<std::string, Tensor*>>& params, const std::vector<Tensor>& grads,
                 float lr) {
  if (params.size() != m_.size() || grads.size() != m_.size())
    fail("AdamW::step", "grads", message(m_.size(), " tensors"), std::to_string(grads.size()));
  for (size_t i = 0; i < params.size(); ++i)
    if (grads[i].shape() != params[i].second->shape() || m_[i].shape() != params[i].second->shape())
      fail("AdamW::step", message("grads[", i, "]"), "the shape of " + params[i].first, "another shape");
  ++steps_;
  const double c1 = 1.0 - std::pow(double(options_.beta1), double(steps_));
  const double c2 = 1.0 - std::pow(double(options_.beta2), double(steps_));
  const kernels::KernelTable& k = kernels::kernels();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor& p = *params[i].second;
    const float decay = p.shape().size() >= 2 ? lr * options_.weight_decay : 0.0f;  // matrices only
    k.adamw(p.numel(), p.data(), grads[i].data(), m_[i].data(), v_[i].data(), lr, decay, options_.beta1,
            options_.beta2, static_cast<float>(1.0 / c1), static_cast<float>(1.0 / c2), options_.eps);
  }
}

// The squares are summed in float64 over fixed chunks of each tensor, in parallel, and the chunks'
// sums in order (train/sharded_adamw.h: a sharded run sums the same chunks): the same norm for any
// thread count.
double clip_gradients(std::vector<Tensor>& grads, double max_norm) {
  constexpr int64_t kChunk = detail::kNormChunk;
  double sum = 0;
  for (const Tensor& g : grads)
    for (double s : detail::chunk_square_sums(g.data(), g.numel())) sum += s;
  const double norm = std::sqrt(sum);
  if (max_norm > 0 && norm > max_norm) {
    const float scale = static_cast<float>(max_norm / norm);
    for (Tensor& g : grads) {
      float* x = g.data();
      const int64_t n = g.numel();
#pragma omp parallel for schedule(static) if (n >= kChunk)
      for (int64_t i = 0; i < n; ++i) x[i] *= scale;
    }
  }
  return norm;
}

float learning_rate(const TrainOptions& o, int64_t step) {
  if (step < o.warmup) return o.lr * static_cast<float>(step + 1) / static_cast<float>(o.warmup);
  const double span = std::max<int64_t>(1, o.schedule_length() - o.warmup);
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup) / span);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return static_cast<float>(o.lr * (o.min_lr_ratio + (1.0 - o.min_lr_ratio) * cosine));
}

}  // namespace mhsa
