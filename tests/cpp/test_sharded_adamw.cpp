// tests/cpp/test_sharded_adamw.cpp — train/sharded_adamw (ZeRO stage 1): each rank holding only
// its shard of AdamW's moments gives, on every rank, the bits of clip_gradients + AdamW::step over
// the whole model: the same global norm, the same weights after a few steps, and (gathered on rank
// 0) the same moments; each rank's moments are 1/N of the whole, and a step receives only the
// other ranks' shards of the weights. Tensors larger than the norm's
// 65536-element chunks, odd sizes, a matrix (weight decay) and vectors (none). Run alone it is one
// rank; ctest runs it under `mpirun -np 2` and `-np 3` too (mpi_data_parallel_*).
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "test_util.h"
#include "train/distributed.h"
#include "train/sharded_adamw.h"

namespace mhsa {
namespace {

using detail::Ranks;

TEST(ShardedAdamW, GivesTheWholeOptimizersBitsWithOneNthOfItsMoments) {
  Ranks& ranks = Ranks::world();
  // Every rank draws the same model and gradients: rank 0's seed decides.
  std::mt19937_64 gen(std::stoull(ranks.broadcast(std::to_string(test::test_rng()()))));
  const auto draw = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); };
  std::vector<Tensor> ours, theirs;
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {draw(200, 400), draw(300, 500)}, {draw(1, 70000)}, {draw(65537, 140000)}, {33}}) {
    ours.push_back(test::random_tensor(gen, shape));
    theirs.push_back(ours.back());
  }
  std::vector<std::pair<std::string, Tensor*>> p_ours, p_theirs;
  for (size_t i = 0; i < ours.size(); ++i) {
    p_ours.emplace_back("t" + std::to_string(i), &ours[i]);
    p_theirs.emplace_back("t" + std::to_string(i), &theirs[i]);
  }
  const AdamWOptions options{0.9f, 0.95f, 1e-8f, 0.1f};
  detail::ShardedAdamW sharded(p_ours, options, ranks);
  int64_t total = 0;
  for (const Tensor& t : ours) total += t.numel();
  AdamW whole(p_theirs, options);
  for (int step = 0; step < 3; ++step) {
    std::vector<Tensor> g_ours, g_theirs;
    for (const Tensor& t : ours) g_theirs.push_back(test::random_tensor(gen, t.shape(), 3.0f));
    g_ours = g_theirs;
    const double clip = step == 1 ? 1e9 : 0.5;  // step 1: no clipping
    EXPECT_EQ(sharded.clip(g_ours, clip), clip_gradients(g_theirs, clip));
    const int64_t before = ranks.bytes_received();
    sharded.step(p_ours, g_ours, 1e-2f);
    const int64_t own = sharded.bounds()[size_t(ranks.rank()) + 1] - sharded.bounds()[size_t(ranks.rank())];
    EXPECT_EQ(ranks.bytes_received() - before, ranks.size() == 1 ? 0 : (total - own) * int64_t(sizeof(float)))
        << "the weights gathered: every other rank's shard, once";
    whole.step(p_theirs, g_theirs, 1e-2f);
    for (size_t i = 0; i < ours.size(); ++i)
      EXPECT_EQ(0, std::memcmp(ours[i].data(), theirs[i].data(), sizeof(float) * size_t(ours[i].numel())))
          << "tensor " << i << " after step " << step << " on rank " << ranks.rank();
  }
  EXPECT_NEAR(double(sharded.moment_bytes()), 2.0 * sizeof(float) * double(total) / ranks.size(),
              2.0 * sizeof(float) * 65536);

  std::optional<AdamW> gathered;
  if (ranks.rank() == 0) gathered.emplace(p_theirs, options);
  sharded.gather(gathered ? &*gathered : nullptr);
  if (gathered) {
    EXPECT_EQ(gathered->steps(), 3);
    for (size_t i = 0; i < ours.size(); ++i)
      for (const auto& [a, b] : {std::pair{&gathered->first_moments()[i], &whole.first_moments()[i]},
                                 std::pair{&gathered->second_moments()[i], &whole.second_moments()[i]}})
        EXPECT_EQ(0, std::memcmp(a->data(), b->data(), sizeof(float) * size_t(a->numel()))) << "moments of " << i;
  }
  // A shard loaded from the whole state goes on as the whole optimiser does.
  detail::ShardedAdamW reloaded(p_ours, options, ranks);
  reloaded.load(whole);
  std::vector<Tensor> g;
  for (const Tensor& t : ours) g.push_back(test::random_tensor(gen, t.shape()));
  reloaded.step(p_ours, g, 1e-3f);
  whole.step(p_theirs, g, 1e-3f);
  for (size_t i = 0; i < ours.size(); ++i)
    EXPECT_EQ(0, std::memcmp(ours[i].data(), theirs[i].data(), sizeof(float) * size_t(ours[i].numel())));
}

TEST(ShardedAdamW, ShardsAreContiguousAtChunkBoundaries) {
  const std::vector<Tensor> like = {Tensor({3, 70000}), Tensor({5}), Tensor({140000})};
  const int64_t size = 3 * 70000 + 5 + 140000;
  for (int n = 1; n <= 9; ++n) {
    const std::vector<int64_t> b = detail::shard_bounds(like, n);
    ASSERT_EQ(b.size(), size_t(n) + 1);
    EXPECT_EQ(b.front(), 0);
    EXPECT_EQ(b.back(), size);
    for (int q = 0; q < n; ++q) {
      EXPECT_LE(b[q], b[q + 1]);
      const int64_t x = b[q + 1];  // a chunk start within a tensor, or a tensor's start
      const bool ok = x == size || (x < 210000 && x % 65536 == 0) || x == 210000 ||
                      (x >= 210005 && (x - 210005) % 65536 == 0);
      EXPECT_TRUE(ok) << x;
      if (n <= 5) EXPECT_NEAR(double(b[q + 1] - b[q]), double(size) / n, 65536.0);  // near even
    }
  }
}

}  // namespace
}  // namespace mhsa
