// bench/bench_decode_attention.cpp — the batched decode attention of a serving step, alone: S
// sequences of one query row each, every one over its own L cached keys and values, in one
// scaled_dot_product_attention call (as nn/block.cpp's attend_sequences makes it for Model::step).
// `mhsa bench --model DIR --batch 8 --paged 16 --depth 512 --profile` puts this call at ~45% of a
// GPT-2 step on the development machine, reading the cache at ~17 GB/s; this harness asks why,
// outside the model.
//
// Two layouts of the same keys and values, timed alternately in one process, medians of the rounds:
//   paged: the pool's layout (nn/kv_pool.cpp): blocks of 16 tokens, each holding every layer's keys
//          then values ([Hkv][16][D] each), the sequences' blocks interleaved as a server grows them;
//          a head's 16 keys are one 4 KiB run, the next 16 a whole block (every layer) further on.
//   contiguous: each sequence's cache as one [Hkv][L][D] run per layer (KVCache's layout).
// Before each call the caches are evicted by reading 64 MiB (a decode step streams its weights
// between one layer's attention and the next), so the rate is the cache's bytes from memory.
// Not a test: it prints times and rates.
//
//   bench_decode_attention [L = 580] [S = 8] [heads = 12] [kv heads = 12] [layers = 12] [rounds = 30]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "mhsa/attention.h"
#include "mhsa/tensor.h"

namespace {

constexpr int64_t kBlockTokens = 16, kD = 64;

int64_t arg(int argc, char** argv, int i, int64_t fallback) { return argc > i ? std::atoll(argv[i]) : fallback; }

}  // namespace

int main(int argc, char** argv) {
  const int64_t L = arg(argc, argv, 1, 580), S = arg(argc, argv, 2, 8), H = arg(argc, argv, 3, 12),
                Hkv = arg(argc, argv, 4, 12), layers = arg(argc, argv, 5, 12), rounds = arg(argc, argv, 6, 30);
  if (L < 1 || S < 1 || Hkv < 1 || H < Hkv || H % Hkv != 0 || layers < 1 || rounds < 1) {
    std::fprintf(stderr, "usage: bench_decode_attention [L >= 1] [S >= 1] [heads] [kv heads dividing heads] [layers] [rounds]\n");
    return 2;
  }
  using namespace mhsa;
  const int64_t blocks = (L + kBlockTokens - 1) / kBlockTokens, block_floats = Hkv * kBlockTokens * kD;
  // paged: block (b, s) is pool block b·S + s, of 2·layers·block_floats floats; layer 0's keys first.
  std::vector<float> pool(static_cast<size_t>(blocks * S * 2 * layers * block_floats));
  std::vector<float> flat(static_cast<size_t>(S * 2 * Hkv * L * kD));  // contiguous: [S][k|v][Hkv][L][D]
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = 0.01f * static_cast<float>(i % 17);
  std::vector<std::vector<const float*>> kb(static_cast<size_t>(S)), vb(static_cast<size_t>(S));
  std::vector<PagedKVOf<float>> paged(static_cast<size_t>(S));
  std::vector<Tensor> q, out;
  std::vector<AttentionBatchItem<float>> as_pages(static_cast<size_t>(S)), as_runs(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) {
    const size_t i = static_cast<size_t>(s);
    for (int64_t b = 0; b < blocks; ++b) {
      const float* block = pool.data() + (b * S + s) * 2 * layers * block_floats;
      kb[i].push_back(block);
      vb[i].push_back(block + block_floats);
      for (int64_t h = 0; h < Hkv; ++h)  // the same values in the contiguous copy
        for (int64_t t = b * kBlockTokens; t < std::min(L, (b + 1) * kBlockTokens); ++t)
          for (int64_t d = 0; d < kD; ++d) {
            const int64_t in_block = (h * kBlockTokens + t % kBlockTokens) * kD + d;
            flat[static_cast<size_t>(((s * 2 + 0) * Hkv + h) * L * kD + t * kD + d)] = block[in_block];
            flat[static_cast<size_t>(((s * 2 + 1) * Hkv + h) * L * kD + t * kD + d)] = block[block_floats + in_block];
          }
    }
    paged[i] = PagedKVOf<float>{kb[i], vb[i], kBlockTokens, L, Hkv, kD, kD};
    q.emplace_back(std::vector<int64_t>{1, H, 1, kD});
    out.emplace_back(std::vector<int64_t>{1, H, 1, kD});
    for (int64_t e = 0; e < H * kD; ++e) q.back().data()[e] = 0.01f * static_cast<float>(e % 5);
    as_pages[i] = {q[i].view(), {}, {}, &paged[i], out[i].view()};
    const float* k = flat.data() + s * 2 * Hkv * L * kD;
    const View<const float> kv_k(k, {1, Hkv, L, kD}), kv_v(k + Hkv * L * kD, {1, Hkv, L, kD});
    as_runs[i] = {q[i].view(), kv_k, kv_v, nullptr, out[i].view()};
  }
  AttentionOptions options;
  options.causal = true;
  std::vector<float> evict(size_t{64} << 18);  // 64 MiB
  float sink = 0;
  const auto time_one = [&](const std::vector<AttentionBatchItem<float>>& items) {
    for (size_t j = 0; j < evict.size(); j += 16) sink += (evict[j] += 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    scaled_dot_product_attention<float>(std::span<const AttentionBatchItem<float>>(items), options);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> t_pages, t_runs;
  for (int64_t r = 0; r <= rounds; ++r) {
    const double a = time_one(as_pages), b = time_one(as_runs);
    if (r > 0) t_pages.push_back(a), t_runs.push_back(b);  // round 0 warms up
  }
  const double bytes = 2.0 * S * L * Hkv * kD * sizeof(float);
  std::printf("bench_decode_attention: %d thread(s), S %lld sequences of L %lld keys, %lld/%lld heads, D %lld: "
              "%.2f MB of keys and values per call, from memory\n",
              omp_get_max_threads(), static_cast<long long>(S), static_cast<long long>(L), static_cast<long long>(H),
              static_cast<long long>(Hkv), static_cast<long long>(kD), bytes / 1e6);
  for (auto [name, t] : {std::pair{"paged (16-token blocks)", &t_pages}, std::pair{"contiguous", &t_runs}}) {
    std::sort(t->begin(), t->end());
    const double median = (*t)[t->size() / 2];
    std::printf("  %-24s median %8.1f us  best %8.1f us  %5.1f GB/s\n", name, median * 1e6, t->front() * 1e6,
                bytes / median / 1e9);
  }
  std::printf("  (eviction checksum %g)\n", static_cast<double>(sink));  // keeps the eviction reads
  return 0;
}
