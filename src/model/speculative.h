// model/speculative.h — one sequence's decode loop: sample, hand each token to the caller, run
// the model on it; with speculation (SpeculationOptions, mhsa/model.h), guess tokens ahead and
// check them in one forward. Model::generate (batch 1) and the chat session run it, so sampling,
// guessing, checking and the cache's roll-back live here once. Not public.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "mhsa/model.h"
#include "nn/block.h"

namespace mhsa::detail {

// The most rows one sequence's forward over a cache may have for each row's logits to be bit for
// bit those of a one-row forward: every linear layer, the attention and the head then take the
// same kernel paths as a one-token decode step, whose results do not depend on the row count
// (kernels/matmul_bt.cpp, matmul_q8_0.cpp, gemm.cpp's stream class, flash_attention.cpp's split-K
// decode path: at most 8 query rows and 32 rows per kv head counting the group's heads).
int64_t exact_rows(const nn::Stack& s);

// Guesses of the tokens that follow a text.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // Up to k tokens guessed to follow history (none where it has no guess), into out (cleared).
  virtual void draft(std::span<const int32_t> history, int64_t k, std::vector<int32_t>& out) = 0;
};

// Prompt lookup: the last n tokens (n from ngram_max down to ngram_min) found earlier in history,
// latest first, and the tokens that followed them there.
class LookupDrafter : public Drafter {
 public:
  LookupDrafter(int64_t ngram_min, int64_t ngram_max) : min_(ngram_min), max_(ngram_max) {}
  void draft(std::span<const int32_t> history, int64_t k, std::vector<int32_t>& out) override;

 private:
  int64_t min_, max_;
};

// A draft model with the target's vocabulary, decoding greedily on its own cache, which keeps the
// longest prefix it shares with the history from one call to the next.
class ModelDrafter : public Drafter {
 public:
  ModelDrafter(const Model& draft, int64_t max_tokens);
  void draft(std::span<const int32_t> history, int64_t k, std::vector<int32_t>& out) override;

 private:
  const Model* model_;
  ModelCache cache_;
  std::vector<int32_t> cached_;  // the tokens in cache_
};

// The measured time of forwards by their row count (1 .. kMaxRows), each an average that follows
// change (recent forwards weigh most). A count not measured yet is extrapolated from the largest
// measured below it along its slope from one row (before any: 1 + (n − 1)/2 one-row forwards),
// optimistically, so that it gets tried. Speculation's guess counts are chosen from it.
class RowTimes {
 public:
  static constexpr int64_t kMaxRows = 8;
  void add(int64_t rows, double seconds);  // rows outside [1, kMaxRows] are not kept
  double time(int64_t rows) const;         // rows in [1, kMaxRows]

 private:
  double time_[kMaxRows + 1] = {};
};

// Throws mhsa::Error naming the option (fn: the caller) for speculation settings out of range: a
// draft count outside [0, 64], n-gram lengths outside 1 <= min <= max <= 64, a draft model with
// another vocabulary size than `vocab`.
void check_speculation(std::string_view fn, const SpeculationOptions& o, int64_t vocab);
// The drafter the options ask for (null: none), for a sequence of up to max_tokens tokens.
std::unique_ptr<Drafter> make_drafter(const SpeculationOptions& o, int64_t max_tokens);

// How the loop runs the model on its sequence's cache.
struct SequenceRunner {
  // ids appended to the cache at its end; returns their logits [1, n, V] (every row).
  std::function<Tensor(std::span<const int32_t>)> extend;
  std::function<void(int64_t)> truncate;  // keep the cache's first n tokens
  std::function<int64_t()> length;        // tokens in the cache
  std::function<void(int64_t)> reserve;   // make room for n tokens in all (may be empty)
};

// What the caller says of each token it is handed.
enum class Take {
  more,         // keep it, go on
  last,         // keep it, stop
  drop,         // stop without it (an end-of-turn token that is not part of the answer)
};

struct DecodeLimits {
  int64_t max_new_tokens = 0;  // tokens handed out at most (drop ones included)
  int64_t context = 0;         // the model's positions: the cache never grows past them
  int64_t exact_rows = 1;      // exact_rows() of the model
  std::string_view fn;         // the caller, for check_logits's message
};

struct DecodeResult {
  int64_t tokens = 0;           // handed to take()
  bool context_full = false;    // stopped because the cache could not take the next token
  SpeculationStats stats;
};

// Decodes one sequence whose cache holds history (cache length == history.size()), from `first`:
// the logits [V] of the token after it. Each token is handed to take(), in order, and kept tokens
// appended to history (whose first prompt_tokens are what the penalties treat as the prompt).
// On return the cache holds every kept token except the last (all of them after a drop), so a
// caller can continue the sequence by running the last one. Stops at take()'s word, at
// max_new_tokens, or when the context is full.
DecodeResult decode_sequence(const SequenceRunner& run, std::vector<int32_t>& history, size_t prompt_tokens,
                             std::span<const float> first, const GenerationOptions& o, uint64_t& rng,
                             Drafter* drafter, const DecodeLimits& limits, const std::function<Take(int32_t)>& take);

}  // namespace mhsa::detail
