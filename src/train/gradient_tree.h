// train/gradient_tree.h — a step's gradient as one fixed sum over the rows of its global batch,
// whatever the number of ranks (and threads): the same bits from one process and from
// `mpirun -np N`. Each row's gradient is computed alone; the rows are summed by a fixed binary
// tree (a node [lo, hi) is [lo, mid) + [mid, hi), mid = lo + (hi - lo) / 2). Rank q computes the
// contiguous rows rows_of(rows, q, N), sums the tree's nodes that lie within them, and sends each
// rank its slice of those partial sums (an all-to-all: with one node per rank, (N-1)/N of the
// gradient); each rank finishes the tree for its own slice: a reduce-scatter with the arithmetic
// order of one process. (ZeRO-1 then updates each slice where it lies and gathers the weights:
// train/sharded_adamw.h.) Not the optimiser nor the batches (train/trainer.cpp).
//
// The all-to-all goes in buckets of whole tensors, overlapped with the backward of the rank's last
// row: the backward says which tensors' gradients are final (from the last tensor down: the
// output's side first), and as soon as a bucket's are, the additions that finish its elements'
// node sums are done and its all-to-all starts (non-blocking); every bucket is received before
// the tree is finished. The additions are element by element, so the buckets change no bits.
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

// row_gradient(r, g, on_final) returns row r's loss and adds its gradient into g (zero tensors
// shaped like grads); on_final(first), which it may call (on this thread, between parallel
// regions) with decreasing first, says that g[first..] are final.
using RowGradient =
    std::function<double(int64_t row, std::vector<Tensor>& g, const std::function<void(size_t first)>& on_final)>;

// The mean loss over rows 0..rows-1 (returned on every rank) and this rank's slice of their mean
// gradient, the same bits for any number of ranks and any bucket size. This rank calls
// row_gradient for its own rows only, in order. grads (shaped like the parameters) receives the
// mean gradient on elements [slice[rank], slice[rank + 1]) of its tensors laid end to end and is
// left as it was elsewhere; slice: N + 1 bounds from 0 to the gradient's size. bucket_elements:
// the all-to-all's buckets hold whole tensors, at least this many elements each (but the first);
// 0: one bucket, after the backward.
double tree_gradients(Ranks& ranks, int64_t rows, const RowGradient& row_gradient, std::span<const int64_t> slice,
                      int64_t bucket_elements, std::vector<Tensor>& grads);

}  // namespace mhsa::detail
