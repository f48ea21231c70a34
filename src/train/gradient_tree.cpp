// train/gradient_tree.cpp — the fixed-order gradient sum of train/gradient_tree.h. Gradients travel
// as one flat float array (the tensors of grads end to end); every addition is a[i] + b[i] of a
// left and a right tree node, so one process and N ranks add the same numbers in the same order.
#include "train/gradient_tree.h"

#include <algorithm>
#include <deque>
#include <map>

#include "core/check.h"

namespace mhsa::detail {
namespace {

using Node = std::pair<int64_t, int64_t>;  // rows [lo, hi)

int64_t middle(const Node& n) { return n.first + (n.second - n.first) / 2; }

// The tree's nodes that cover [a, b) exactly, each as large as it can be, left to right.
void cover(const Node& n, int64_t a, int64_t b, std::vector<Node>& out) {
  if (n.second <= a || b <= n.first) return;
  if (a <= n.first && n.second <= b) {
    out.push_back(n);
    return;
  }
  cover({n.first, middle(n)}, a, b, out);
  cover({middle(n), n.second}, a, b, out);
}

void add(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// This rank's rows: each row's gradient computed alone, then summed up the tree.
class LocalSums {
 public:
  LocalSums(const std::function<double(int64_t, std::vector<Tensor>&)>& row_gradient, std::vector<Tensor> scratch,
            std::vector<double>& losses)
      : row_gradient_(row_gradient), scratch_(std::move(scratch)), losses_(losses) {
    for (const Tensor& t : scratch_) size_ += t.numel();
  }
  int64_t size() const { return size_; }

  // The sum of node n's rows' gradients into out[0, size).
  void sum(const Node& n, float* out, size_t depth) {
    if (n.second - n.first == 1) {
      for (Tensor& t : scratch_) std::fill(t.data(), t.data() + t.numel(), 0.0f);
      losses_[static_cast<size_t>(n.first)] = row_gradient_(n.first, scratch_);
      for (const Tensor& t : scratch_) out = std::copy(t.data(), t.data() + t.numel(), out);
      return;
    }
    if (spare_.size() <= depth) spare_.emplace_back(static_cast<size_t>(size_));
    float* right = spare_[depth].data();
    sum({n.first, middle(n)}, out, depth + 1);
    sum({middle(n), n.second}, right, depth + 1);
    add(out, out, right, size_);
  }

 private:
  const std::function<double(int64_t, std::vector<Tensor>&)>& row_gradient_;
  std::vector<Tensor> scratch_;
  std::vector<double>& losses_;
  std::deque<std::vector<float>> spare_;  // a right child's sum per depth
  int64_t size_ = 0;
};

// The tree's root over one slice of the gradient, from the nodes the ranks sent (their slices).
class SliceTree {
 public:
  SliceTree(std::map<Node, const float*> sent, int64_t length) : sent_(std::move(sent)), length_(length) {}
  const float* sum(const Node& n) {
    if (const auto it = sent_.find(n); it != sent_.end()) return it->second;
    const float* left = sum({n.first, middle(n)});
    const float* right = sum({middle(n), n.second});
    float* out = made_.emplace_back(static_cast<size_t>(length_)).data();
    add(out, left, right, length_);
    return out;
  }

 private:
  std::map<Node, const float*> sent_;
  int64_t length_;
  std::deque<std::vector<float>> made_;
};

}  // namespace

std::pair<int64_t, int64_t> rows_of(int64_t rows, int q, int n) { return {rows * q / n, rows * (q + 1) / n}; }

double tree_gradients(Ranks& ranks, int64_t rows,
                      const std::function<double(int64_t row, std::vector<Tensor>& g)>& row_gradient,
                      std::span<const int64_t> slice, std::vector<Tensor>& grads) {
  const int n = ranks.size(), me = ranks.rank();
  const Node root{0, rows};
  std::vector<std::vector<Node>> nodes(static_cast<size_t>(n));  // each rank's nodes, left to right
  for (int q = 0; q < n; ++q) {
    const auto [a, b] = rows_of(rows, q, n);
    cover(root, a, b, nodes[static_cast<size_t>(q)]);
  }
  std::vector<Tensor> scratch;
  for (const Tensor& g : grads) scratch.emplace_back(g.shape());
  std::vector<double> losses(static_cast<size_t>(rows));
  LocalSums local(row_gradient, std::move(scratch), losses);
  const int64_t size = local.size();
  if (slice.size() != static_cast<size_t>(n) + 1 || slice.front() != 0 || slice.back() != size)
    fail("tree_gradients", "slice", message(n + 1, " bounds from 0 to ", size), std::to_string(slice.size()));
  const auto length = [&](int q) { return slice[static_cast<size_t>(q) + 1] - slice[static_cast<size_t>(q)]; };

  // This rank's node sums, then each rank's slice of them (rank-major, node order within).
  const std::vector<Node>& mine = nodes[static_cast<size_t>(me)];
  const int64_t m = static_cast<int64_t>(mine.size());
  std::vector<float> sums(static_cast<size_t>(checked_count("train: gradient nodes", {m, size}, sizeof(float))));
  for (size_t k = 0; k < mine.size(); ++k) local.sum(mine[k], sums.data() + static_cast<int64_t>(k) * size, 0);
  // With one node the slices already lie in rank order; one rank sends to itself.
  std::vector<float> send(m == 1 ? 0 : sums.size());
  std::vector<int64_t> send_counts, recv_counts;
  float* at = send.data();
  for (int q = 0; q < n; ++q) {
    send_counts.push_back(m * length(q));
    for (int64_t k = 0; k < m && m != 1; ++k) {
      const float* from = sums.data() + k * size + slice[static_cast<size_t>(q)];
      at = std::copy(from, from + length(q), at);
    }
    recv_counts.push_back(static_cast<int64_t>(nodes[static_cast<size_t>(q)].size()) * length(me));
  }
  if (m == 1) send = std::move(sums);
  sums = {};
  std::vector<float> recv;
  if (n == 1) {
    recv = std::move(send);
  } else {
    int64_t received = 0;
    for (int64_t c : recv_counts) received += c;
    recv.resize(static_cast<size_t>(received));
    ranks.all_to_all(send, send_counts, recv, recv_counts);
  }
  send = {};

  // The rest of the tree over this rank's slice.
  std::map<Node, const float*> sent;
  const float* from = recv.data();
  for (int q = 0; q < n; ++q)
    for (const Node& node : nodes[static_cast<size_t>(q)]) sent.emplace(node, from), from += length(me);
  SliceTree tree(std::move(sent), length(me));
  const float* x = tree.sum(root);
  const float count = static_cast<float>(rows);
  int64_t at_element = 0;
  for (Tensor& g : grads) {  // this rank's slice of the tensors laid end to end
    const int64_t lo = std::max(at_element, slice[static_cast<size_t>(me)]);
    const int64_t hi = std::min(at_element + g.numel(), slice[static_cast<size_t>(me)] + length(me));
    for (int64_t i = lo; i < hi; ++i) g.data()[i - at_element] = *x++ / count;
    at_element += g.numel();
  }
  std::vector<int64_t> row_counts;
  for (int q = 0; q < n; ++q) {
    const auto [a, b] = rows_of(rows, q, n);
    row_counts.push_back(b - a);
  }
  ranks.all_gather(std::span<double>(losses), row_counts);

  double loss = 0;
  for (double l : losses) loss += l;
  return loss / static_cast<double>(rows);
}

}  // namespace mhsa::detail
