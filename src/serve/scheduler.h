// serve/scheduler.h — the engine behind `mhsa serve`: one thread owns the model and runs
// continuous batching: each step is one forward (Model::step) over every active sequence, each
// with its own KV cache — one new token of every sequence that is generating, and prompt chunks
// of newly admitted ones while the step's token budget lasts — so the weights are read once per
// step, not once per sequence. Queued requests are admitted between steps as sequences finish.
// HTTP threads only submit Jobs and read their text as it is made; a Job cancelled by its client
// (a disconnect) or by shutdown leaves at the next step and its blocks go back to the pool.
//
// The KV cache is paged (mhsa/kv_pool.h): one pool of blocks for every sequence, each with its
// block table. A queued job is admitted when a place among the `parallel` is free and the pool
// can promise blocks for its prompt + max_tokens (less the blocks it shares); otherwise it waits
// in the queue (first come, first served), and submit refuses (503) past `max_queue` or a job
// that the whole pool could not hold. With SchedulerOptions::preempt, a job is admitted by its
// prompt alone and takes blocks as it grows; a sequence short of blocks preempts the ones that
// arrived after it (recomputed when they resume). The full blocks of a prompt (and of generated text) are
// indexed by their tokens, so a later prompt with the same beginning (a shared system prompt, a
// chat's earlier turns) takes them instead of prefilling them again; its last prompt token is
// always run (its logits give the first token). With a prompt cache (serve/prompt_cache.h), the
// full blocks of a finished request are also kept beyond the pool — in RAM, and in files that
// outlive the server — and copied back into the pool for a later prompt that begins with them. A request may ask for each generated token's
// log-probability (and the most likely tokens'): computed from its logits row before sampling,
// only for the requests that ask. A decoding sequence whose request asks for speculation
// (GenerationOptions::speculation) may add its prompt-lookup guesses of the next tokens as rows
// after its last token; all sequences' rows run in the one forward, each checks its guesses with
// its sampler's rule and its cache is cut back past the first rejected one (see docs/speculative.md,
// "In the server"). Internal (not installed).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mhsa/kv_pool.h"
#include "mhsa/model.h"
#include "mhsa/tokenizer.h"
#include "model/speculative.h"
#include "nn/block.h"
#include "serve/prompt_cache.h"

namespace mhsa::serve {

constexpr int kMaxTopLogprobs = 20;  // as OpenAI's chat top_logprobs

struct Request {
  std::vector<int32_t> prompt;       // token ids: non-empty, fewer than the context
  GenerationOptions options;         // max_new_tokens (prompt + it within the context), sampler, seed
  std::vector<int32_t> end_ids;      // tokens that end the text (EOS, end of turn); not part of it
  std::vector<std::string> stop;     // stop strings: the text ends before the first one found
  // 0..kMaxTopLogprobs: each generated token comes with its log-probability and those of the
  // top_logprobs most likely tokens (TokenLogprob); -1: none (nothing computed).
  int top_logprobs = -1;
  // With top_logprobs ≥ 0: the token that ended the text (EOS, end of turn) gets its entry too, so
  // that there is one per generated token (echo requests: lm-evaluation-harness drops the last).
  bool logprob_end_token = false;
};

// A generated token's log-probability: log-softmax of the model's raw logits (float32, summed in
// double), the distribution before temperature and top_p, whatever the sampler then chose.
struct TokenLogprob {
  int32_t token = 0;
  double logprob = 0;
  int64_t text_offset = 0;  // where its text begins in the generated text, in code points
  std::vector<std::pair<int32_t, double>> top;  // the most likely tokens, most likely first (ties: lower id)
};
// The TokenLogprob of `token` with the `top` most likely tokens of logits [V].
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top);

enum class Finish { running, stop, length, cancelled, error };
const char* finish_name(Finish f);  // "stop", "length", "cancelled", "error"

// One request's progress, shared by the scheduler (which writes it) and one HTTP thread (which
// reads it). Thread-safe.
class Job {
 public:
  using clock = std::chrono::steady_clock;
  explicit Job(Request request) : request_(std::move(request)), created_(clock::now()) {}
  const Request& request() const { return request_; }

  struct Update {
    std::string text;  // what is new since the last update: valid UTF-8, never part of a stop string
    Finish finish = Finish::running;
    std::string error;  // with Finish::error
    std::string stop_string;  // with Finish::stop: the request's stop string that ended it ("" for an end token)
    int64_t completion_tokens = 0;
    int64_t cached_tokens = 0;  // prompt tokens not prefilled: shared in the pool or copied from the prompt cache
    int64_t drafted = 0, accepted = 0;  // speculation: guessed tokens checked, and kept
    // With Request::top_logprobs ≥ 0: the tokens whose text has begun in the text given out so
    // far (all of them once finished, but for those wholly after a stop string: cut, as their text).
    std::vector<TokenLogprob> logprobs;
  };
  // Waits until there is new text or the job has finished, at most `timeout`; takes what is new.
  Update wait(std::chrono::milliseconds timeout);
  // Asks the scheduler to drop the job (its client left); idempotent.
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  // Seconds from creation to the first text, and to the end (0 until then).
  double first_text_seconds() const;
  double total_seconds() const;

  // The scheduler's side.
  void emit(std::string_view text, int64_t completion_tokens, std::span<const TokenLogprob> logprobs = {});
  void finish(Finish f, std::string error = {}, std::string stop_string = {});
  void set_cached_tokens(int64_t n);
  void set_guesses(int64_t drafted, int64_t accepted);

 private:
  const Request request_;
  const clock::time_point created_;
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::string pending_;
  std::vector<TokenLogprob> pending_logprobs_;
  Finish finish_ = Finish::running;
  std::string error_, stop_string_;
  int64_t completion_tokens_ = 0;
  int64_t cached_tokens_ = 0;
  int64_t drafted_ = 0, accepted_ = 0;
  clock::time_point first_text_{}, finished_{};
};

struct SchedulerOptions {
  int parallel = 4;   // sequences advanced together at most
  int max_queue = 16; // requests waiting for a place at most (then submit refuses: 503)
  // Tokens one step runs at most, beyond the generating sequences' one each: prompts are cut
  // into chunks so that a long one does not stall the others for long.
  int64_t step_tokens = 256;
  // The KV pool: blocks of block_tokens tokens; 0 blocks: `parallel` whole contexts' worth.
  int64_t kv_blocks = 0;
  int64_t block_tokens = 16;
  bool prefix_sharing = true;
  // false: a request is admitted when the pool can promise blocks for its prompt + max_tokens,
  // so it never runs out (llama.cpp's slots). true: admitted by its prompt (+ one token), its
  // blocks taken as it grows; when the pool runs out, the latest-arrived running sequences are
  // preempted — their blocks given back (full ones stay cached for their return), their state
  // kept — and resumed later by prefilling their tokens again (vLLM's recompute), before any new
  // request. More requests run at once when answers end before max_tokens.
  bool preempt = false;
  // true: the pool's memory is allocated all at once when the scheduler starts
  // (KVBlockPool::allocate_all): no step pays for fresh pages, and the memory is claimed before
  // the first request, not in the middle of one. false: a slab at a time as blocks are first taken.
  bool allocate_kv = false;
  // The prompt cache beyond the pool (with prefix_sharing): on when it has a RAM budget or a directory.
  PromptCacheOptions prompt_cache;
};

// Counters for /metrics (totals since start, and the present state).
struct SchedulerStats {
  int64_t queued = 0, active = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, steps = 0, finished = 0, cancelled = 0;
  int64_t step_rows = 0, step_sequences = 0;     // the last step's tokens run and sequences in it
  int64_t rows_total = 0, sequences_total = 0;   // summed over steps (÷ steps: the mean batch)
  double busy_seconds = 0;
  KVPoolStats kv;               // the pool: blocks in use, cached, promised
  int64_t prefix_requests = 0;  // requests admitted with blocks shared from an earlier prefix
  int64_t prefix_blocks = 0;    // blocks they shared
  int64_t prefix_tokens = 0;    // prompt tokens those blocks held: not prefilled
  int64_t kv_block_bytes = 0;   // memory per block (every layer's keys and values)
  int64_t kv_memory_bytes = 0;  // the whole pool's (kv.allocated_bytes: what is allocated now)
  int64_t preemptions = 0;      // running sequences preempted (SchedulerOptions::preempt)
  int64_t preempted = 0;        // sequences waiting to resume now
  int64_t recomputed_tokens = 0;  // tokens prefilled again on resuming (not counted in prompt_tokens)
  // Speculation: guessed tokens checked and kept, and the sequences' forwards that sampled
  // (generated_tokens ÷ decode_forwards: tokens per forward, one without speculation).
  int64_t guesses_drafted = 0, guesses_accepted = 0, decode_forwards = 0;
  bool prompt_cache_on = false;
  PromptCacheStats prompt_cache;  // its hits and sizes (SchedulerOptions::prompt_cache)
};

class Scheduler {
 public:
  // Keeps references to model and tokenizer; starts the scheduler thread, which runs the model with
  // the caller's OpenMP thread count (omp_get_max_threads()).
  Scheduler(const Model& model, const Tokenizer& tokenizer, SchedulerOptions options);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a job; false (nothing queued) when the queue is full, the scheduler has stopped, or
  // the job needs more KV blocks than the pool has (see fits).
  bool submit(std::shared_ptr<Job> job);
  // Whether the pool could ever hold the request (its prompt + max_tokens).
  bool fits(const Request& r) const;
  // Cancels every job, queued or running, and joins the thread; later submits are refused.
  void shutdown();
  SchedulerStats stats() const;

 private:
  struct Sequence;
  struct StepCounts {
    int64_t rows = 0, sequences = 0, prompt_tokens = 0, generated = 0, finished = 0, cancelled = 0;
    int64_t preemptions = 0, recomputed = 0;
    int64_t drafted = 0, accepted = 0, decode_forwards = 0;
  };
  void run();
  // Moves preempted sequences, then queued jobs, to `active` (kept in order of arrival) while
  // there is a place and the pool can promise their blocks (under mutex_); drops cancelled ones.
  // Returns how many were cancelled.
  int64_t admit(std::vector<std::unique_ptr<Sequence>>& active);
  // Whether s's blocks can cover `tokens` tokens: from its promise, or (preempt) from the pool,
  // preempting sequences that arrived after s when it is short. False: s waits this step.
  bool ensure_blocks(Sequence& s, int64_t tokens, std::vector<std::unique_ptr<Sequence>>& active, StepCounts& counts);
  // One batched step over the active sequences; drops the finished and cancelled ones.
  StepCounts step_all(std::vector<std::unique_ptr<Sequence>>& active);
  // Each decoding sequence's rows of the step (Sequence::fed): its last token, then the guesses
  // worth checking. `rows`: the step's rows before any guess.
  void plan_guesses(std::vector<std::unique_ptr<Sequence>>& active, int64_t rows);
  // The forward of the sequences chosen (steps[i] is running[i]'s) and what follows from it.
  void run_step(std::span<Sequence* const> running, std::span<const nn::SeqStep> steps, StepCounts& counts);
  // A token sampled from a sequence's logits, with its log-probability when the request asks.
  struct Drawn {
    int32_t token = -1;
    bool accepted = false;  // a guess's row: the guess was kept (the token is the guess)
    std::optional<TokenLogprob> logprob;
    std::string error;  // what went wrong (nothing sampled)
  };
  // Samples s's next tokens from its logits [s.fed.size(), V]: row i decides guess i (s.fed[i + 1]),
  // up to the first rejected one or an end token, the last row one more token. Touches only s's
  // generator and logits: draws of different sequences run side by side.
  Drawn draw_one(Sequence& s, std::span<float> row, int64_t guess) const;
  std::vector<Drawn> draw(Sequence& s, std::span<float> logits) const;
  // Takes s's drawn token and streams it; false when the sequence is done.
  bool advance(Sequence& s, Drawn drawn);

  const Model& model_;
  const Tokenizer& tokenizer_;
  const SchedulerOptions options_;
  const nn::Stack stack_;      // the model's, for its steps (Model::step gives only each sequence's last row)
  const int64_t exact_rows_;   // rows a step may have for each to be a one-row step's bits (detail::exact_rows)
  detail::RowTimes step_times_;  // steps by their rows: what guesses cost
  KVBlockPool pool_;  // used by the scheduler thread only (its stats copied into stats_)
  std::unique_ptr<PromptCache> cache_;  // null: none; the scheduler thread's (its stats thread-safe)
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::unique_ptr<Sequence>> preempted_;  // in order of arrival; the scheduler thread's (and admit's)
  uint64_t arrivals_ = 0;                             // jobs admitted so far: each sequence's arrival number
  bool stopping_ = false;
  SchedulerStats stats_;  // under mutex_
  std::thread thread_;
};

}  // namespace mhsa::serve
