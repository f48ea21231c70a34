// serve/scheduler.cpp — Job and Scheduler (see scheduler.h). A sequence samples exactly as
// Model::generate does for one prompt (the same sampler, the same random stream for a seed), so a
// greedy request gives `mhsa generate`'s tokens, whatever else is running beside it.
#include "serve/scheduler.h"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <new>
#include <utility>

#include "mhsa/chat.h"
#include "mhsa/error.h"
#include "text/text_stream.h"

namespace mhsa::serve {
namespace {

constexpr int64_t kPrefillChunk = 512;  // prompt tokens per step: a long prompt does not stall the others

double seconds_between(Job::clock::time_point a, Job::clock::time_point b) {
  return b == Job::clock::time_point{} ? 0.0 : std::chrono::duration<double>(b - a).count();
}

}  // namespace

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
  changed_.wait_for(lock, timeout, [&] { return !pending_.empty() || finish_ != Finish::running; });
  Update u;
  u.text = std::move(pending_);
  pending_.clear();
  u.finish = finish_;
  u.error = error_;
  u.completion_tokens = completion_tokens_;
  return u;
}

void Job::emit(std::string_view text, int64_t completion_tokens) {
  {
    std::lock_guard lock(mutex_);
    completion_tokens_ = completion_tokens;
    if (text.empty()) return;
    pending_ += text;
    if (first_text_ == clock::time_point{}) first_text_ = clock::now();
  }
  changed_.notify_all();
}

void Job::finish(Finish f, std::string error) {
  {
    std::lock_guard lock(mutex_);
    if (finish_ != Finish::running) return;
    finish_ = f;
    error_ = std::move(error);
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

// ---- Scheduler -------------------------------------------------------------------------------

struct Scheduler::Sequence {
  Sequence(std::shared_ptr<Job> j, const Model& model, const Tokenizer& tokenizer)
      : job(std::move(j)),
        cache(model.new_cache(1, static_cast<int64_t>(job->request().prompt.size()) +
                                     std::max<int64_t>(1, job->request().options.max_new_tokens))),
        history(job->request().prompt),
        rng(job->request().options.seed * 0x2545F4914F6CDD1Dull),  // Model::generate's first sequence
        decoder(tokenizer),
        text(job->request().stop) {}

  std::shared_ptr<Job> job;
  ModelCache cache;
  std::vector<int32_t> history;  // the prompt and the tokens generated: what the sampler looks at
  uint64_t rng;
  IncrementalDecoder decoder;
  text::TextStream text;
  Tensor logits;         // [1, 1, V] of the last token run
  size_t prefilled = 0;  // prompt tokens in the cache
  int64_t generated = 0;
  int32_t pending = -1;  // a token sampled but not yet run
};

Scheduler::Scheduler(const Model& model, const Tokenizer& tokenizer, SchedulerOptions options)
    : model_(model), tokenizer_(tokenizer), options_(options) {
  // OpenMP's thread count is per thread: the scheduler's forwards use the creator's (-t), not the default.
  thread_ = std::thread([this, threads = omp_get_max_threads()] {
    omp_set_num_threads(threads);
    run();
  });
}

Scheduler::~Scheduler() { shutdown(); }

bool Scheduler::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || static_cast<int64_t>(queue_.size()) >= options_.max_queue) return false;
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
  std::lock_guard lock(mutex_);
  return stats_;
}

void Scheduler::run() {
  std::vector<std::unique_ptr<Sequence>> active;
  for (;;) {
    std::vector<std::shared_ptr<Job>> admitted;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || !active.empty(); });
      if (stopping_) {
        for (auto& j : queue_) j->finish(Finish::cancelled);
        for (auto& s : active) s->job->finish(Finish::cancelled);
        stats_.cancelled += static_cast<int64_t>(queue_.size() + active.size());
        queue_.clear();
        stats_.queued = stats_.active = 0;
        return;
      }
      while (!queue_.empty() && active.size() + admitted.size() < static_cast<size_t>(options_.parallel)) {
        admitted.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      stats_.queued = static_cast<int64_t>(queue_.size());
    }
    for (auto& job : admitted) {
      try {
        active.push_back(std::make_unique<Sequence>(job, model_, tokenizer_));
      } catch (const std::bad_alloc&) {
        job->finish(Finish::error, "out of memory for the request's KV cache");
      } catch (const std::exception& e) {
        job->finish(Finish::error, e.what());
      }
    }
    // One step of each active sequence, in turn (a batched forward would go here).
    const auto t0 = Job::clock::now();
    int64_t prompt_tokens = 0, generated = 0, cancelled = 0, finished = 0;
    const int64_t stepped = static_cast<int64_t>(active.size());
    for (auto& s : active) {
      bool go_on = false;
      if (s->job->cancelled()) {
        s->job->finish(Finish::cancelled);
        ++cancelled;
      } else {
        const size_t before_prefill = s->prefilled;
        const int64_t before_generated = s->generated;
        try {
          go_on = step(*s);
        } catch (const std::bad_alloc&) {
          s->job->finish(Finish::error, "out of memory");
        } catch (const std::exception& e) {
          s->job->finish(Finish::error, e.what());
        }
        prompt_tokens += static_cast<int64_t>(s->prefilled - before_prefill);
        generated += s->generated - before_generated;
        finished += !go_on;
      }
      if (!go_on) s.reset();  // frees the cache now
    }
    std::erase(active, nullptr);
    std::lock_guard lock(mutex_);
    stats_.active = static_cast<int64_t>(active.size());
    stats_.prompt_tokens += prompt_tokens;
    stats_.generated_tokens += generated;
    stats_.steps += stepped > 0;
    stats_.finished += finished;
    stats_.cancelled += cancelled;
    stats_.busy_seconds += std::chrono::duration<double>(Job::clock::now() - t0).count();
  }
}

bool Scheduler::step(Sequence& s) {
  const Request& r = s.job->request();
  const GenerationOptions& o = r.options;
  if (o.max_new_tokens == 0) {  // as Model::generate: nothing to run
    s.job->finish(Finish::length);
    return false;
  }
  if (s.prefilled < r.prompt.size()) {
    const size_t n = std::min<size_t>(kPrefillChunk, r.prompt.size() - s.prefilled);
    s.logits = model_.extend(s.cache, std::span(r.prompt).subspan(s.prefilled, n), 1, static_cast<int64_t>(n), true);
    s.prefilled += n;
    if (s.prefilled < r.prompt.size()) return true;
  } else {
    s.logits = model_.extend(s.cache, std::span(&s.pending, 1), 1, 1, true);
  }
  const int64_t V = model_.config().vocab_size;
  const int32_t t = Model::sample({s.logits.data(), static_cast<size_t>(V)}, s.history, o, s.rng);
  if (std::find(r.end_ids.begin(), r.end_ids.end(), t) != r.end_ids.end()) {
    s.text.add(s.decoder.finish());
    s.job->emit(s.text.take(true), s.generated);
    s.job->finish(Finish::stop);
    return false;
  }
  ++s.generated;
  s.history.push_back(t);
  // A token past the tokenizer's ids (a padded embedding's row) has no text, as in transformers' decode.
  bool stopped = t < tokenizer_.vocab_size() && s.text.add(s.decoder.push(t));
  const bool length = !stopped && s.generated == o.max_new_tokens;
  if (length) stopped = s.text.add(s.decoder.finish());  // the held-back rest may hold a stop string
  s.job->emit(s.text.take(stopped || length), s.generated);
  if (stopped || length) {
    s.job->finish(stopped ? Finish::stop : Finish::length);
    return false;
  }
  s.pending = t;
  return true;
}

}  // namespace mhsa::serve
