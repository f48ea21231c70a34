// train/sharded_adamw.h — ZeRO stage 1: AdamW with its moments sharded across the ranks of a
// data-parallel run. The parameters, laid end to end as one flat array, are cut into one
// contiguous shard per rank at boundaries of the norm's chunks (65536 elements of a tensor, from
// its start); each rank keeps the moments of its shard only (1/N of AdamW's memory), clips and
// updates its shard of the reduced gradient, and the updated weights are gathered to every rank.
// The global norm sums the same float64 chunk sums in the same order as clip_gradients, and the
// update is the same kernel on whole chunks, so one rank and N ranks give the same bits.
// Checkpoints still hold the whole state: gather() assembles it on rank 0, load() takes a shard
// of it. Not the gradient reduction (train/gradient_tree.h) nor the schedule.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mhsa/tensor.h"
#include "mhsa/train.h"
#include "train/distributed.h"

namespace mhsa::detail {

// clip_gradients' float64 sums of squares over x[0, n) in chunks of kNormChunk, in order.
constexpr int64_t kNormChunk = int64_t{1} << 16;
std::vector<double> chunk_square_sums(const float* x, int64_t n);

// The flat parameter space cut for n ranks: rank q owns [bounds[q], bounds[q + 1]), as near an
// even split as chunk boundaries allow (a rank may own nothing when chunks are fewer than ranks).
std::vector<int64_t> shard_bounds(const std::vector<Tensor>& like, int n);

class ShardedAdamW {
 public:
  // This rank's shard of params (their shapes and order as Trainable::parameters), zero moments.
  ShardedAdamW(const std::vector<std::pair<std::string, Tensor*>>& params, AdamWOptions options, Ranks& ranks);
  const std::vector<int64_t>& bounds() const { return bounds_; }
  // The global norm of the gradient whose shards the ranks hold in grads (this rank's shard is
  // read), and this shard scaled so that the norm is at most max_norm (when max_norm > 0): the
  // norm clip_gradients returns for the whole gradient.
  double clip(std::vector<Tensor>& grads, double max_norm);
  // One AdamW step of this shard from its gradient in grads, then every rank's updated weights
  // gathered into params: AdamW::step's result, on every rank.
  void step(const std::vector<std::pair<std::string, Tensor*>>& params, const std::vector<Tensor>& grads, float lr);
  // The whole state into *whole on rank 0, which passes it (the other ranks pass nullptr; every
  // rank must call it).
  void gather(AdamW* whole);
  // This rank's shard of a whole state (AdamW gives its moments through non-const accessors only).
  void load(AdamW& whole);
  // Bytes of moments this rank holds.
  int64_t moment_bytes() const { return static_cast<int64_t>((m_.size() + v_.size()) * sizeof(float)); }

 private:
  AdamWOptions options_;
  Ranks& ranks_;
  std::vector<int64_t> bounds_, offsets_;  // offsets_[i]: tensor i's start in the flat space
  std::vector<int64_t> chunks_;            // the norm's chunks each rank owns
  int64_t begin_ = 0, end_ = 0;            // this rank's shard
  int64_t steps_ = 0;
  std::vector<float> m_, v_;               // the shard's moments
};

}  // namespace mhsa::detail
