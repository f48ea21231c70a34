// tests/cpp/test_gradient_tree.cpp — train/gradient_tree: the step's gradient is the fixed tree
// sum of its rows' gradients (a node [lo, hi) = [lo, mid) + [mid, hi), mid = lo + (hi - lo) / 2,
// the root divided by the row count), checked bit for bit against that definition written out
// here, with synthetic row gradients of widely spread magnitudes (so that any other order of
// addition gives other bits). Run alone it is one rank; ctest also runs it under
// `mpirun -np 2` and `-np 3` (mpi_data_parallel_*), where each rank must compute only its own rows, get the same bits
// for its slice, and receive no more than a reduce-scatter's minimum, (N-1)/N of the gradient,
// when the ranks divide the rows into whole tree nodes. The row gradients are written as a
// backward writes them, from the last tensor to the first, saying which are final as they go: any
// bucket size must give the same bits (a bucket sent before its tensors were final would not).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "test_util.h"
#include "train/distributed.h"
#include "train/gradient_tree.h"

namespace mhsa {
namespace {

using detail::Ranks;

uint64_t hash(uint64_t x) {
  x = (x ^ (x >> 31)) * 0x7FB5D329728EA185ull;
  x = (x ^ (x >> 27)) * 0x81DADEF4BC2DD44Dull;
  return x ^ (x >> 33);
}

// Row r's gradient element i: a random sign, mantissa and power of two in [2^-12, 2^12].
float element(uint64_t seed, int64_t r, int64_t i) {
  const uint64_t h = hash(seed ^ hash(static_cast<uint64_t>(r) * 1000003u + static_cast<uint64_t>(i)));
  const float mantissa = 1.0f + static_cast<float>(h & 0xFFFFFF) / float(1 << 24);
  const int exponent = static_cast<int>((h >> 24) % 25) - 12;
  return ((h >> 40) & 1 ? -1.0f : 1.0f) * std::ldexp(mantissa, exponent);
}

std::vector<float> tree(uint64_t seed, int64_t lo, int64_t hi, int64_t size) {
  std::vector<float> out(static_cast<size_t>(size));
  if (hi - lo == 1) {
    for (int64_t i = 0; i < size; ++i) out[static_cast<size_t>(i)] = element(seed, lo, i);
    return out;
  }
  const int64_t mid = lo + (hi - lo) / 2;
  const std::vector<float> a = tree(seed, lo, mid, size), b = tree(seed, mid, hi, size);
  for (size_t i = 0; i < out.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

void check_tree_sum(int64_t rows, const std::vector<std::vector<int64_t>>& shapes, uint64_t seed,
                    int64_t bucket_elements) {
  Ranks& ranks = Ranks::world();
  std::vector<Tensor> grads;
  int64_t size = 0;
  for (const auto& s : shapes) size += grads.emplace_back(s).numel();
  std::vector<int64_t> called;
  const auto row_gradient = [&](int64_t r, std::vector<Tensor>& g, const std::function<void(size_t)>& on_final) {
    called.push_back(r);
    int64_t end = size;
    for (size_t j = g.size(); j-- > 0;) {  // the last tensor first, as a backward goes
      Tensor& t = g[j];
      end -= t.numel();
      for (int64_t k = 0; k < t.numel(); ++k) {
        EXPECT_EQ(t.data()[k], 0.0f);
        t.data()[k] += element(seed, r, end + k);
      }
      if (on_final && j % 2 == 0) on_final(j);  // not after every tensor
    }
    return 0.25 * static_cast<double>(r) + 1.0;
  };
  const int n = ranks.size(), me = ranks.rank();
  std::vector<int64_t> slice;  // an even split
  for (int q = 0; q <= n; ++q) slice.push_back(size * q / n);
  const int64_t bytes_before = ranks.bytes_received();
  const double loss = detail::tree_gradients(ranks, rows, row_gradient, slice, bucket_elements, grads);

  const auto [first, last] = detail::rows_of(rows, ranks.rank(), ranks.size());
  std::vector<int64_t> mine;
  for (int64_t r = first; r < last; ++r) mine.push_back(r);
  EXPECT_EQ(called, mine) << "rank " << ranks.rank() << " computes its own rows, in order";
  double want_loss = 0;
  for (int64_t r = 0; r < rows; ++r) want_loss += 0.25 * static_cast<double>(r) + 1.0;
  EXPECT_EQ(loss, want_loss / static_cast<double>(rows));
  const std::vector<float> want = tree(seed, 0, rows, size);
  int64_t i = 0, differ = 0;
  for (const Tensor& g : grads)
    for (int64_t k = 0; k < g.numel(); ++k, ++i) {
      const bool own = slice[static_cast<size_t>(me)] <= i && i < slice[static_cast<size_t>(me) + 1];
      differ += g.data()[k] != (own ? want[static_cast<size_t>(i)] / float(rows) : 0.0f);
    }
  EXPECT_EQ(differ, 0) << "of " << size << " elements, rows " << rows << ", rank " << me << ", buckets of "
                       << bucket_elements;

  if (n > 1 && rows % n == 0 && (n & (n - 1)) == 0) {  // one tree node per rank: the minimum traffic
    const double minimum = double(n - 1) / n * double(size) * sizeof(float);  // a reduce-scatter's
    const double losses = double(rows - rows / n) * sizeof(double), rounding = 2.0 * n * sizeof(float);
    EXPECT_LE(double(ranks.bytes_received() - bytes_before), minimum + losses + rounding);
  }
}

TEST(GradientTree, IsTheFixedTreeSumOfTheRowsForAnyRankCount) {
  std::mt19937_64 gen = test::test_rng();
  // Every rank must draw the same sizes: rank 0's generator state decides.
  const uint64_t seed = std::stoull(Ranks::world().broadcast(std::to_string(gen())));
  std::mt19937_64 shared(seed);
  const auto draw = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(shared); };
  for (int64_t rows : {int64_t{1}, int64_t{2}, draw(3, 17), int64_t{12}}) {
    const std::vector<std::vector<int64_t>> shapes = {{draw(1, 40), draw(1, 9)}, {draw(1, 300)}, {7}, {draw(1, 50)}};
    for (int64_t bucket : {int64_t{0}, int64_t{1}, draw(2, 400)}) check_tree_sum(rows, shapes, shared(), bucket);
  }
}

TEST(GradientTree, RowsSplitIntoContiguousBalancedRanges) {
  for (int n = 1; n <= 5; ++n)
    for (int64_t rows = 0; rows <= 11; ++rows) {
      int64_t next = 0;
      for (int q = 0; q < n; ++q) {
        const auto [a, b] = detail::rows_of(rows, q, n);
        EXPECT_EQ(a, next);
        EXPECT_GE(b - a, rows / n);
        EXPECT_LE(b - a, (rows + n - 1) / n);
        next = b;
      }
      EXPECT_EQ(next, rows);
    }
}

}  // namespace
}  // namespace mhsa
