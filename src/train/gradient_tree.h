// train/gradient_tree.h — a step's gradient as one fixed sum over the rows of its global batch,
// whatever the number of ranks (and threads): the same bits from one process and from
// `mpirun -np N`. Each row's gradient is computed alone; the rows are summed by a fixed binary
// tree (a node [lo, hi) is [lo, mid) + [mid, hi), mid = lo + (hi - lo) / 2). Rank q computes the
// contiguous rows rows_of(rows, q, N), sums the tree's nodes that lie within them, and sends each
// rank its slice of those partial sums (an all-to-all: with one node per rank, (N-1)/N of the
// gradient); each rank finishes the tree for its slice and the slices are gathered (another
// (N-1)/N): the ring all-reduce's minimum traffic, 2(N-1)/N of the gradient, with the
// arithmetic order of one process. Not the optimiser nor the batches (train/trainer.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "mhsa/tensor.h"
#include "train/distributed.h"

namespace mhsa::detail {

// The rows [first, last) of `rows` that rank q of n computes: contiguous, balanced.
std::pair<int64_t, int64_t> rows_of(int64_t rows, int q, int n);

// The mean loss and mean gradient over rows 0..rows-1, the same bits on every rank and for any
// number of ranks. row_gradient(r, g) returns row r's loss and adds its gradient into g (zero
// tensors shaped like grads); this rank calls it for its own rows only, in order. grads (shaped like
// the parameters) receives the mean gradient.
double tree_gradients(Ranks& ranks, int64_t rows,
                      const std::function<double(int64_t row, std::vector<Tensor>& g)>& row_gradient,
                      std::vector<Tensor>& grads);

}  // namespace mhsa::detail
