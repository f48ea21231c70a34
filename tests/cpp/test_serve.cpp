// tests/cpp/test_serve.cpp — the serving scheduler on a random Llama with byte tokens: requests
// batched with others (one forward per step) give the text Model::generate gives each alone
// (greedy and seeded sampling, prompts of odd lengths, several in flight; equal up to the GEMM's
// rounding across row counts, see test_model_step.cpp), stop strings cut the text, a full queue
// refuses, cancellation and shutdown end jobs; the paged KV pool: a shared prompt prefix is
// prefilled once and gives the same text, a full pool queues jobs, a request larger than the pool
// is refused, every block comes back; preemption: sequences preempted mid-prompt or mid-answer
// resume with the text they get alone, preempted ones can be cancelled; log-probabilities: each token's is the log-softmax of
// Model::forward's logits at its place (greedy and sampled, top lists sorted, batched as alone),
// text offsets where the token's text begins, none for tokens cut with a stop string; speculation:
// prompt-lookup guesses checked in the batched steps give Model::generate's greedy text (with end
// tokens and stop strings among the guesses), sampled requests that guess run, blocks come back.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "mhsa/chat.h"
#include "mhsa/model.h"
#include "mhsa/tokenizer.h"
#include "serve/scheduler.h"
#include "text/hf_tokenizer.h"

namespace mhsa {
namespace {

using serve::Finish;
using serve::Job;
using serve::Request;
using serve::Scheduler;

Model make_model(int64_t context, uint64_t seed) {
  const nlohmann::json c = {{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 256},
                            {"hidden_size", 32}, {"intermediate_size", 48}, {"num_hidden_layers", 2},
                            {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                            {"max_position_embeddings", context}};
  Model m = Model::random(ModelConfig::parse(c.dump()), seed);
  for (auto& [name, t] : m.parameters())  // lively logits: no near-ties for greedy choices
    if (name.find("embed_tokens") != std::string::npos || name.find("lm_head") != std::string::npos)
      for (int64_t i = 0; i < t->numel(); ++i) t->data()[i] *= 30.0f;
  return m;
}

struct Result {
  std::string text;
  Finish finish = Finish::running;
  int64_t tokens = 0;
  std::vector<serve::TokenLogprob> logprobs;
};

Result collect(Job& job) {
  Result r;
  const auto deadline = Job::clock::now() + std::chrono::seconds(60);
  while (Job::clock::now() < deadline) {
    Job::Update u = job.wait(std::chrono::milliseconds(1000));
    r.text += u.text;
    r.tokens = u.completion_tokens;
    r.logprobs.insert(r.logprobs.end(), u.logprobs.begin(), u.logprobs.end());
    if (u.finish != Finish::running) {
      r.finish = u.finish;
      return r;
    }
  }
  ADD_FAILURE() << "the job did not finish";
  return r;
}

TEST(Serve, InterleavedRequestsEqualGenerateAlone) {
  std::mt19937_64 gen(std::random_device{}());
  const Model model = make_model(160, gen());
  const Tokenizer tok = Tokenizer::bytes();
  Scheduler scheduler(model, tok, {3, 16});
  std::vector<std::shared_ptr<Job>> jobs;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 7; ++i) {
    Request r;
    const size_t n = std::uniform_int_distribution<size_t>(1, 37)(gen);
    for (size_t k = 0; k < n; ++k) r.prompt.push_back(std::uniform_int_distribution<int32_t>('a', 'z')(gen));
    r.options.max_new_tokens = std::uniform_int_distribution<int64_t>(1, 40)(gen);
    r.options.temperature = i % 2 ? 0.0f : 0.9f;
    r.options.top_p = i % 3 ? 1.0f : 0.8f;
    r.options.seed = gen();
    r.options.stop_at_eos = false;
    expected.push_back(model.generate(r.prompt, 1, static_cast<int64_t>(n), r.options)[0]);
    jobs.push_back(std::make_shared<Job>(r));
  }
  int64_t prompt_tokens = 0, generated = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_TRUE(scheduler.submit(jobs[i]));
    prompt_tokens += static_cast<int64_t>(jobs[i]->request().prompt.size());
    generated += static_cast<int64_t>(expected[i].size());
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Result r = collect(*jobs[i]);
    EXPECT_EQ(r.finish, Finish::length) << i;
    EXPECT_EQ(r.tokens, static_cast<int64_t>(expected[i].size())) << i;
    EXPECT_EQ(r.text, text::lossy_utf8(tok.decode(expected[i], true))) << i;  // invalid bytes as U+FFFD
  }
  serve::SchedulerStats st = scheduler.stats();  // counted just after the last job is told it finished
  for (int i = 0; i < 1000 && st.finished < 7; ++i, st = scheduler.stats())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(st.finished, 7);
  EXPECT_EQ(st.queued, 0);
  EXPECT_EQ(st.active, 0);
  // Batched: the steps ran several sequences each; every prompt token and every generated token
  // but each job's last (sampled, never run) was a row of some step.
  EXPECT_GT(st.sequences_total, st.steps);
  EXPECT_EQ(st.prompt_tokens, prompt_tokens);
  EXPECT_EQ(st.generated_tokens, generated);
  EXPECT_EQ(st.rows_total, prompt_tokens + generated - 7);
}

TEST(Serve, StopStringsAndEndTokens) {
  std::mt19937_64 gen(std::random_device{}());
  const Model model = make_model(128, gen());
  const Tokenizer tok = Tokenizer::bytes();
  Scheduler scheduler(model, tok, {2, 4});
  Request r;
  r.prompt = {'h', 'e', 'l', 'l', 'o'};
  r.options.max_new_tokens = 60;
  r.options.stop_at_eos = false;
  const std::vector<int32_t> ids = model.generate(r.prompt, 1, 5, r.options)[0];
  // A stop string from the middle of the greedy text: the text ends before its first occurrence.
  const std::string full = text::lossy_utf8(tok.decode(ids, true));
  ASSERT_GE(full.size(), 23u);
  const std::string stop = full.substr(20, 3);
  Request with_stop = r;
  with_stop.stop = {"\x01\x02 never", stop};
  auto job = std::make_shared<Job>(with_stop);
  ASSERT_TRUE(scheduler.submit(job));
  Result res = collect(*job);
  EXPECT_EQ(res.finish, Finish::stop);
  EXPECT_EQ(res.text, full.substr(0, full.find(stop)));
  EXPECT_TRUE(res.logprobs.empty());  // not asked for
  // With log-probabilities: those of the tokens whose text begins before the cut.
  with_stop.top_logprobs = 2;
  job = std::make_shared<Job>(with_stop);
  ASSERT_TRUE(scheduler.submit(job));
  res = collect(*job);
  EXPECT_EQ(res.text, full.substr(0, full.find(stop)));
  IncrementalDecoder decoder(tok);
  size_t before_cut = 0;
  for (int32_t t : ids) {
    before_cut += decoder.text().size() < res.text.size();
    (void)decoder.push(t);
  }
  ASSERT_EQ(res.logprobs.size(), before_cut);
  for (size_t i = 0; i < before_cut; ++i) EXPECT_EQ(res.logprobs[i].token, ids[i]) << i;
  // An end token: the text stops before it, finish "stop".
  Request with_end = r;
  with_end.end_ids = {ids[10]};
  job = std::make_shared<Job>(with_end);
  ASSERT_TRUE(scheduler.submit(job));
  res = collect(*job);
  EXPECT_EQ(res.finish, Finish::stop);
  const size_t first = static_cast<size_t>(std::find(ids.begin(), ids.end(), ids[10]) - ids.begin());
  EXPECT_EQ(res.tokens, static_cast<int64_t>(first));
}

TEST(Serve, FullQueueRefusesAndCancelEndsJobs) {
  std::mt19937_64 gen(std::random_device{}());
  const Model model = make_model(1024, gen());
  const Tokenizer tok = Tokenizer::bytes();
  Scheduler scheduler(model, tok, {1, 1});
  Request r;
  r.prompt = {'a', 'b', 'c'};
  r.options.max_new_tokens = 1000;
  r.options.stop_at_eos = false;
  std::vector<std::shared_ptr<Job>> jobs;  // the accepted ones
  for (int i = 0; i < 4; ++i) {
    auto job = std::make_shared<Job>(r);
    if (scheduler.submit(job)) jobs.push_back(job);
  }
  ASSERT_GE(jobs.size(), 1u);
  EXPECT_LE(jobs.size(), 2u);  // one running, one waiting
  jobs[0]->cancel();
  const Result first = collect(*jobs[0]);
  EXPECT_EQ(first.finish, Finish::cancelled);
  EXPECT_LT(first.tokens, 1000);
  ASSERT_TRUE(scheduler.submit(std::make_shared<Job>(r)) || jobs.size() == 2);
  scheduler.shutdown();  // the others, queued or running, are cancelled too
  if (jobs.size() == 2) EXPECT_EQ(collect(*jobs[1]).finish, Finish::cancelled);
  EXPECT_FALSE(scheduler.submit(std::make_shared<Job>(r)));
}

serve::SchedulerStats settled(const Scheduler& scheduler) {  // once no job is active or queued
  serve::SchedulerStats st = scheduler.stats();
  for (int i = 0; i < 2000 && (st.active > 0 || st.queued > 0 || st.kv.used > 0); ++i, st = scheduler.stats())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return st;
}

TEST(Serve, SharedPrefixIsPrefilledOnceAndGivesTheSameText) {
  std::mt19937_64 gen(std::random_device{}());
  const Model model = make_model(256, gen());
  const Tokenizer tok = Tokenizer::bytes();
  const auto letters = [&](size_t n) {
    std::vector<int32_t> v(n);
    for (int32_t& t : v) t = std::uniform_int_distribution<int32_t>('a', 'z')(gen);
    return v;
  };
  const std::vector<int32_t> system = letters(std::uniform_int_distribution<size_t>(33, 47)(gen));
  std::vector<Request> requests(4);
  for (size_t i = 0; i < requests.size(); ++i) {
    Request& r = requests[i];
    r.prompt = system;
    r.prompt.push_back(static_cast<int32_t>('A' + i));  // they differ right after the system prompt
    for (int32_t t : letters(std::uniform_int_distribution<size_t>(0, 15)(gen))) r.prompt.push_back(t);
    r.options.max_new_tokens = std::uniform_int_distribution<int64_t>(5, 20)(gen);
    r.options.stop_at_eos = false;
  }
  for (bool sharing : {true, false}) {
    SCOPED_TRACE(sharing ? "sharing" : "not sharing");
    serve::SchedulerOptions o{2, 8};
    o.prefix_sharing = sharing;
    Scheduler scheduler(model, tok, o);
    int64_t prompt_tokens = 0;
    std::vector<std::shared_ptr<Job>> jobs;
    std::vector<Result> results(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      jobs.push_back(std::make_shared<Job>(requests[i]));
      prompt_tokens += static_cast<int64_t>(requests[i].prompt.size());
      ASSERT_TRUE(scheduler.submit(jobs.back()));
      if (i == 0) results[0] = collect(*jobs[0]);  // the first alone: the others find its blocks
    }
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (i > 0) results[i] = collect(*jobs[i]);
      const std::vector<int32_t> want = model.generate(requests[i].prompt, 1,
                                                       static_cast<int64_t>(requests[i].prompt.size()),
                                                       requests[i].options)[0];
      EXPECT_EQ(results[i].text, text::lossy_utf8(tok.decode(want, true))) << i;
    }
    const serve::SchedulerStats st = settled(scheduler);
    // The three later prompts shared the system prompt's whole 16-token blocks.
    const int64_t shared = sharing ? 3 * (static_cast<int64_t>(system.size()) / 16 * 16) : 0;
    EXPECT_EQ(st.prefix_tokens, shared);
    EXPECT_EQ(st.prefix_requests, sharing ? 3 : 0);
    EXPECT_EQ(st.prompt_tokens, prompt_tokens - shared);
    EXPECT_EQ(st.kv.used, 0);
    EXPECT_EQ(st.kv.reserved, 0);
    EXPECT_EQ(st.kv.cached > 0, sharing);
  }
}

TEST(Serve, FullPoolQueuesThenRefusesAndBlocksComeBack) {
  std::mt19937_64 gen(std::random_device{}());
  const Model model = make_model(2048, gen());
  const Tokenizer tok = Tokenizer::bytes();
  serve::SchedulerOptions o{4, 2};
  o.kv_blocks = 128;  // 2048 tokens: one request of 10 + 2000 takes 126 blocks
  Scheduler scheduler(model, tok, o);
  Request r;
  r.prompt = {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j'};
  r.options.max_new_tokens = 2000;
  r.options.stop_at_eos = false;
  Request too_big = r;
  too_big.options.max_new_tokens = 2039;  // 129 blocks
  EXPECT_TRUE(scheduler.fits(r));
  EXPECT_FALSE(scheduler.fits(too_big));
  EXPECT_FALSE(scheduler.submit(std::make_shared<Job>(too_big)));
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 3; ++i) jobs.push_back(std::make_shared<Job>(r));
  ASSERT_TRUE(scheduler.submit(jobs[0]));
  for (int i = 0; i < 2000 && scheduler.stats().active == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(scheduler.submit(jobs[1]));
  ASSERT_TRUE(scheduler.submit(jobs[2]));
  // A place is free (--parallel 4) but no blocks: both wait, and the queue (2) is full.
  EXPECT_FALSE(scheduler.submit(std::make_shared<Job>(r)));
  serve::SchedulerStats st = scheduler.stats();
  EXPECT_EQ(st.active, 1);
  EXPECT_EQ(st.queued, 2);
  EXPECT_EQ(st.kv.used + st.kv.reserved, 126);
  EXPECT_EQ(jobs[0]->wait(std::chrono::milliseconds(0)).finish, Finish::running);
  jobs[0]->cancel();  // its blocks go back: the next is admitted
  EXPECT_EQ(collect(*jobs[0]).finish, Finish::cancelled);
  for (int i = 0; i < 2000 && scheduler.stats().queued == 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(scheduler.stats().queued, 1);
  jobs[2]->cancel();  // cancelled while queued
  jobs[1]->cancel();
  EXPECT_EQ(collect(*jobs[1]).finish, Finish::cancelled);
  EXPECT_EQ(collect(*jobs[2]).finish, Finish::cancelled);
  st = settled(scheduler);
  EXPECT_EQ(st.active + st.queued, 0);
  EXPECT_EQ(st.kv.used + st.kv.reserved, 0);
  EXPECT_EQ(st.cancelled, 3);
}

// With preemption, requests are admitted by their prompts and grow on demand: six requests whose
// answers together need far more blocks than the pool has run four at a time, the latest
// arrivals are preempted and later resumed by prefilling their tokens again, and each gives the
// text Model::generate gives it alone (greedy and seeded sampling: the sampler's state survives).
TEST(Serve, PreemptedSequencesResumeWithTheSameText) {
  std::mt19937_64 gen(std::random_device{}());
  const Model model = make_model(256, gen());
  const Tokenizer tok = Tokenizer::bytes();
  serve::SchedulerOptions o{4, 8};
  o.kv_blocks = 12;  // 192 tokens; each request fits alone (at most 30 + 60 tokens: 6 blocks)
  o.preempt = true;
  o.step_tokens = 16;  // prompts in chunks: preemption also hits sequences mid-prompt
  Scheduler scheduler(model, tok, o);
  std::vector<std::shared_ptr<Job>> jobs;
  std::vector<std::vector<int32_t>> expected;
  int64_t prompt_tokens = 0;
  for (int i = 0; i < 6; ++i) {
    Request r;
    const size_t n = std::uniform_int_distribution<size_t>(5, 30)(gen);
    for (size_t k = 0; k < n; ++k) r.prompt.push_back(std::uniform_int_distribution<int32_t>('a', 'z')(gen));
    r.options.max_new_tokens = std::uniform_int_distribution<int64_t>(40, 60)(gen);
    r.options.temperature = i % 2 ? 0.0f : 0.8f;
    r.options.seed = gen();
    r.options.stop_at_eos = false;
    ASSERT_TRUE(scheduler.fits(r));
    expected.push_back(model.generate(r.prompt, 1, static_cast<int64_t>(n), r.options)[0]);
    jobs.push_back(std::make_shared<Job>(r));
    prompt_tokens += static_cast<int64_t>(n);
  }
  for (auto& j : jobs) ASSERT_TRUE(scheduler.submit(j));
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Result r = collect(*jobs[i]);
    EXPECT_EQ(r.finish, Finish::length) << i;
    EXPECT_EQ(r.tokens, static_cast<int64_t>(expected[i].size())) << i;
    EXPECT_EQ(r.text, text::lossy_utf8(tok.decode(expected[i], true))) << i;
  }
  serve::SchedulerStats st = settled(scheduler);
  for (int i = 0; i < 1000 && st.finished < 6; ++i, st = scheduler.stats())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(st.finished, 6);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.recomputed_tokens, 0);
  EXPECT_EQ(st.prompt_tokens, prompt_tokens);  // first prefills only: resumed ones count as recomputed
  EXPECT_EQ(st.preempted, 0);
  EXPECT_EQ(st.kv.used, 0);
  EXPECT_EQ(st.kv.reserved, 0);
}

// Preempted sequences whose clients leave, and shutdown with sequences preempted: every job ends,
// every block comes back.
TEST(Serve, PreemptedSequencesCanBeCancelled) {
  std::mt19937_64 gen(std::random_device{}());
  const Model model = make_model(512, gen());
  const Tokenizer tok = Tokenizer::bytes();
  serve::SchedulerOptions o{4, 8};
  o.kv_blocks = 24;
  o.preempt = true;
  std::vector<std::shared_ptr<Job>> jobs;
  {
    Scheduler scheduler(model, tok, o);
    for (int i = 0; i < 6; ++i) {
      Request r;
      r.prompt.assign(static_cast<size_t>(std::uniform_int_distribution<int>(3, 20)(gen)), 'x');
      r.prompt.push_back(static_cast<int32_t>('a' + i));
      r.options.max_new_tokens = 300;
      r.options.stop_at_eos = false;
      jobs.push_back(std::make_shared<Job>(r));
      ASSERT_TRUE(scheduler.submit(jobs.back()));
    }
    // Four sequences of up to 300 tokens cannot all fit in 24 blocks of 16: a preemption comes before
    // any of them finishes, however slow the steps (a sanitizer build on a loaded host takes seconds).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
    for (serve::SchedulerStats st = scheduler.stats();
         st.preemptions == 0 && st.finished == 0 && std::chrono::steady_clock::now() < deadline; st = scheduler.stats())
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_GT(scheduler.stats().preemptions, 0);
    for (int i = 0; i < 6; i += 2) jobs[static_cast<size_t>(i)]->cancel();
    for (int i = 0; i < 6; i += 2) EXPECT_EQ(collect(*jobs[static_cast<size_t>(i)]).finish, Finish::cancelled) << i;
    const serve::SchedulerStats st = scheduler.stats();
    EXPECT_LE(st.kv.used, 24);
    scheduler.shutdown();  // the others, running or preempted, are cancelled
    const serve::SchedulerStats end = scheduler.stats();
    EXPECT_EQ(end.kv.used, 0);
    EXPECT_EQ(end.kv.reserved, 0);
    EXPECT_EQ(end.preempted + end.active + end.queued, 0);
  }
  for (auto& j : jobs) EXPECT_NE(collect(*j).finish, Finish::running);
}

int64_t code_points(const std::string& s) {
  return std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

// r's log-probabilities against the model's own: log-softmax (float64) of Model::forward's logits
// over the prompt and the tokens generated, at each token's place.
void check_logprobs(const Model& model, const Tokenizer& tok, const Request& q, const Result& r) {
  const std::vector<serve::TokenLogprob>& lps = r.logprobs;
  ASSERT_EQ(static_cast<int64_t>(lps.size()), r.tokens);
  std::vector<int32_t> ids = q.prompt;
  for (const serve::TokenLogprob& lp : lps) ids.push_back(lp.token);
  const int64_t T = static_cast<int64_t>(ids.size()) - 1, V = model.config().vocab_size;
  const Tensor logits = model.forward(std::span(ids).first(static_cast<size_t>(T)), 1, T);
  IncrementalDecoder decoder(tok);
  for (size_t i = 0; i < lps.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "token " << i);
    const float* row = logits.data() + (static_cast<int64_t>(q.prompt.size()) - 1 + static_cast<int64_t>(i)) * V;
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]));
    std::vector<double> ref(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) ref[static_cast<size_t>(v)] = static_cast<double>(row[v]) - std::log(sum);
    const serve::TokenLogprob& lp = lps[i];
    EXPECT_NEAR(lp.logprob, ref[static_cast<size_t>(lp.token)], 1e-4);
    std::vector<double> sorted = ref;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    if (q.options.temperature == 0.0f)  // greedy: the most likely token (barring a near-tie)
      EXPECT_NEAR(ref[static_cast<size_t>(lp.token)], sorted[0], 1e-4);
    ASSERT_EQ(lp.top.size(), static_cast<size_t>(q.top_logprobs));
    std::vector<int32_t> seen;
    for (size_t k = 0; k < lp.top.size(); ++k) {  // the k-th most likely (or one as likely, up to rounding)
      const auto [id, value] = lp.top[k];
      EXPECT_NEAR(value, ref[static_cast<size_t>(id)], 1e-4) << k;
      EXPECT_NEAR(value, sorted[k], 1e-4) << k;
      if (k > 0) EXPECT_GE(lp.top[k - 1].second, value);
      seen.push_back(id);
    }
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end());
    if (!lp.top.empty() && q.options.temperature == 0.0f) EXPECT_EQ(lp.top[0].first, lp.token);
    EXPECT_EQ(lp.text_offset, code_points(decoder.text()));  // what the tokens before it gave
    (void)decoder.push(lp.token);
  }
}

TEST(Serve, LogprobsAreTheModelsLogSoftmaxBatchedAsAlone) {
  std::mt19937_64 gen(std::random_device{}());
  const Model model = make_model(160, gen());
  const Tokenizer tok = Tokenizer::bytes();
  Scheduler scheduler(model, tok, {3, 16});
  std::vector<Request> requests(5);
  for (size_t i = 0; i < requests.size(); ++i) {
    Request& r = requests[i];
    const size_t n = std::uniform_int_distribution<size_t>(1, 30)(gen);
    for (size_t k = 0; k < n; ++k) r.prompt.push_back(std::uniform_int_distribution<int32_t>('a', 'z')(gen));
    r.options.max_new_tokens = std::uniform_int_distribution<int64_t>(1, 25)(gen);
    r.options.temperature = i == 1 ? 0.9f : 0.0f;  // sampled: still the model's distribution
    r.options.top_p = i == 1 ? 0.8f : 1.0f;
    r.options.seed = gen();
    r.options.stop_at_eos = false;
    r.top_logprobs = i == 0 ? -1 : std::uniform_int_distribution<int>(0, serve::kMaxTopLogprobs)(gen);
  }
  std::vector<Result> alone;
  for (const Request& r : requests) {
    auto job = std::make_shared<Job>(r);
    ASSERT_TRUE(scheduler.submit(job));
    alone.push_back(collect(*job));
  }
  EXPECT_TRUE(alone[0].logprobs.empty());
  for (size_t i = 1; i < requests.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "request " << i);
    check_logprobs(model, tok, requests[i], alone[i]);
  }
  std::vector<std::shared_ptr<Job>> jobs;
  for (const Request& r : requests) {
    jobs.push_back(std::make_shared<Job>(r));
    ASSERT_TRUE(scheduler.submit(jobs.back()));
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "request " << i << " batched");
    const Result r = collect(*jobs[i]);
    EXPECT_EQ(r.text, alone[i].text);
    ASSERT_EQ(r.logprobs.size(), alone[i].logprobs.size());
    for (size_t k = 0; k < r.logprobs.size(); ++k) {
      const serve::TokenLogprob &a = r.logprobs[k], &b = alone[i].logprobs[k];
      EXPECT_EQ(a.token, b.token);
      EXPECT_NEAR(a.logprob, b.logprob, 1e-4);
      EXPECT_EQ(a.text_offset, b.text_offset);
      ASSERT_EQ(a.top.size(), b.top.size());
      for (size_t j = 0; j < a.top.size(); ++j) EXPECT_NEAR(a.top[j].second, b.top[j].second, 1e-4);
    }
  }
}

// Speculation: greedy requests that guess by prompt lookup check their guesses as rows of the
// batched step, cut their caches back past the first rejection, and give Model::generate's text
// alone (its tokens bit for bit: a step keeps to exact_rows rows, see docs/speculative.md; random
// models repeat themselves, so guesses are kept), with an end token and a stop string among the
// guesses too; seeded sampled requests that guess run to their length; every block comes back,
// with and without preemption (guesses only fill blocks held or promised), and a second round shares
// the first's prompts' blocks.
TEST(Serve, SpeculationGivesGenerateTextAndGivesBlocksBack) {
  std::mt19937_64 gen(std::random_device{}());
  const Model model = make_model(256, gen());
  const Tokenizer tok = Tokenizer::bytes();
  for (const bool preempt : {false, true}) {
    serve::SchedulerOptions o{3, 16};
    o.preempt = preempt;
    if (preempt) o.kv_blocks = 14;  // 224 tokens for three requests of up to 100: they may preempt each other
    Scheduler scheduler(model, tok, o);
    std::vector<std::shared_ptr<Job>> jobs;
    std::vector<std::vector<int32_t>> expected;
    std::vector<Request> requests;
    for (int i = 0; i < 6; ++i) {
      Request r;
      const size_t period = std::uniform_int_distribution<size_t>(2, 6)(gen), n = std::uniform_int_distribution<size_t>(8, 40)(gen);
      for (size_t k = 0; k < n; ++k) r.prompt.push_back(static_cast<int32_t>('a' + (k % period) * 3 + i));
      r.options.max_new_tokens = std::uniform_int_distribution<int64_t>(30, 60)(gen);
      r.options.temperature = i == 5 ? 0.8f : 0.0f;
      r.options.seed = gen();
      r.options.stop_at_eos = false;
      const std::vector<int32_t> ids = model.generate(r.prompt, 1, static_cast<int64_t>(n), r.options)[0];
      r.options.speculation.draft_tokens = 6;
      if (i == 3) r.end_ids = {ids[12]};
      if (i == 4) r.stop = {text::lossy_utf8(tok.decode(ids, true)).substr(20, 3)};
      requests.push_back(r);
      expected.push_back(ids);
    }
    for (int round = 0; round < 2; ++round) {
      jobs.clear();
      for (const Request& r : requests) {
        jobs.push_back(std::make_shared<Job>(r));
        ASSERT_TRUE(scheduler.submit(jobs.back()));
      }
      for (size_t i = 0; i < jobs.size(); ++i) {
        const Result r = collect(*jobs[i]);
        const std::string full = text::lossy_utf8(tok.decode(expected[i], true));
        if (i == 5) {
          EXPECT_EQ(r.finish, Finish::length);
          EXPECT_EQ(r.tokens, requests[i].options.max_new_tokens);
        } else if (i == 3) {
          const auto end = std::find(expected[i].begin(), expected[i].end(), requests[i].end_ids[0]);
          EXPECT_EQ(r.finish, Finish::stop);
          EXPECT_EQ(r.text, text::lossy_utf8(tok.decode(std::span(expected[i].begin(), end), true))) << preempt;
        } else if (i == 4) {
          EXPECT_EQ(r.finish, Finish::stop);
          EXPECT_EQ(r.text, full.substr(0, full.find(requests[i].stop[0]))) << preempt;
        } else {
          EXPECT_EQ(r.finish, Finish::length);
          EXPECT_EQ(r.text, full) << i << " preempt " << preempt;
        }
      }
    }
    const serve::SchedulerStats st = settled(scheduler);
    EXPECT_GT(st.guesses_drafted, 0);
    EXPECT_GT(st.guesses_accepted, 0);
    EXPECT_LE(st.guesses_accepted, st.guesses_drafted);
    EXPECT_LT(st.decode_forwards, st.generated_tokens);  // more than one token a forward
    if (!preempt) EXPECT_GT(st.prefix_requests, 0);       // the second round's prompts shared blocks
    EXPECT_EQ(st.kv.used, 0);
    EXPECT_EQ(st.kv.reserved, 0);
  }
}

}  // namespace
}  // namespace mhsa
