// train/gradient_tree.h — a step's gradient as one fixed sum over the rows of its global batch,
// whatever the number of ranks (and threads): the same bits from one process and from
// `mpirun -np N`. Each row's gradient is computed alone; the rows are summed by a fixed binary
// tree (a node [lo, hi) is [lo, mid) + [mid, hi), mid = lo + (hi - lo) / 2). Rank q computes the
// contiguous rows rows_of(rows, q, N), sums the tree's nodes that lie within them, and sends each
// rank its slice of those partial sums (an all-to-all: with one node per rank, (N-1)/N of the
// gradient); each rank finishes the tree for its own slice: a reduce-scatter with the arithmetic
// order of one process. (ZeRO-1 then updates each slice where it lies and gathers the weights:
// train/sharded_adamw.h.) Not the optimiser nor the batches (train/trainer.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "mhsa/tensor.h"
#include "train/distributed.h"

namespace mhsa::detail {

// The rows [first, last) of `rows` that rank q of n computes: contiguous, balanced.
std::pair<int64_t, int64_t> rows_of(int64_t rows, int q, int n);

// The mean loss over rows 0..rows-1 (returned on every rank) and this rank's slice of their mean
// gradient, the same bits for any number of ranks. row_gradient(r, g) returns row r's loss and
// adds its gradient into g (zero tensors shaped like grads); this rank calls it for its own rows
// only, in order. grads (shaped like the parameters) receives the mean gradient on elements
// [slice[rank], slice[rank + 1]) of its tensors laid end to end and is left as it was elsewhere;
// slice: N + 1 bounds from 0 to the gradient's size.
double tree_gradients(Ranks& ranks, int64_t rows,
                      const std::function<double(int64_t row, std::vector<Tensor>& g)>& row_gradient,
                      std::span<const int64_t> slice, std::vector<Tensor>& grads);

}  // namespace mhsa::detail
