// train/sharded_adamw.cpp — ZeRO stage 1 (see train/sharded_adamw.h). A tensor's part in a shard
// starts at one of its chunk boundaries and ends at one or at the tensor's end, so the AdamW
// kernel sees the same SIMD lanes and tail as for the whole tensor.
#include "train/sharded_adamw.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kernels/dispatch.h"

namespace mhsa::detail {
namespace {

// Calls f(i, lo, hi) for each tensor i with part of [begin, end): its elements [lo, hi).
template <class F>
void for_each_part(const std::vector<int64_t>& offsets, int64_t begin, int64_t end, F f) {
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    const int64_t lo = std::max(begin, offsets[i]), hi = std::min(end, offsets[i + 1]);
    if (lo < hi) f(i, lo - offsets[i], hi - offsets[i]);
  }
}

std::vector<int64_t> offsets_of(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offsets{0};
  for (int64_t n : sizes) offsets.push_back(offsets.back() + n);
  return offsets;
}

std::vector<int64_t> sizes_of(const std::vector<std::pair<std::string, Tensor*>>& params) {
  std::vector<int64_t> sizes;
  for (const auto& [name, t] : params) sizes.push_back(t->numel());
  return sizes;
}

std::vector<int64_t> bounds_for(const std::vector<int64_t>& sizes, int n) {
  std::vector<int64_t> starts;  // every chunk's start in the flat space, then the end
  int64_t at = 0;
  for (int64_t size : sizes) {
    for (int64_t c = 0; c < size; c += kNormChunk) starts.push_back(at + c);
    at += size;
  }
  starts.push_back(at);
  std::vector<int64_t> bounds{0};
  for (int q = 1; q < n; ++q) {
    const int64_t target = at * q / n;
    auto it = std::lower_bound(starts.begin(), starts.end(), target);
    if (it != starts.begin() && target - *std::prev(it) < *it - target) --it;
    bounds.push_back(std::max(bounds.back(), *it));
  }
  bounds.push_back(at);
  return bounds;
}

}  // namespace

std::vector<double> chunk_square_sums(const float* x, int64_t n) {
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> part(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0;
    for (int64_t i = c * kNormChunk, end = std::min(n, i + kNormChunk); i < end; ++i) s += double(x[i]) * x[i];
    part[static_cast<size_t>(c)] = s;
  }
  return part;
}

std::vector<int64_t> shard_bounds(const std::vector<Tensor>& like, int n) {
  std::vector<int64_t> sizes;
  for (const Tensor& t : like) sizes.push_back(t.numel());
  return bounds_for(sizes, n);
}

ShardedAdamW::ShardedAdamW(const std::vector<std::pair<std::string, Tensor*>>& params, AdamWOptions options,
                           Ranks& ranks)
    : options_(options), ranks_(ranks), bounds_(bounds_for(sizes_of(params), ranks.size())),
      offsets_(offsets_of(sizes_of(params))) {
  options.validate("AdamW");
  begin_ = bounds_[static_cast<size_t>(ranks.rank())];
  end_ = bounds_[static_cast<size_t>(ranks.rank()) + 1];
  for (int q = 0; q < ranks.size(); ++q) {
    int64_t chunks = 0;
    for_each_part(offsets_, bounds_[static_cast<size_t>(q)], bounds_[static_cast<size_t>(q) + 1],
                  [&](size_t, int64_t lo, int64_t hi) { chunks += (hi - lo + kNormChunk - 1) / kNormChunk; });
    chunks_.push_back(chunks);
  }
  m_.assign(static_cast<size_t>(end_ - begin_), 0.0f);
  v_.assign(static_cast<size_t>(end_ - begin_), 0.0f);
}

double ShardedAdamW::clip(std::vector<Tensor>& grads, double max_norm) {
  int64_t total = 0, first = 0;
  for (int q = 0; q < ranks_.size(); ++q) {
    if (q == ranks_.rank()) first = total;
    total += chunks_[static_cast<size_t>(q)];
  }
  std::vector<double> sums(static_cast<size_t>(total));
  auto at = sums.begin() + first;
  for_each_part(offsets_, begin_, end_, [&](size_t i, int64_t lo, int64_t hi) {
    const std::vector<double> part = chunk_square_sums(grads[i].data() + lo, hi - lo);
    at = std::copy(part.begin(), part.end(), at);
  });
  ranks_.all_gather(std::span<double>(sums), chunks_);
  double sum = 0;
  for (double s : sums) sum += s;
  const double norm = std::sqrt(sum);
  if (max_norm > 0 && norm > max_norm) {
    const float scale = static_cast<float>(max_norm / norm);
    for_each_part(offsets_, begin_, end_, [&](size_t i, int64_t lo, int64_t hi) {
      float* x = grads[i].data();
#pragma omp parallel for schedule(static) if (hi - lo >= kNormChunk)
      for (int64_t k = lo; k < hi; ++k) x[k] *= scale;
    });
  }
  return norm;
}

void ShardedAdamW::step(const std::vector<std::pair<std::string, Tensor*>>& params, const std::vector<Tensor>& grads,
                        float lr) {
  ++steps_;
  const double c1 = 1.0 - std::pow(double(options_.beta1), double(steps_));
  const double c2 = 1.0 - std::pow(double(options_.beta2), double(steps_));
  const kernels::KernelTable& k = kernels::kernels();
  for_each_part(offsets_, begin_, end_, [&](size_t i, int64_t lo, int64_t hi) {
    Tensor& p = *params[i].second;
    const float decay = p.shape().size() >= 2 ? lr * options_.weight_decay : 0.0f;  // matrices only
    const int64_t s = offsets_[i] + lo - begin_;
    k.adamw(hi - lo, p.data() + lo, grads[i].data() + lo, m_.data() + s, v_.data() + s, lr, decay, options_.beta1,
            options_.beta2, static_cast<float>(1.0 / c1), static_cast<float>(1.0 / c2), options_.eps);
  });
  if (ranks_.size() == 1) return;
  std::vector<float> flat(static_cast<size_t>(offsets_.back()));
  for_each_part(offsets_, begin_, end_, [&](size_t i, int64_t lo, int64_t hi) {
    std::copy(params[i].second->data() + lo, params[i].second->data() + hi, flat.begin() + offsets_[i] + lo);
  });
  std::vector<int64_t> lengths;
  for (size_t q = 0; q + 1 < bounds_.size(); ++q) lengths.push_back(bounds_[q + 1] - bounds_[q]);
  ranks_.all_gather(std::span<float>(flat), lengths);
  for (size_t i = 0; i < params.size(); ++i)
    std::copy(flat.begin() + offsets_[i], flat.begin() + offsets_[i + 1], params[i].second->data());
}

void ShardedAdamW::gather(AdamW* whole) {
  std::vector<int64_t> lengths;
  for (size_t q = 0; q + 1 < bounds_.size(); ++q) lengths.push_back(bounds_[q + 1] - bounds_[q]);
  std::vector<float> flat(whole != nullptr ? static_cast<size_t>(offsets_.back()) : 0);
  for (const bool first : {true, false}) {
    ranks_.gather(first ? m_ : v_, flat, lengths);
    if (whole != nullptr) {
      std::vector<Tensor>& tensors = first ? whole->first_moments() : whole->second_moments();
      for (size_t i = 0; i < tensors.size(); ++i)
        std::copy(flat.begin() + offsets_[i], flat.begin() + offsets_[i + 1], tensors[i].data());
    }
  }
  if (whole != nullptr) whole->set_steps(steps_);
}

void ShardedAdamW::load(AdamW& w) {
  for_each_part(offsets_, begin_, end_, [&](size_t i, int64_t lo, int64_t hi) {
    const int64_t s = offsets_[i] + lo - begin_;
    std::copy(w.first_moments()[i].data() + lo, w.first_moments()[i].data() + hi, m_.begin() + s);
    std::copy(w.second_moments()[i].data() + lo, w.second_moments()[i].data() + hi, v_.begin() + s);
  });
  steps_ = w.steps();
}

}  // namespace mhsa::detail
