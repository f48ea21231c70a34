// serve/scheduler.cpp — Job and Scheduler (see scheduler.h). A sequence samples exactly as
// Model::generate does for one prompt (the same sampler, the same random stream for a seed), and
// its logits are those it gets alone up to the GEMM's rounding for the step's row count (bitwise
// where the counts take the same kernel paths: see Model::step), so a greedy request gives
// `mhsa generate`'s tokens whatever runs beside it, barring a near-tie between two logits.
#include "serve/scheduler.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <exception>
#include <future>
#include <limits>
#include <new>
#include <numeric>
#include <utility>

#include "mhsa/chat.h"
#include "mhsa/error.h"
#include "mhsa/grammar.h"
#include "model/access.h"
#include "model/decoder.h"
#include "text/text_stream.h"

namespace mhsa::serve {
namespace {

double seconds_between(Job::clock::time_point a, Job::clock::time_point b) {
  return b == Job::clock::time_point{} ? 0.0 : std::chrono::duration<double>(b - a).count();
}

std::string error_text(const std::exception& e) {
  return dynamic_cast<const std::bad_alloc*>(&e) ? "out of memory" : e.what();
}

}  // namespace

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int top) {
  // log p_i = l_i − log Σ exp l_j, summed in double from the largest logit.
  double largest = -std::numeric_limits<double>::infinity();
  for (float l : logits) largest = std::max(largest, static_cast<double>(l));
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - largest);
  const double lse = largest + std::log(sum);
  TokenLogprob out{token, static_cast<double>(logits[static_cast<size_t>(token)]) - lse, 0, {}};
  const size_t k = std::min(static_cast<size_t>(std::max(top, 0)), logits.size());
  if (k == 0) return out;
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(), [&](int32_t a, int32_t b) {
    const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  });
  for (size_t i = 0; i < k; ++i)
    out.top.emplace_back(order[i], static_cast<double>(logits[static_cast<size_t>(order[i])]) - lse);
  return out;
}

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::running: return "running";
    case Finish::stop: return "stop";
    case Finish::length: return "length";
    case Finish::cancelled: return "cancelled";
    case Finish::error: return "error";
  }
  return "?";
}

// ---- Job -------------------------------------------------------------------------------------

Job::Update Job::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout,
                    [&] { return !pending_.empty() || !pending_logprobs_.empty() || finish_ != Finish::running; });
  Update u;
  u.text = std::move(pending_);
  pending_.clear();
  u.logprobs = std::move(pending_logprobs_);
  pending_logprobs_.clear();
  u.finish = finish_;
  u.error = error_;
  u.stop_string = stop_string_;
  u.completion_tokens = completion_tokens_;
  u.cached_tokens = cached_tokens_;
  u.drafted = drafted_;
  u.accepted = accepted_;
  return u;
}

void Job::emit(std::string_view text, int64_t completion_tokens, std::span<const TokenLogprob> logprobs) {
  {
    std::lock_guard lock(mutex_);
    completion_tokens_ = completion_tokens;
    pending_logprobs_.insert(pending_logprobs_.end(), logprobs.begin(), logprobs.end());
    if (text.empty() && logprobs.empty()) return;
    pending_ += text;
    if (!text.empty() && first_text_ == clock::time_point{}) first_text_ = clock::now();
  }
  changed_.notify_all();
}

void Job::finish(Finish f, std::string error, std::string stop_string) {
  {
    std::lock_guard lock(mutex_);
    if (finish_ != Finish::running) return;
    finish_ = f;
    error_ = std::move(error);
    stop_string_ = std::move(stop_string);
    finished_ = clock::now();
  }
  changed_.notify_all();
}

double Job::first_text_seconds() const {
  std::lock_guard lock(mutex_);
  return seconds_between(created_, first_text_);
}

double Job::total_seconds() const {
  std::lock_guard lock(mutex_);
  return seconds_between(created_, finished_);
}

void Job::set_cached_tokens(int64_t n) {
  std::lock_guard lock(mutex_);
  cached_tokens_ = n;
}

void Job::set_guesses(int64_t drafted, int64_t accepted) {
  std::lock_guard lock(mutex_);
  drafted_ = drafted;
  accepted_ = accepted;
}

// ---- Scheduler -------------------------------------------------------------------------------

struct Scheduler::Sequence {
  Sequence(std::shared_ptr<Job> j, KVBlockPool& p, const Tokenizer& tokenizer)
      : job(std::move(j)),
        pool(p),
        history(job->request().prompt),
        rng(job->request().options.seed * 0x2545F4914F6CDD1Dull),  // Model::generate's first sequence
        decoder(tokenizer),
        text(job->request().stop),
        target(history.size()) {
    const GenerationOptions& o = job->request().options;
    if (o.constraint) constraint.emplace(o.constraint->start());
    if (o.speculation.draft_tokens > 0)
      drafter = std::make_unique<detail::LookupDrafter>(o.speculation.ngram_min, o.speculation.ngram_max);
  }
  ~Sequence() { pool.release(paged); }
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  std::shared_ptr<Job> job;
  KVBlockPool& pool;
  PagedSequence paged;           // its blocks (given back when it goes)
  std::vector<int32_t> history;  // the prompt and the tokens generated: what the sampler looks at
  uint64_t rng;
  IncrementalDecoder decoder;
  text::TextStream text;
  uint64_t arrival = 0;  // order of admission (kept when preempted): later arrivals are preempted first
  // history[0, target) is prefilled (in chunks) before the sequence decodes, a token is sampled
  // from the last chunk's logits: the prompt, or on resuming after a preemption all of history
  // (its last token the one sampled but not yet run: its logits give the next token).
  size_t target = 0;
  size_t prefilled = 0;  // tokens of history[0, target) in the cache (shared blocks included)
  int64_t generated = 0;
  int32_t pending = -1;  // a token sampled but not yet run (history's last)
  // Its place in the request's grammar (GenerationOptions::constraint), if it has one.
  std::optional<ConstraintState> constraint;
  int64_t planned = 0;   // tokens it runs in this step (0: none)
  bool done = false;     // finished or cancelled: leaves at the end of the step
  bool preempted = false;  // its blocks given back: leaves `active` for preempted_ at the end of the step
  int64_t preemptions = 0;
  int64_t computed = 0;  // history[0, computed) has been run at least once (before any preemption)
  // Speculation (the request's options.speculation; prompt lookup only): this step's rows are
  // `fed`, its pending token and then the guesses it checks.
  std::unique_ptr<detail::LookupDrafter> drafter;  // null: it never guesses
  std::vector<int32_t> fed, guesses;  // the step's ids (decoding); what the drafter offered
  double kept = 1.2, missed = 0.8;    // guesses kept, and steps with a miss, recent ones weighing most (a prior of 0.6)
  int64_t idle = 0;                   // steps since it last checked a guess it had
  int64_t drafted = 0, accepted = 0;  // guesses checked and kept, in all
  bool prefilling() const { return prefilled < target; }
  // With Request::top_logprobs ≥ 0: the tokens' log-probabilities, each with the byte of text.text()
  // where its text begins, held until that text is given out (emitted).
  std::deque<std::pair<size_t, TokenLogprob>> held;
  size_t given = 0;         // bytes of text given out
  size_t counted = 0;       // text.text()[0, counted) holds...
  int64_t code_points = 0;  // ...this many code points

  // Gives out the text that is final now (all of it when finished) with its log-probabilities.
  void emit(bool finished) {
    const std::string out = text.take(finished);
    given += out.size();
    job->emit(out, generated, release_logprobs(finished));
  }
  // The held log-probabilities whose text has begun in what was given out; once finished, all but
  // those whose text lies wholly past a stop string (cut with it).
  std::vector<TokenLogprob> release_logprobs(bool finished) {
    std::vector<TokenLogprob> out;
    const std::string& all = text.text();
    for (; !held.empty(); held.pop_front()) {
      const size_t start = held.front().first;
      if (finished ? text.stopped() && start >= all.size() : start >= given) break;
      for (; counted < start; ++counted) code_points += (static_cast<unsigned char>(all[counted]) & 0xC0) != 0x80;
      out.push_back(std::move(held.front().second));
      out.back().text_offset = code_points;
    }
    return out;
  }
};

namespace {

// Tokens a request may hold in the cache: its prompt and max_tokens (at least one).
int64_t request_tokens(const Request& r) {
  return static_cast<int64_t>(r.prompt.size()) + std::max<int64_t>(1, r.options.max_new_tokens);
}

int64_t pool_blocks(const Model& model, const SchedulerOptions& o) {
  if (o.kv_blocks > 0) return o.kv_blocks;
  const int64_t bs = std::max<int64_t>(1, o.block_tokens);  // the pool refuses 0 by name
  return o.parallel * ((model.config().max_positions + bs - 1) / bs);
}

}  // namespace

Scheduler::Scheduler(const Model& model, const Tokenizer& tokenizer, SchedulerOptions options)
    : model_(model),
      tokenizer_(tokenizer),
      options_(options),
      stack_(ModelAccess::stack(model)),
      exact_rows_(detail::exact_rows(stack_)),
      pool_(model.new_kv_pool(pool_blocks(model, options), options.block_tokens)) {
  const PromptCacheOptions& pc = options_.prompt_cache;
  if (options_.prefix_sharing && (pc.ram_bytes > 0 || !pc.dir.empty())) cache_ = std::make_unique<PromptCache>(pc, pool_);
  stats_.prompt_cache_on = cache_ != nullptr;
  stats_.kv_block_bytes = pool_.block_bytes();
  stats_.kv_memory_bytes = pool_.memory_bytes();
  // OpenMP's thread count is per thread: the scheduler's forwards use the creator's (-t), not the default.
  // The pool is allocated on the scheduler's thread (allocate_all's region is its team, as every
  // forward's): a team started on the creating thread would stay, and with more libgomp threads
  // than CPUs libgomp stops spinning at barriers, so every region of every step would wait for a
  // futex wake-up (measured: the 8-client load 20% slower).
  std::promise<void> started;
  std::future<void> ready = started.get_future();
  thread_ = std::thread([this, threads = omp_get_max_threads(), &started] {
    omp_set_num_threads(threads);
    try {
      if (options_.allocate_kv) pool_.allocate_all();
      stats_.kv = pool_.stats();
    } catch (...) {
      started.set_exception(std::current_exception());
      return;
    }
    started.set_value();
    run();
  });
  try {
    ready.get();
  } catch (...) {
    thread_.join();
    throw;
  }
}

Scheduler::~Scheduler() { shutdown(); }

bool Scheduler::fits(const Request& r) const { return pool_.blocks_for(request_tokens(r)) <= pool_.blocks(); }

bool Scheduler::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || static_cast<int64_t>(queue_.size()) >= options_.max_queue || !fits(job->request())) return false;
    queue_.push_back(std::move(job));
    stats_.queued = static_cast<int64_t>(queue_.size());
  }
  wake_.notify_one();
  return true;
}

void Scheduler::shutdown() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  {
    std::lock_guard lock(mutex_);
    s = stats_;
  }
  if (cache_) s.prompt_cache = cache_->stats();
  return s;
}

int64_t Scheduler::admit(std::vector<std::unique_ptr<Sequence>>& active) {
  int64_t cancelled = 0;
  const int64_t bs = pool_.block_tokens();
  // Takes s's shared prefix and promise; false (nothing kept) when the pool cannot promise them.
  const auto place = [&](Sequence& s) {
    const int64_t n = static_cast<int64_t>(s.target);  // whole blocks of it but its last token, which must run
    const int64_t shared = options_.prefix_sharing ? pool_.share_prefix(s.paged, std::span(s.history).first(s.target),
                                                                        (n - 1) / bs)
                                                   : 0;
    // Promise: the prompt and max_tokens; with preemption the tokens to prefill and one more.
    const int64_t tokens = options_.preempt ? n + 1 : request_tokens(s.job->request());
    if (!pool_.reserve(s.paged, pool_.blocks_for(tokens) - shared)) {
      pool_.release(s.paged);  // it waits for blocks (its shared ones go back)
      return false;
    }
    // Then the blocks the prompt cache kept beyond the pool, copied into blocks of its promise.
    int64_t restored = 0;
    if (cache_) {
      const Restored r = cache_->restore(pool_, s.paged, std::span(s.history).first(s.target), (n - 1) / bs);
      restored = r.ram + r.disk;
      if (restored > 0) pool_.index_full_blocks(s.paged, s.history);  // shared in the pool from now on
    }
    s.prefilled = static_cast<size_t>((shared + restored) * bs);
    if (s.preemptions == 0) {
      stats_.prefix_requests += shared > 0;
      stats_.prefix_blocks += shared;
      stats_.prefix_tokens += shared * bs;
      s.job->set_cached_tokens((shared + restored) * bs);
    }
    return true;
  };
  const auto enter = [&](std::unique_ptr<Sequence> s) {  // in order of arrival
    const auto at = std::find_if(active.begin(), active.end(), [&](const auto& a) { return a->arrival > s->arrival; });
    active.insert(at, std::move(s));
  };
  // Preempted sequences first (they arrived before anything queued), in order of arrival.
  std::erase_if(preempted_, [&](const std::unique_ptr<Sequence>& s) {
    if (!s->job->cancelled()) return false;
    s->job->finish(Finish::cancelled);
    ++cancelled;
    return true;
  });
  while (!preempted_.empty() && active.size() < static_cast<size_t>(options_.parallel) && place(*preempted_.front())) {
    preempted_.front()->preempted = false;
    enter(std::move(preempted_.front()));
    preempted_.erase(preempted_.begin());
  }
  while (preempted_.empty() && !queue_.empty() && active.size() < static_cast<size_t>(options_.parallel)) {
    const std::shared_ptr<Job> job = queue_.front();
    if (job->cancelled()) {
      job->finish(Finish::cancelled);
      ++cancelled;
      queue_.pop_front();
      continue;
    }
    try {
      auto s = std::make_unique<Sequence>(job, pool_, tokenizer_);
      if (!place(*s)) break;  // it waits for blocks
      s->arrival = ++arrivals_;
      enter(std::move(s));
    } catch (const std::exception& e) {
      job->finish(Finish::error, error_text(e));
    }
    queue_.pop_front();
  }
  stats_.queued = static_cast<int64_t>(queue_.size());
  stats_.preempted = static_cast<int64_t>(preempted_.size());
  return cancelled;
}

bool Scheduler::ensure_blocks(Sequence& s, int64_t tokens, std::vector<std::unique_ptr<Sequence>>& active,
                              StepCounts& counts) {
  const int64_t short_by = pool_.blocks_for(tokens) - static_cast<int64_t>(s.paged.blocks.size()) - s.paged.reserved;
  if (short_by <= 0 || !options_.preempt) return true;  // promised (without preemption: grow says if not)
  while (!pool_.reserve(s.paged, short_by)) {
    // The latest arrival still holding blocks gives them back; none later than s: s waits.
    Sequence* victim = nullptr;
    for (auto& a : active)
      if (a.get() != &s && !a->done && !a->preempted && a->arrival > s.arrival) victim = a.get();
    if (!victim) return false;
    pool_.release(victim->paged);
    victim->preempted = true;
    victim->planned = 0;
    victim->target = victim->history.size();  // all of it again, the unrun token last
    victim->prefilled = 0;
    ++victim->preemptions;
    ++counts.preemptions;
  }
  return true;
}

void Scheduler::run() {
  std::vector<std::unique_ptr<Sequence>> active;  // declared first: destroyed (blocks given back) last
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || !active.empty() || !preempted_.empty(); });
      if (stopping_) {
        for (auto& j : queue_) j->finish(Finish::cancelled);
        for (auto& s : active) s->job->finish(Finish::cancelled);
        for (auto& s : preempted_) s->job->finish(Finish::cancelled);
        stats_.cancelled += static_cast<int64_t>(queue_.size() + active.size() + preempted_.size());
        queue_.clear();
        active.clear();
        preempted_.clear();
        stats_.queued = stats_.active = stats_.preempted = 0;
        stats_.kv = pool_.stats();
        return;
      }
      stats_.cancelled += admit(active);
    }
    const auto t0 = Job::clock::now();
    const StepCounts counts = step_all(active);
    std::lock_guard lock(mutex_);
    stats_.active = static_cast<int64_t>(active.size());
    stats_.prompt_tokens += counts.prompt_tokens;
    stats_.generated_tokens += counts.generated;
    stats_.steps += counts.rows > 0;
    stats_.step_rows = counts.rows;
    stats_.step_sequences = counts.sequences;
    stats_.rows_total += counts.rows;
    stats_.sequences_total += counts.sequences;
    stats_.finished += counts.finished;
    stats_.cancelled += counts.cancelled;
    stats_.preemptions += counts.preemptions;
    stats_.preempted = static_cast<int64_t>(preempted_.size());
    stats_.recomputed_tokens += counts.recomputed;
    stats_.guesses_drafted += counts.drafted;
    stats_.guesses_accepted += counts.accepted;
    stats_.decode_forwards += counts.decode_forwards;
    stats_.busy_seconds += std::chrono::duration<double>(Job::clock::now() - t0).count();
    stats_.kv = pool_.stats();
  }
}

Scheduler::StepCounts Scheduler::step_all(std::vector<std::unique_ptr<Sequence>>& active) {
  StepCounts counts;
  // Who runs: every decoding sequence (one token each), then prompt chunks of the others, in
  // order of arrival, while the step's token budget lasts.
  int64_t budget = options_.step_tokens;
  for (auto& s : active) {
    s->planned = 0;
    if (s->job->cancelled()) {
      s->job->finish(Finish::cancelled);
      ++counts.cancelled;
      s->done = true;
    } else if (s->job->request().options.max_new_tokens == 0) {  // as Model::generate: nothing to run
      s->job->finish(Finish::length);
      ++counts.finished;
      s->done = true;
    } else if (!s->prefilling()) {
      s->planned = 1;
      --budget;
    }
  }
  for (auto& s : active) {
    if (s->done || !s->prefilling() || budget <= 0) continue;
    s->planned = std::min<int64_t>(budget, static_cast<int64_t>(s->target - s->prefilled));
    budget -= s->planned;
  }
  plan_guesses(active, options_.step_tokens - budget);
  // Blocks for them, in order of arrival (with preemption, a sequence may take a later one's).
  std::vector<Sequence*> running;
  std::vector<nn::SeqStep> steps;
  for (auto& s : active) {
    if (s->planned == 0 || s->preempted) continue;
    const int64_t tokens = s->paged.length + s->planned;
    try {
      if (!ensure_blocks(*s, tokens, active, counts)) continue;  // it waits for an earlier arrival's blocks
      pool_.grow(s->paged, tokens);
    } catch (const std::exception& e) {
      s->job->finish(Finish::error, error_text(e));
      ++counts.finished;
      s->done = true;
      continue;
    }
    running.push_back(s.get());
    const std::span<const int32_t> ids = s->prefilling() ? std::span(s->history).subspan(s->prefilled, static_cast<size_t>(s->planned))
                                                         : std::span<const int32_t>(s->fed);
    steps.push_back({nullptr, ids, &s->paged, s->prefilling() ? 1 : static_cast<int64_t>(ids.size())});
  }
  if (!steps.empty()) run_step(running, steps, counts);
  for (auto& s : active)
    if (s->preempted && !s->done) preempted_.push_back(std::move(s));  // active is in order of arrival: so is this
  std::sort(preempted_.begin(), preempted_.end(), [](const auto& a, const auto& b) { return a->arrival < b->arrival; });
  if (cache_)  // the indexed blocks of those leaving, kept beyond the pool
    for (const auto& s : active) {
      if (!s || !s->done) continue;
      const auto indexed = std::find(s->paged.keys.begin(), s->paged.keys.end(), uint64_t{0}) - s->paged.keys.begin();
      cache_->keep(pool_, s->paged, s->history, indexed);
    }
  std::erase_if(active, [](const std::unique_ptr<Sequence>& s) { return !s || s->done; });  // gives their blocks back now
  return counts;
}

void Scheduler::plan_guesses(std::vector<std::unique_ptr<Sequence>>& active, int64_t rows) {
  // A step of at most exact_rows_ rows gives each row a one-row step's bits (the weights' streams,
  // the split-K decode attention), so greedy text is plain decoding's: guesses only fill a step up
  // to that. Which guesses: a guess of a sequence whose guesses are kept with probability a yields
  // a^j tokens as its j-th (it counts only when those before it were kept), so for each count K
  // the best are the K largest a^j of all sequences; K is the one that maximises tokens per unit
  // of the step's measured time (none where none beats plain steps by 2%), as detail::decode_sequence
  // chooses for one sequence.
  struct Offer {
    double worth;
    Sequence* s;
  };
  std::vector<Offer> offers;
  int64_t decoding = 0;
  const int64_t room = exact_rows_ - rows;
  const int64_t bs = pool_.block_tokens();
  for (auto& s : active) {
    if (s->done || s->planned != 1 || s->prefilling()) continue;
    s->fed.assign(1, s->pending);
    s->guesses.clear();
    ++decoding;
    if (!s->drafter || room <= 0) continue;
    const GenerationOptions& o = s->job->request().options;
    // Within max_tokens (the last token is sampled, never run) and the blocks held and promised
    // (with --preempt a guess never takes a block that another sequence would have to give up).
    const int64_t held = (static_cast<int64_t>(s->paged.blocks.size()) + s->paged.reserved) * bs;
    const int64_t k = std::min({o.speculation.draft_tokens, room, o.max_new_tokens - s->generated - 1,
                                held - s->paged.length - 1});
    if (k <= 0) continue;
    s->drafter->draft(s->history, k, s->guesses);
    const double a = s->kept / (s->kept + s->missed);
    double worth = 1;
    for (size_t j = 0; j < s->guesses.size(); ++j) offers.push_back({worth *= a, s.get()});
  }
  if (offers.empty()) return;
  std::stable_sort(offers.begin(), offers.end(), [](const Offer& x, const Offer& y) { return x.worth > y.worth; });
  const int64_t most = std::min<int64_t>(room, static_cast<int64_t>(offers.size()));
  const double plain = step_times_.time(rows);
  int64_t best = 0;
  double best_gain = 1.02, tokens = static_cast<double>(decoding);
  for (int64_t K = 1; K <= most; ++K) {
    tokens += offers[static_cast<size_t>(K - 1)].worth;
    const double gain = tokens / static_cast<double>(decoding) * plain / step_times_.time(rows + K);
    if (gain > best_gain) {
      best = K;
      best_gain = gain;
    }
  }
  // A sequence's guesses are a prefix of its offers (a^j falls with j).
  for (int64_t K = 0; K < best; ++K) {
    Sequence& s = *offers[static_cast<size_t>(K)].s;
    s.fed.push_back(s.guesses[s.fed.size() - 1]);
  }
  // One that guessed nothing for kProbe steps checks one guess, so that a text that turns to
  // copying is noticed.
  constexpr int64_t kProbe = 32;
  int64_t left = room - best;
  for (auto& s : active) {
    if (s->guesses.empty()) continue;
    if (s->fed.size() > 1) {
      s->idle = 0;
    } else if (++s->idle >= kProbe && left > 0) {
      s->fed.push_back(s->guesses[0]);
      s->idle = 0;
      --left;
    }
  }
  for (auto& s : active)
    if (!s->guesses.empty()) s->planned = static_cast<int64_t>(s->fed.size());
}

void Scheduler::run_step(std::span<Sequence* const> running, std::span<const nn::SeqStep> steps,
                         StepCounts& counts) {
  counts.sequences = static_cast<int64_t>(steps.size());
  for (const nn::SeqStep& q : steps) counts.rows += static_cast<int64_t>(q.ids.size());
  Tensor logits;
  std::string error;
  try {
    const detail::Decoder d{stack_, "Model", "max_positions", model_.config().eos_token_ids, {}, model_.kv_type()};
    const auto t0 = Job::clock::now();
    logits = detail::step(d, steps);
    step_times_.add(counts.rows, std::chrono::duration<double>(Job::clock::now() - t0).count());
  } catch (const std::exception& e) {
    error = error_text(e);
  }
  const int64_t V = model_.config().vocab_size;
  // Bookkeeping first; then the tokens of those that sample, drawn side by side by the model's
  // threads (a draw with a temperature reads all 50,257 of GPT-2's logits: eight of them one after
  // another were serial work that the other model threads waited for); then each goes on.
  std::vector<char> samples(running.size(), 0);
  std::vector<int64_t> first_row(running.size(), 0);  // each sequence's first row of logits
  for (size_t i = 1; i < running.size(); ++i) first_row[i] = first_row[i - 1] + steps[i - 1].logit_rows;
  for (size_t i = 0; i < running.size(); ++i) {
    Sequence& s = *running[i];
    const int64_t n = static_cast<int64_t>(steps[i].ids.size());
    try {
      if (!error.empty()) throw Error(error);
      // (A sequence that checked guesses indexes its blocks once the rejected ones are cut off.)
      if (options_.prefix_sharing && steps[i].logit_rows == 1) pool_.index_full_blocks(s.paged, s.history);
      const int64_t from = s.paged.length - n;  // the step's tokens: history[from, from + n)
      if (s.prefilling()) {  // a prompt chunk: a token is sampled after the last one
        s.prefilled += static_cast<size_t>(n);
        // Tokens run before a preemption count as recomputed; the prompt's others as prompt tokens.
        const int64_t fresh = std::max(from, s.computed);
        counts.recomputed += std::min(fresh, s.paged.length) - from;
        counts.prompt_tokens += std::max<int64_t>(
            0, std::min<int64_t>(s.paged.length, static_cast<int64_t>(s.job->request().prompt.size())) - fresh);
      }
      s.computed = std::max(s.computed, std::min<int64_t>(s.paged.length, static_cast<int64_t>(s.history.size())));
      samples[i] = !s.prefilling();  // (one still prefilling goes on)
    } catch (const std::exception& e) {
      s.job->finish(Finish::error, error_text(e));
      ++counts.finished;
      s.done = true;
    }
  }
  std::vector<int64_t> sampling;
  for (size_t i = 0; i < running.size(); ++i)
    if (samples[i]) sampling.push_back(static_cast<int64_t>(i));
  std::vector<std::vector<Drawn>> drawn(running.size());
#pragma omp parallel for schedule(dynamic, 1) if (sampling.size() > 1)
  for (size_t k = 0; k < sampling.size(); ++k) {
    const auto i = static_cast<size_t>(sampling[k]);
    drawn[i] = draw(*running[i], {logits.data() + first_row[i] * V, static_cast<size_t>(steps[i].logit_rows * V)});
  }
  for (const int64_t i : sampling) {
    Sequence& s = *running[static_cast<size_t>(i)];
    const int64_t before = s.generated;
    const int64_t checked = steps[static_cast<size_t>(i)].logit_rows - 1;
    bool go_on = false;
    try {
      if (checked > 0) {  // (told before the job may finish: its last update carries them)
        int64_t kept = 0;
        for (const Drawn& d : drawn[static_cast<size_t>(i)]) kept += d.accepted;
        s.kept = 0.9 * s.kept + static_cast<double>(kept);
        s.missed = 0.9 * s.missed + (kept < checked ? 1.0 : 0.0);
        s.drafted += checked;
        s.accepted += kept;
        counts.drafted += checked;
        counts.accepted += kept;
        s.job->set_guesses(s.drafted, s.accepted);
      }
      for (Drawn& d : drawn[static_cast<size_t>(i)])
        if (!(go_on = advance(s, std::move(d)))) break;
      if (checked > 0) {
        // The cache holds the step's rows; keep those that are now history: the pending token and
        // the guesses kept (a rejected guess's keys and values are cut off before any block that
        // holds them is indexed, so no shared block ever holds one).
        const int64_t start = s.paged.length - checked - 1;
        int64_t keep = start;
        while (keep < s.paged.length && keep < static_cast<int64_t>(s.history.size()) &&
               s.history[static_cast<size_t>(keep)] == s.fed[static_cast<size_t>(keep - start)])
          ++keep;
        pool_.truncate(s.paged, keep);
        if (options_.prefix_sharing) pool_.index_full_blocks(s.paged, s.history);
      }
    } catch (const std::exception& e) {
      s.job->finish(Finish::error, error_text(e));
      go_on = false;
    }
    ++counts.decode_forwards;
    counts.generated += s.generated - before;
    counts.finished += !go_on;
    s.done = !go_on;
  }
}

Scheduler::Drawn Scheduler::draw_one(Sequence& s, std::span<float> logits, int64_t guess) const {
  Drawn d;
  // A NaN or infinity fails this request (the HTTP layer answers 500) and not the server.
  detail::check_logits(logits, "serve", s.generated + 1);
  const Request& r = s.job->request();
  std::vector<float> raw;
  if (r.top_logprobs >= 0) raw.assign(logits.begin(), logits.end());  // as the model gave them (sample may change them)
  // The grammar's mask first: a guess it forbids has probability 0, so it is rejected like any wrong guess.
  if (s.constraint) s.constraint->mask(logits);
  d.token = guess < 0 ? Model::sample(logits, s.history, r.options, s.rng, r.prompt.size())
                      : detail::sample_draft(logits, s.history, r.options, s.rng, r.prompt.size(), guess, d.accepted);
  if (r.top_logprobs >= 0) d.logprob = token_logprob(raw, d.token, r.top_logprobs);
  if (s.constraint) s.constraint->advance(d.token);
  return d;
}

std::vector<Scheduler::Drawn> Scheduler::draw(Sequence& s, std::span<float> logits) const {
  std::vector<Drawn> out;
  const size_t V = static_cast<size_t>(model_.config().vocab_size), rows = logits.size() / V;
  const std::vector<int32_t>& ends = s.job->request().end_ids;
  const size_t length = s.history.size();
  try {
    // Each row sees the tokens kept before it (the penalties count them): history grows here and is
    // put back, as advance() appends them for good.
    for (size_t i = 0; i < rows; ++i) {
      const int64_t guess = i + 1 < rows ? s.fed[i + 1] : -1;
      out.push_back(draw_one(s, logits.subspan(i * V, V), guess));
      const int32_t t = out.back().token;
      if ((guess >= 0 && !out.back().accepted) || std::find(ends.begin(), ends.end(), t) != ends.end()) break;
      s.history.push_back(t);
      ++s.generated;  // (check_logits names the token by its number)
    }
  } catch (const std::exception& e) {
    out.emplace_back().error = error_text(e);
  }
  s.generated -= static_cast<int64_t>(s.history.size() - length);
  s.history.resize(length);
  return out;
}

bool Scheduler::advance(Sequence& s, Drawn drawn) {
  if (!drawn.error.empty()) throw Error(drawn.error);
  const Request& r = s.job->request();
  const GenerationOptions& o = r.options;
  const int32_t t = drawn.token;
  if (drawn.logprob && (r.logprob_end_token || std::find(r.end_ids.begin(), r.end_ids.end(), t) == r.end_ids.end()))
    s.held.emplace_back(s.text.text().size(), std::move(*drawn.logprob));
  if (std::find(r.end_ids.begin(), r.end_ids.end(), t) != r.end_ids.end()) {
    s.text.add(s.decoder.finish());
    s.emit(true);
    s.job->finish(Finish::stop);
    return false;
  }
  ++s.generated;
  s.history.push_back(t);
  // A token past the tokenizer's ids (a padded embedding's row) has no text, as in transformers' decode.
  bool stopped = t < tokenizer_.vocab_size() && s.text.add(s.decoder.push(t));
  const bool length = !stopped && s.generated == o.max_new_tokens;
  if (length) stopped = s.text.add(s.decoder.finish());  // the held-back rest may hold a stop string
  s.emit(stopped || length);
  if (stopped || length) {
    s.job->finish(stopped ? Finish::stop : Finish::length, {}, s.text.matched());
    return false;
  }
  s.pending = t;
  return true;
}

}  // namespace mhsa::serve
