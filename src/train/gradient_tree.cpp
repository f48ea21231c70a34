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

// Tensors [first, last) of the gradient, elements [begin, end) of it laid end to end.
struct Bucket {
  size_t first, last;
  int64_t begin, end;
};

// Whole tensors from the last one down, each bucket closed at bucket_elements or more (0: one).
std::vector<Bucket> buckets_of(const std::vector<int64_t>& offsets, int64_t bucket_elements) {
  std::vector<Bucket> out;
  size_t last = offsets.size() - 1;
  for (size_t i = last; i-- > 0;)
    if (i == 0 || (bucket_elements > 0 && offsets[last] - offsets[i] >= bucket_elements)) {
      out.push_back({i, last, offsets[i], offsets[last]});
      last = i;
    }
  std::reverse(out.begin(), out.end());
  return out;
}

// This rank's rows: each row's gradient computed alone, then summed up the tree. For the rank's
// last node the additions on the path from its last row up are deferred and done bucket by
// bucket, as the last row's backward makes each bucket final: finished(b) then sees bucket b of
// that node's sum complete (in buckets' descending order; once each).
class LocalSums {
 public:
  LocalSums(Ranks& ranks, const RowGradient& row_gradient, std::vector<Tensor> scratch, std::vector<double>& losses,
            const std::vector<Bucket>& buckets, std::function<void(size_t)> finished)
      : ranks_(ranks), row_gradient_(row_gradient), scratch_(std::move(scratch)), losses_(losses), buckets_(buckets),
        finished_(std::move(finished)), next_(buckets.size()) {
    for (const Tensor& t : scratch_) size_ += t.numel();
  }
  int64_t size() const { return size_; }

  // The sum of node n's rows' gradients into out[0, size); last: n is the rank's last node.
  void sum(const Node& n, float* out, size_t depth, bool last) {
    if (n.second - n.first == 1) {
      for (Tensor& t : scratch_) std::fill(t.data(), t.data() + t.numel(), 0.0f);
      const size_t row = static_cast<size_t>(n.first);
      if (!last) {
        losses_[row] = row_gradient_(n.first, scratch_, {});
        for (const Tensor& t : scratch_) out = std::copy(t.data(), t.data() + t.numel(), out);
        return;
      }
      leaf_ = out;
      losses_[row] = row_gradient_(n.first, scratch_, [this](size_t first) { finish(first); });
      finish(0);
      return;
    }
    if (spare_.size() <= depth) spare_.emplace_back(static_cast<size_t>(size_));
    float* right = spare_[depth].data();
    sum({n.first, middle(n)}, out, depth + 1, false);
    if (last) path_.push_back({out, right});
    sum({middle(n), n.second}, right, depth + 1, last);
    if (!last) add(out, out, right, size_);
  }

 private:
  // The buckets whose tensors are all at or after `first`: the last row's gradient copied to its
  // leaf, the deferred additions from the bottom up, then finished_; then MPI may move data.
  void finish(size_t first) {
    for (; next_ > 0 && buckets_[next_ - 1].first >= first; --next_) {
      const Bucket& b = buckets_[next_ - 1];
      float* at = leaf_ + b.begin;
      for (size_t i = b.first; i < b.last; ++i)
        at = std::copy(scratch_[i].data(), scratch_[i].data() + scratch_[i].numel(), at);
      for (auto p = path_.rbegin(); p != path_.rend(); ++p)
        add(p->first + b.begin, p->first + b.begin, p->second + b.begin, b.end - b.begin);
      finished_(next_ - 1);
    }
    ranks_.progress();
  }

  Ranks& ranks_;
  const RowGradient& row_gradient_;
  std::vector<Tensor> scratch_;
  std::vector<double>& losses_;
  const std::vector<Bucket>& buckets_;
  std::function<void(size_t)> finished_;
  size_t next_;                                    // buckets [next_, size) are finished
  float* leaf_ = nullptr;                          // the last row's place in the tree
  std::vector<std::pair<float*, const float*>> path_;  // the deferred out += right, top down
  std::deque<std::vector<float>> spare_;           // a right child's sum per depth
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

double tree_gradients(Ranks& ranks, int64_t rows, const RowGradient& row_gradient, std::span<const int64_t> slice,
                      int64_t bucket_elements, std::vector<Tensor>& grads) {
  const int n = ranks.size(), me = ranks.rank();
  const Node root{0, rows};
  std::vector<std::vector<Node>> nodes(static_cast<size_t>(n));  // each rank's nodes, left to right
  for (int q = 0; q < n; ++q) {
    const auto [a, b] = rows_of(rows, q, n);
    cover(root, a, b, nodes[static_cast<size_t>(q)]);
  }
  std::vector<int64_t> offsets{0};  // each tensor's start in the flat gradient
  for (const Tensor& g : grads) offsets.push_back(offsets.back() + g.numel());
  const int64_t size = offsets.back();
  if (slice.size() != static_cast<size_t>(n) + 1 || slice.front() != 0 || slice.back() != size)
    fail("tree_gradients", "slice", message(n + 1, " bounds from 0 to ", size), std::to_string(slice.size()));
  if (bucket_elements < 0) fail("tree_gradients", "bucket_elements", "a count >= 0", std::to_string(bucket_elements));
  if (n == 1 && rows == 1) {  // the row's gradient is the mean, written in place (0 + x and x / 1 are exact)
    for (Tensor& g : grads) std::fill(g.data(), g.data() + g.numel(), 0.0f);
    return row_gradient(0, grads, {});
  }
  const std::vector<Bucket> buckets = buckets_of(offsets, bucket_elements);
  // Rank q's part of elements [lo, hi): its intersection with q's slice.
  const auto part = [&](int q, int64_t lo, int64_t hi) {
    return std::pair{std::max(lo, slice[static_cast<size_t>(q)]), std::min(hi, slice[static_cast<size_t>(q) + 1])};
  };
  const auto length = [&](int q, const Bucket& b) {
    const auto [lo, hi] = part(q, b.begin, b.end);
    return std::max<int64_t>(0, hi - lo);
  };

  // This rank's node sums; each bucket of them, once complete, sent as each rank's slice of every
  // node (rank-major, node order within).
  const std::vector<Node>& mine = nodes[static_cast<size_t>(me)];
  const int64_t m = static_cast<int64_t>(mine.size());
  std::vector<float> sums(static_cast<size_t>(checked_count("train: gradient nodes", {m, size}, sizeof(float))));
  std::vector<std::vector<float>> send(buckets.size()), recv(buckets.size());
  const auto start = [&](size_t k) {
    if (n == 1) return;  // the tree's root is this rank's one node
    const Bucket& b = buckets[k];
    std::vector<int64_t> send_counts, recv_counts;
    for (int q = 0; q < n; ++q) {
      const auto [lo, hi] = part(q, b.begin, b.end);
      send_counts.push_back(m * length(q, b));
      for (int64_t j = 0; j < m && m > 1; ++j)  // one node's slices already lie in rank order
        send[k].insert(send[k].end(), sums.begin() + j * size + lo, sums.begin() + j * size + std::max(lo, hi));
      recv_counts.push_back(static_cast<int64_t>(nodes[static_cast<size_t>(q)].size()) * length(me, b));
    }
    int64_t received = 0;
    for (int64_t c : recv_counts) received += c;
    recv[k].resize(static_cast<size_t>(received));
    std::span<const float> from = send[k];
    if (m == 1) from = std::span<const float>(sums.data() + b.begin, static_cast<size_t>(b.end - b.begin));
    ranks.start_all_to_all(from, send_counts, recv[k], recv_counts);
  };
  std::vector<Tensor> scratch;
  for (const Tensor& g : grads) scratch.emplace_back(g.shape());
  std::vector<double> losses(static_cast<size_t>(rows));
  LocalSums local(ranks, row_gradient, std::move(scratch), losses, buckets, start);
  for (size_t k = 0; k < mine.size(); ++k)
    local.sum(mine[k], sums.data() + static_cast<int64_t>(k) * size, 0, k + 1 == mine.size());
  if (mine.empty())
    for (size_t k = buckets.size(); k-- > 0;) start(k);
  ranks.wait_all();
  send = {};

  // The rest of the tree over this rank's slice, bucket by bucket.
  const float count = static_cast<float>(rows);
  for (size_t k = 0; k < buckets.size(); ++k) {
    const int64_t len = length(me, buckets[k]);
    if (len == 0) continue;
    std::map<Node, const float*> sent;
    const float* from = n == 1 ? sums.data() + buckets[k].begin : recv[k].data();
    for (int q = 0; q < n; ++q)
      for (const Node& node : nodes[static_cast<size_t>(q)]) sent.emplace(node, from), from += len;
    SliceTree tree(std::move(sent), len);
    const float* x = tree.sum(root);
    const auto [lo, hi] = part(me, buckets[k].begin, buckets[k].end);
    for (size_t i = 0; i < grads.size(); ++i) {  // the tensors' parts within [lo, hi)
      const int64_t a = std::max(lo, offsets[i]), b = std::min(hi, offsets[i + 1]);
      for (int64_t e = a; e < b; ++e) grads[i].data()[e - offsets[i]] = *x++ / count;
    }
    recv[k] = {};
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
