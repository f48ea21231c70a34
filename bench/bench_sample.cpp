// bench/bench_sample.cpp — the sampler (Model::sample) on one row of GPT-2-sized logits (50,257,
// normal with standard deviation 2, a fresh copy per draw as a decode step gives), greedy and at
// temperature 1 with and without top_k 40 and top_p 0.9, against a draw that sorts every candidate
// first (the sampler before 2026-12-01, written here as it was: std::sort or partial_sort of the
// ids by logit, then the softmax weights in double in that order; greedy: std::max_element, the
// argmax before 2026-12-01), timed in the same run, rounds alternating. Prints the median microseconds per draw of each. Not a correctness test (those are
// tests/cpp/test_gpt2.cpp's Gpt2Sampler cases).
//
//   bench_sample [rounds = 5] [vocabulary = 50257]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "mhsa/model.h"

namespace {

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The sorted draw (penalties left out: none are set here).
int32_t sorted_draw(const std::vector<float>& logits, const mhsa::GenerationOptions& o, uint64_t& rng) {
  const int64_t V = static_cast<int64_t>(logits.size());
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  const auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  size_t keep = order.size();
  if (o.top_k > 0 && o.top_k < V) {
    keep = static_cast<size_t>(o.top_k);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(), by_logit);
  } else {
    std::sort(order.begin(), order.end(), by_logit);
  }
  const float top = logits[static_cast<size_t>(order[0])];
  std::vector<double> p(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += p[i] = std::exp((double(logits[static_cast<size_t>(order[i])]) - top) / o.temperature);
  if (o.top_p < 1.0f) {
    double mass = 0;
    size_t cut = 0;
    while (cut < keep && mass < o.top_p * total) mass += p[cut++];
    keep = std::max<size_t>(cut, 1);
    total = std::accumulate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  }
  const double u = static_cast<double>(splitmix(rng) >> 11) * 0x1.0p-53 * total;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i)
    if (u < (acc += p[i])) return order[i];
  return order[keep - 1];
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  const size_t V = argc > 2 ? static_cast<size_t>(std::atol(argv[2])) : 50257;
  if (rounds < 1 || V < 1) {
    std::fprintf(stderr, "usage: bench_sample [rounds >= 1] [vocabulary >= 1]\n");
    return 2;
  }
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(V);
  for (float& l : logits) l = normal(gen);
  struct Case {
    const char* name;
    float temperature, top_p;
    int64_t top_k;
  };
  const Case cases[] = {{"greedy", 0.0f, 1.0f, 0}, {"temperature 1", 1.0f, 1.0f, 0}, {"temperature 1, top_k 40", 1.0f, 1.0f, 40},
                        {"temperature 1, top_p 0.9", 1.0f, 0.9f, 0}, {"temperature 1, top_k 40, top_p 0.9", 1.0f, 0.9f, 40}};
  std::printf("sampling one row of %zu logits, %d rounds: median us per draw (a fresh copy of the row each)\n", V, rounds);
  std::printf("%-36s %10s %12s %8s\n", "case", "sampler", "sorted draw", "ratio");
  for (const Case& c : cases) {
    mhsa::GenerationOptions o;
    o.temperature = c.temperature;
    o.top_p = c.top_p;
    o.top_k = c.top_k;
    std::vector<double> ours, sorted;
    uint64_t rng = 1, rng_sorted = 1;
    for (int r = 0; r < rounds; ++r) {
      const int draws = c.temperature > 0 && c.top_k == 0 ? 40 : 400;
      for (int which = 0; which < 2; ++which) {
        const auto t0 = std::chrono::steady_clock::now();
        int64_t sum = 0;
        for (int d = 0; d < draws; ++d) {
          std::vector<float> l = logits;
          if (which == 0) sum += mhsa::Model::sample(l, {}, o, rng);
          else sum += c.temperature > 0 ? sorted_draw(l, o, rng_sorted) : static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
        }
        const double us = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / draws * 1e6;
        static volatile int64_t sink;
        sink = sum;  // (the draws are used)
        (which == 0 ? ours : sorted).push_back(us);
      }
    }
    std::sort(ours.begin(), ours.end());
    std::sort(sorted.begin(), sorted.end());
    const double a = ours[ours.size() / 2], b = sorted[sorted.size() / 2];
    std::printf("%-36s %10.1f %12.1f %7.1fx\n", c.name, a, b, b / a);
  }
}
