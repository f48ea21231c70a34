// apps/mhsa/serve_cmd.cpp — `mhsa serve`: an OpenAI-compatible HTTP server over one model
// (POST /v1/completions, POST /v1/chat/completions with server-sent-event streaming, GET
// /v1/models, /health, /metrics), on Debian's cpp-httplib. HTTP threads parse and validate
// (serve_api.cpp) and stream; one scheduler thread owns the model (src/serve/scheduler.h).
//
// Binds to 127.0.0.1 unless --host says otherwise; --port 0 takes a free port. The line
// "mhsa serve: listening on http://HOST:PORT ..." on stdout says it is ready. SIGINT or SIGTERM:
// stop accepting, cancel what runs, exit 0. A streaming client that disconnects cancels its
// request (its KV cache is freed at the next step); a non-streaming one runs to its end.
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/check.h"
#include "default_model.h"
#include "mhsa/chat.h"
#include "mhsa/error.h"
#include "options.h"
#include "serve/scheduler.h"
#include "serve_api.h"

namespace mhsa::cli {
namespace {

using json = nlohmann::ordered_json;
using detail::message;
using serve::Finish;

constexpr size_t kMaxBodyBytes = size_t{1} << 20;
// cpp-httplib gives each connection a thread of its pool until its request is read, so that
// clients silent after their headers held every thread for the read timeout (5 s each: 64 of them
// delayed a request by ~19 s). Idle threads cost address space, not memory: enough of them that a
// few hundred silent connections do not queue the others, and a shorter wait for their bytes.
constexpr size_t kMinHttpThreads = 256;
constexpr size_t kDrainBytes = size_t{64} << 20;  // larger declared bodies: 413 at once, unread
constexpr time_t kReadTimeoutSeconds = 2;  // between two reads of one request (and a kept-alive connection's next)
constexpr auto kPoll = std::chrono::milliseconds(100);  // how often a waiting stream looks at its client

struct ServeArgs {
  std::string model, host = "127.0.0.1", api_key, dtype, kv_dtype = "f32", kv_alloc = "auto";
  int port = 8080, parallel = 4, queue = 16, threads = 0;
  int64_t ctx_size = 0, kv_blocks = 0;
  bool no_prefix_sharing = false;
  bool preempt = false;
  int64_t prompt_cache_ram_mib = 1024, cache_dir_max_mib = 4096;
  std::string cache_dir;
};

constexpr int64_t kBlockTokens = 16;  // tokens per KV block

// Request counts by path and status, and the latencies of finished generations: /metrics.
class Metrics {
 public:
  void count(const std::string& path, int status) {
    static const char* const known[] = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"};
    std::string label = "other";
    for (const char* k : known)
      if (path == k) label = k;
    std::lock_guard lock(mutex_);
    ++requests_[{label, status}];
  }
  void finished(const serve::Job& job) {
    const double total = job.total_seconds(), first = job.first_text_seconds();
    if (total == 0) return;  // cancelled, and not yet dropped by the scheduler
    std::lock_guard lock(mutex_);
    latency_sum_ += total;
    ++latency_count_;
    if (first > 0) {
      first_sum_ += first;
      ++first_count_;
    }
  }
  std::string text(const serve::SchedulerStats& s, int parallel) const {
    std::string out;
    const auto metric = [&](const char* name, const char* type, const char* help) {
      out += message("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
    };
    std::lock_guard lock(mutex_);
    metric("mhsa_requests_total", "counter", "HTTP requests answered, by path and status.");
    for (const auto& [key, n] : requests_)
      out += message("mhsa_requests_total{path=\"", key.first, "\",status=\"", key.second, "\"} ", n, "\n");
    metric("mhsa_prompt_tokens_total", "counter", "Prompt tokens run through the model.");
    out += message("mhsa_prompt_tokens_total ", s.prompt_tokens, "\n");
    metric("mhsa_generated_tokens_total", "counter", "Tokens generated.");
    out += message("mhsa_generated_tokens_total ", s.generated_tokens, "\n");
    metric("mhsa_requests_cancelled_total", "counter", "Generations cancelled (client gone, shutdown).");
    out += message("mhsa_requests_cancelled_total ", s.cancelled, "\n");
    metric("mhsa_scheduler_steps_total", "counter", "Scheduler steps: batched forwards over the active sequences.");
    out += message("mhsa_scheduler_steps_total ", s.steps, "\n");
    metric("mhsa_scheduler_rows_total", "counter", "Tokens run by the steps (÷ steps: the mean rows per step).");
    out += message("mhsa_scheduler_rows_total ", s.rows_total, "\n");
    metric("mhsa_scheduler_sequences_total", "counter", "Sequences in the steps, summed (÷ steps: the mean batch).");
    out += message("mhsa_scheduler_sequences_total ", s.sequences_total, "\n");
    metric("mhsa_step_rows", "gauge", "Tokens run by the last step (one per generating sequence, plus prompt chunks).");
    out += message("mhsa_step_rows ", s.step_rows, "\n");
    metric("mhsa_step_sequences", "gauge", "Sequences in the last step's forward.");
    out += message("mhsa_step_sequences ", s.step_sequences, "\n");
    metric("mhsa_scheduler_busy_seconds_total", "counter", "Seconds the scheduler spent running the model.");
    out += message("mhsa_scheduler_busy_seconds_total ", s.busy_seconds, "\n");
    metric("mhsa_queue_length", "gauge", "Requests waiting for a place among the active sequences.");
    out += message("mhsa_queue_length ", s.queued, "\n");
    metric("mhsa_batch_size", "gauge", "Active sequences, advanced together by one forward at each step.");
    out += message("mhsa_batch_size ", s.active, "\n");
    metric("mhsa_batch_size_max", "gauge", "--parallel: active sequences at most.");
    out += message("mhsa_batch_size_max ", parallel, "\n");
    metric("mhsa_kv_blocks_total", "gauge", "KV cache blocks in the pool (--kv-blocks).");
    out += message("mhsa_kv_blocks_total ", s.kv.blocks, "\n");
    metric("mhsa_kv_blocks_used", "gauge", "KV blocks held by active sequences.");
    out += message("mhsa_kv_blocks_used ", s.kv.used, "\n");
    metric("mhsa_kv_blocks_free", "gauge", "KV blocks held by no sequence (the cached ones included).");
    out += message("mhsa_kv_blocks_free ", s.kv.blocks - s.kv.used, "\n");
    metric("mhsa_kv_blocks_cached", "gauge", "Free KV blocks that still hold an indexed prefix (reused or evicted).");
    out += message("mhsa_kv_blocks_cached ", s.kv.cached, "\n");
    metric("mhsa_kv_blocks_reserved", "gauge", "KV blocks promised to active sequences, not yet taken.");
    out += message("mhsa_kv_blocks_reserved ", s.kv.reserved, "\n");
    metric("mhsa_kv_block_bytes", "gauge", "Bytes per KV block (every layer's keys and values).");
    out += message("mhsa_kv_block_bytes ", s.kv_block_bytes, "\n");
    metric("mhsa_kv_bytes_total", "gauge", "Bytes of the whole KV pool.");
    out += message("mhsa_kv_bytes_total ", s.kv_memory_bytes, "\n");
    metric("mhsa_kv_bytes_allocated", "gauge", "Bytes of the KV pool allocated so far (--kv-alloc).");
    out += message("mhsa_kv_bytes_allocated ", s.kv.allocated_bytes, "\n");
    metric("mhsa_prefix_cache_hits_total", "counter", "Requests that shared KV blocks of an earlier identical prefix.");
    out += message("mhsa_prefix_cache_hits_total ", s.prefix_requests, "\n");
    metric("mhsa_prefix_cache_blocks_total", "counter", "KV blocks shared instead of computed.");
    out += message("mhsa_prefix_cache_blocks_total ", s.prefix_blocks, "\n");
    metric("mhsa_prefix_cache_tokens_total", "counter", "Prompt tokens not prefilled because their blocks were shared.");
    out += message("mhsa_prefix_cache_tokens_total ", s.prefix_tokens, "\n");
    if (s.prompt_cache_on) {
      const serve::PromptCacheStats& c = s.prompt_cache;
      const auto put = [&](const char* name, const char* type, const char* help, int64_t v) {
        metric(name, type, help);
        out += message(name, " ", v, "\n");
      };
      put("mhsa_prompt_cache_ram_hits_total", "counter", "Requests that took KV blocks from the prompt cache's RAM.", c.ram_hits);
      put("mhsa_prompt_cache_ram_tokens_total", "counter", "Prompt tokens copied from the prompt cache's RAM, not prefilled.", c.ram_tokens);
      put("mhsa_prompt_cache_disk_hits_total", "counter", "Requests that took KV blocks from --cache-dir files.", c.disk_hits);
      put("mhsa_prompt_cache_disk_tokens_total", "counter", "Prompt tokens read from --cache-dir files, not prefilled.", c.disk_tokens);
      put("mhsa_prompt_cache_disk_read_bytes_total", "counter", "Bytes of block files read back.", c.disk_bytes_read);
      put("mhsa_prompt_cache_disk_written_bytes_total", "counter", "Bytes of block files written.", c.disk_bytes_written);
      put("mhsa_prompt_cache_disk_refused_total", "counter", "Block files refused (corrupt, truncated, another model or format) and recomputed.", c.disk_refused);
      put("mhsa_prompt_cache_disk_write_failures_total", "counter", "Block files not written (a failed write, a full disk, the writer behind).", c.disk_write_failures);
      put("mhsa_prompt_cache_disk_evicted_total", "counter", "Block files deleted to stay under --cache-dir-max.", c.disk_evicted);
      put("mhsa_prompt_cache_ram_evicted_total", "counter", "Blocks dropped from RAM to stay under --prompt-cache-ram.", c.ram_evicted);
      put("mhsa_prompt_cache_ram_blocks", "gauge", "KV blocks kept in the prompt cache's RAM.", c.ram_images);
      put("mhsa_prompt_cache_ram_bytes", "gauge", "Bytes of the prompt cache's RAM (--prompt-cache-ram).", c.ram_bytes);
      put("mhsa_prompt_cache_disk_files", "gauge", "Block files in --cache-dir, as this server knows them.", c.disk_files);
      put("mhsa_prompt_cache_disk_bytes", "gauge", "Bytes of those files (--cache-dir-max).", c.disk_bytes);
    }
    metric("mhsa_preemptions_total", "counter", "Running requests preempted for KV blocks (--preempt).");
    out += message("mhsa_preemptions_total ", s.preemptions, "\n");
    metric("mhsa_preempted_requests", "gauge", "Preempted requests waiting to resume.");
    out += message("mhsa_preempted_requests ", s.preempted, "\n");
    metric("mhsa_recomputed_tokens_total", "counter", "Tokens computed again when preempted requests resumed.");
    out += message("mhsa_recomputed_tokens_total ", s.recomputed_tokens, "\n");
    metric("mhsa_request_duration_seconds", "summary", "From a generation's arrival to its last token.");
    out += message("mhsa_request_duration_seconds_sum ", latency_sum_, "\nmhsa_request_duration_seconds_count ",
                   latency_count_, "\n");
    metric("mhsa_time_to_first_token_seconds", "summary", "From a generation's arrival to its first text.");
    out += message("mhsa_time_to_first_token_seconds_sum ", first_sum_, "\nmhsa_time_to_first_token_seconds_count ",
                   first_count_, "\n");
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  double latency_sum_ = 0, first_sum_ = 0;
  int64_t latency_count_ = 0, first_count_ = 0;
};

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(error_json(e)), "application/json");
}

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Equal strings, in time that does not depend on where they differ.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() != b.size();
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(b.size(), 1)]);
  return diff == 0;
}

class Server {
 public:
  Server(const ServeArgs& a, ServedModel served, serve::Scheduler& scheduler)
      : args_(a), m_(std::move(served)), scheduler_(scheduler) {
    const size_t threads = std::max(kMinHttpThreads, static_cast<size_t>(a.parallel) + static_cast<size_t>(a.queue) + 4);
    http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http_.set_payload_max_length(kMaxBodyBytes);
    http_.set_read_timeout(kReadTimeoutSeconds, 0);
    http_.set_keep_alive_timeout(kReadTimeoutSeconds);
    http_.set_socket_options([](socket_t sock) {  // not httplib's SO_REUSEPORT: a port in use is an error
      const int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      // Before the body is read (httplib reads it after this handler): a Content-Length past the
      // limit was answered only once the body had been read and dropped (5 s for a client that
      // sent none), and "-5" was read as 2^64 − 5 ("larger than 1048576 bytes"). A body of up to
      // kDrainBytes is still read and dropped before the 413, so that a client that sends it
      // whole can read the answer (answered at once, it met a closed connection).
      if (req.has_header("Content-Length")) {
        const std::string length = req.get_header_value("Content-Length");
        const bool digits = !length.empty() && length.size() <= 19 &&
                            std::all_of(length.begin(), length.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits) {
          send_error(res, {400, message("Content-Length: expected a decimal byte count, got ",
                                        dump(json(length.substr(0, 40)))),
                           "invalid_request_error", "", ""});
        } else if (std::stoull(length) > kDrainBytes) {
          send_error(res, {413, message("The request body is larger than ", kMaxBodyBytes, " bytes (Content-Length: ",
                                        length, ")"),
                           "invalid_request_error", "", ""});
        }
        if (res.status == 400 || res.status == 413) {
          res.set_header("Connection", "close");
          return httplib::Server::HandlerResponse::Handled;
        }
      }
      if (args_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
      if (same_secret(req.get_header_value("Authorization"), "Bearer " + args_.api_key))
        return httplib::Server::HandlerResponse::Unhandled;
      send_error(res, {401, "Incorrect or missing API key: expected the header 'Authorization: Bearer <key>' with the key given to --api-key",
                       "invalid_request_error", "", "invalid_api_key"});
      return httplib::Server::HandlerResponse::Handled;
    });
    http_.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // already an API error
      ApiError e{res.status, message("HTTP error ", res.status), res.status >= 500 ? "server_error" : "invalid_request_error", "", ""};
      if (res.status == 404)
        e.message = message("Unknown request: ", req.method, " ", dump(json(req.path.substr(0, 200))),
                            " (endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics)");
      if (res.status == 413) e.message = message("The request body is larger than ", kMaxBodyBytes, " bytes");
      send_error(res, e);
      return httplib::Server::HandlerResponse::Handled;
    }));
    http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, {500, "Internal error: " + what, "server_error", "", ""});
    });
    http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) { metrics_.count(req.path, res.status); });
    http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); });
    http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); });
    http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const json model = {{"id", m_.id}, {"object", "model"}, {"created", started_}, {"owned_by", "mhsa"},
                          {"context_length", m_.context}};
      res.set_content(dump({{"object", "list"}, {"data", json::array({model})}}), "application/json");
    });
    http_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_.text(scheduler_.stats(), args_.parallel), "text/plain; version=0.0.4");
    });
  }

  // The port bound (the one chosen for --port 0). Throws mhsa::Error when it cannot bind.
  int bind() {
    const int port = args_.port == 0 ? http_.bind_to_any_port(args_.host) : http_.bind_to_port(args_.host, args_.port) ? args_.port : -1;
    if (port <= 0)
      throw Error(message("mhsa serve: --host/--port: expected an address to listen on, got ", args_.host, ":", args_.port,
                          " (cannot bind: in use, or not an address of this machine)"));
    return port;
  }
  void listen() { http_.listen_after_bind(); }
  void stop() { http_.stop(); }

 private:
  void generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    ParsedRequest p;
    try {
      p = parse_request(req.body, m_, chat);
    } catch (const ApiError& e) {
      return send_error(res, e);
    }
    const ResponseIds ids{message(chat ? "chatcmpl-" : "cmpl-", ++next_id_), unix_time()};
    const int64_t prompt_tokens = static_cast<int64_t>(p.request.prompt.size());
    const bool logprobs = p.request.top_logprobs >= 0;
    // echo: the prompt's text first, with its tokens' log-probabilities (one forward over the
    // prompt on this thread, one such request at a time: what lm-evaluation-harness's
    // loglikelihood tasks ask for, with max_tokens 0 or 1).
    auto echo = std::make_shared<std::vector<serve::TokenLogprob>>();
    if (p.echo && logprobs) {
      try {
        std::lock_guard lock(echo_mutex_);
        *echo = prompt_logprobs(m_, p.request.prompt, p.request.top_logprobs);
      } catch (const std::exception& e) {
        return send_error(res, {500, message("The prompt's log-probabilities could not be computed: ", e.what()),
                                "server_error", "", ""});
      }
    }
    const std::string echo_text = p.echo_text;
    const int64_t echo_points = code_points(echo_text);
    // The generated tokens' offsets after the prompt's text.
    const auto after_echo = [echo_points](std::vector<serve::TokenLogprob>& lps) {
      for (serve::TokenLogprob& lp : lps) lp.text_offset += echo_points;
    };
    if (p.echo && p.request.options.max_new_tokens == 0) {  // nothing to generate
      if (!p.stream) {
        res.set_content(dump(completion_json(ids, m_, false, echo_text, Finish::length, prompt_tokens, 0,
                                             logprobs ? echo.get() : nullptr)),
                        "application/json");
      } else {
        std::string body = sse(chunk_json(ids, m_, false, echo_text, Finish::length, true, logprobs ? echo.get() : nullptr));
        if (p.include_usage) body += sse(usage_chunk_json(ids, m_, false, prompt_tokens, 0));
        res.set_header("Cache-Control", "no-cache");
        res.set_content(body + "data: [DONE]\n\n", "text/event-stream");
      }
      return;
    }
    auto job = std::make_shared<serve::Job>(std::move(p.request));
    if (!scheduler_.fits(job->request()))
      return send_error(res, {503, message("The request's prompt + max_tokens (", job->request().prompt.size(), " + ",
                                           job->request().options.max_new_tokens,
                                           " tokens) needs more KV cache than the server has (--kv-blocks)"),
                              "server_error", "", "kv_cache_full"});
    if (!scheduler_.submit(job))
      return send_error(res, {503, message("The server is busy (", args_.queue, " requests already waiting) or shutting down; retry later"),
                              "server_error", "", "overloaded"});
    if (!p.stream) {
      std::string text;
      std::vector<serve::TokenLogprob> lps;
      serve::Job::Update u;
      do {
        u = job->wait(std::chrono::seconds(1));
        text += u.text;
        lps.insert(lps.end(), std::make_move_iterator(u.logprobs.begin()), std::make_move_iterator(u.logprobs.end()));
      } while (u.finish == Finish::running);
      metrics_.finished(*job);
      if (p.echo) {
        text = echo_text + text;
        after_echo(lps);
        lps.insert(lps.begin(), echo->begin(), echo->end());
      }
      if (u.finish == Finish::cancelled) return send_error(res, {503, "The server is shutting down", "server_error", "", "shutting_down"});
      // The server is at fault (non-finite logits, a failed step), not busy: 500, and it goes on serving.
      if (u.finish == Finish::error) return send_error(res, {500, "The request could not be run: " + u.error, "server_error", "", ""});
      res.set_content(dump(completion_json(ids, m_, chat, text, u.finish, prompt_tokens, u.completion_tokens,
                                           logprobs ? &lps : nullptr, u.cached_tokens)),
                      "application/json");
      return;
    }
    const bool usage = p.include_usage;
    auto first = std::make_shared<bool>(true);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, ids, chat, usage, prompt_tokens, first, logprobs, echo, echo_text, after_echo,
         echoed = std::make_shared<bool>(!p.echo)](size_t, httplib::DataSink& sink) {
          const auto send = [&](const std::string& s) {
            if (sink.write(s.data(), s.size())) return true;
            job->cancel();  // the client is gone
            return false;
          };
          if (!*echoed) {  // the prompt's chunk first
            *echoed = true;
            if (!send(sse(chunk_json(ids, m_, chat, echo_text, Finish::running, true, logprobs ? echo.get() : nullptr))))
              return false;
            *first = false;
            return true;
          }
          serve::Job::Update u = job->wait(kPoll);
          after_echo(u.logprobs);
          const std::vector<serve::TokenLogprob>* lps = logprobs ? &u.logprobs : nullptr;
          if ((*first || !u.text.empty() || !u.logprobs.empty()) && u.finish == Finish::running) {
            if (!send(sse(chunk_json(ids, m_, chat, u.text, Finish::running, *first, lps)))) return false;
            *first = false;
            return true;
          }
          if (u.finish == Finish::running) {  // nothing new yet: is the client still there?
            if (sink.is_writable()) return true;
            job->cancel();
            return false;
          }
          if (u.finish == Finish::cancelled || u.finish == Finish::error) {
            send(sse(error_json({u.finish == Finish::error ? 500 : 503, u.finish == Finish::error ? "The request could not be run: " + u.error : "The server is shutting down",
                                 "server_error", "", ""})));
          } else if (send(sse(chunk_json(ids, m_, chat, u.text, u.finish, *first, lps))) &&
                     (!usage || send(sse(usage_chunk_json(ids, m_, chat, prompt_tokens, u.completion_tokens, u.cached_tokens))))) {
            send("data: [DONE]\n\n");
          }
          sink.done();
          return true;
        },
        [this, job](bool) {
          job->cancel();  // a no-op once it has finished
          metrics_.finished(*job);
        });
  }

  const ServeArgs& args_;
  const ServedModel m_;
  serve::Scheduler& scheduler_;
  httplib::Server http_;
  Metrics metrics_;
  std::atomic<int64_t> next_id_{0};
  std::mutex echo_mutex_;  // one echoed prompt scored at a time
  const int64_t started_ = unix_time();
};

void run(const ServeArgs& a) {
  // SIGINT and SIGTERM go to one thread that waits for them, so that shutdown runs outside a signal
  // handler: they are blocked here, before any thread (OpenMP's, the scheduler's, the server's)
  // starts and inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone while we write: an error from write, not a signal
  use_threads(a.threads);
  // Loaded on a thread of its own that ends: loading runs OpenMP regions (quantising at load), and
  // a team started on this thread would outlive them. With more libgomp threads than CPUs (this
  // team's and the scheduler's), libgomp stops spinning at barriers and every region of every step
  // waits for a futex wake-up (an 8-client load ran 20% slower); a thread's team goes with it.
  std::optional<LoadedModel> loading;
  std::exception_ptr failed;
  std::thread([&] {
    use_threads(a.threads);
    try {
      loading.emplace(load_model(model_dir(a.model), a.dtype, a.kv_dtype));
    } catch (...) {
      failed = std::current_exception();
    }
  }).join();
  if (failed) std::rethrow_exception(failed);
  const LoadedModel& loaded = *loading;
  const int64_t max_positions = loaded.model.config().max_positions;
  if (a.ctx_size > max_positions)
    throw Error(message("mhsa serve: --ctx-size: expected at most ", max_positions, " (the model's context), got ", a.ctx_size));
  std::unique_ptr<ChatSession> chat;
  if (!loaded.tokenizer.chat_template().empty()) {
    ChatOptions o;
    o.generation.max_new_tokens = 0;
    chat = std::make_unique<ChatSession>(loaded.model, loaded.tokenizer, o);
  }
  std::mutex chat_mutex;
  std::string id = loaded.dir.filename().string();
  if (id.empty()) id = loaded.dir.parent_path().filename().string();
  ServedModel served{id, &loaded.model, &loaded.tokenizer, chat.get(), &chat_mutex, a.ctx_size > 0 ? a.ctx_size : max_positions};
  const int64_t vocab = loaded.model.config().vocab_size;
  served.completion_vocabulary = TokenVocabulary::from_tokenizer(loaded.tokenizer, vocab, loaded.model.config().eos_token_ids);
  served.chat_vocabulary = chat ? TokenVocabulary::from_tokenizer(loaded.tokenizer, vocab, chat->end_of_turn_ids())
                                : served.completion_vocabulary;

  serve::SchedulerOptions so;
  so.parallel = a.parallel;
  so.max_queue = a.queue;
  so.block_tokens = kBlockTokens;
  so.kv_blocks = a.kv_blocks > 0 ? a.kv_blocks : a.parallel * ((served.context + kBlockTokens - 1) / kBlockTokens);
  so.prefix_sharing = !a.no_prefix_sharing;
  so.preempt = a.preempt;
  so.prompt_cache.ram_bytes = a.prompt_cache_ram_mib << 20;
  so.prompt_cache.dir = a.cache_dir;
  so.prompt_cache.dir_max_bytes = a.cache_dir_max_mib << 20;
  if (!a.cache_dir.empty())  // blocks on disk belong to this model file as it is now, in this weight type
    so.prompt_cache.model = serve::model_identity(loaded.dir, message("weights ", weight_type_name(loaded.model.weight_type())));
  // The pool at start (auto: when it takes at most 3/4 of the memory available now) or as it fills.
  const auto available = static_cast<int64_t>(std::min<std::size_t>(detail::available_memory_bytes(), INT64_MAX));
  const int64_t block_bytes = loaded.model.new_kv_pool(1, kBlockTokens).memory_bytes();  // one block's, aligned
  const int64_t pool_bytes = so.kv_blocks > INT64_MAX / block_bytes ? INT64_MAX : so.kv_blocks * block_bytes;
  const bool at_start = a.kv_alloc == "startup" || (a.kv_alloc == "auto" && pool_bytes <= available / 4 * 3);
  if (pool_bytes > available / 4 * 3 && a.kv_alloc != "lazy") {
    const std::string what = message("the KV cache (", so.kv_blocks, " blocks of ", kBlockTokens, " tokens, ",
                                     detail::bytes_string(pool_bytes), ")");
    const std::string smaller = "--kv-blocks, --ctx-size, --parallel or --kv-dtype bf16 make it smaller";
    if (a.kv_alloc == "startup" && pool_bytes > available)
      throw Error(message("mhsa serve: --kv-alloc startup: expected ", what, " to fit in the memory available (",
                          detail::bytes_string(available), "), got more; ", smaller, ", or --kv-alloc lazy allocates it as it fills"));
    if (a.kv_alloc == "auto")
      std::fprintf(stderr, "mhsa serve: %s is more than 3/4 of the memory available (%s): it is allocated as it "
                   "fills; %s\n", what.c_str(), detail::bytes_string(available).c_str(), smaller.c_str());
  }
  so.allocate_kv = at_start;
  serve::Scheduler scheduler(loaded.model, loaded.tokenizer, so);
  Server server(a, served, scheduler);
  const int port = server.bind();
  std::atomic<bool> quit{false};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    quit.store(true);
    scheduler.shutdown();  // running requests end as cancelled
    server.stop();
  });
  const Model& m = loaded.model;
  std::printf("mhsa serve: listening on http://%s:%d (model %s, %s weights, %s KV cache of %s %s, context %lld "
              "tokens, %d parallel, %d threads)\n",
              a.host.c_str(), port, id.c_str(), std::string(weight_type_name(m.weight_type())).c_str(),
              std::string(kv_type_name(m.kv_type())).c_str(), detail::bytes_string(pool_bytes).c_str(),
              at_start ? "allocated" : "allocated as it fills", static_cast<long long>(served.context), a.parallel,
              omp_get_max_threads());
  std::fflush(stdout);
  server.listen();
  if (!quit.load()) pthread_kill(waiter.native_handle(), SIGTERM);  // listen ended on its own: release the waiter
  waiter.join();
  std::printf("mhsa serve: stopped\n");
  std::fflush(stdout);
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over HTTP with OpenAI's API (completions, chat completions, streaming)");
  cmd->add_option("--model", a->model,
                  "model directory (Hugging Face layout: GPT-2, Llama, Qwen, Mistral, Gemma 2); default: the embedded "
                  "byte-level model");
  cmd->add_option("--host", a->host, "address to listen on (0.0.0.0: every interface)")->default_val("127.0.0.1");
  cmd->add_option("--port", a->port, "port to listen on (0: a free one, printed)")->default_val(8080)->check(integer_in(0, 65535));
  cmd->add_option("--parallel", a->parallel, "requests generated together at most")->default_val(4)->check(integer_in(1, 256));
  cmd->add_option("--queue", a->queue, "requests waiting at most (then 503)")->default_val(16)->check(integer_in(1, 4096));
  cmd->add_option("--ctx-size", a->ctx_size, "prompt + completion tokens at most (0: the model's context)")
      ->default_val(0)
      ->check(integer_at_least(0));
  cmd->add_option("--kv-blocks", a->kv_blocks,
                  "KV cache blocks of 16 tokens in the pool (0: --parallel whole contexts' worth; a block takes "
                  "half the memory with --kv-dtype bf16 or f16)")
      ->default_val(0)
      ->check(integer_in(0, int64_t{1} << 30));
  cmd->add_option("--kv-alloc", a->kv_alloc,
                  "when the KV pool's memory is allocated: startup (all of it before serving; refused when it does "
                  "not fit in the memory available), lazy (as blocks are first used: memory grows with use, and the "
                  "requests that touch new memory wait for the kernel to clear it), auto (startup when the pool takes "
                  "at most 3/4 of the memory available, else lazy)")
      ->default_val("auto")
      ->check(one_of({"auto", "startup", "lazy"}));
  add_dtype_option(cmd, a->dtype);
  add_kv_dtype_option(cmd, a->kv_dtype);
  cmd->add_flag("--no-prefix-sharing", a->no_prefix_sharing, "compute every prompt in full (no shared KV blocks)");
  cmd->add_flag("--preempt", a->preempt,
                "admit a request by its prompt, not its prompt + max_tokens, and take KV blocks as it grows; when "
                "the pool runs out, the latest requests are preempted and resumed later by computing their tokens "
                "again (more requests at once when answers end early)");
  cmd->add_option("--prompt-cache-ram", a->prompt_cache_ram_mib,
                  "MiB of RAM that keeps the KV blocks of finished requests' prompts beyond the pool (least recently "
                  "used out first), copied back for a prompt that begins the same; 0: none")
      ->default_val(1024)
      ->check(integer_in(0, int64_t{1} << 30));
  cmd->add_option("--cache-dir", a->cache_dir,
                  "keep those KV blocks in files in DIR too (created, yours alone), read back after a restart; a file "
                  "that is corrupt or from another model, weight type or KV type is refused and recomputed");
  cmd->add_option("--cache-dir-max", a->cache_dir_max_mib, "MiB of files in --cache-dir at most (least recently used deleted)")
      ->default_val(4096)
      ->check(integer_in(1, int64_t{1} << 30));
  cmd->add_option("--api-key", a->api_key, "require 'Authorization: Bearer KEY' (all but /health)");
  add_threads_option(cmd, a->threads);
  cmd->callback([a] { run(*a); });
}

}  // namespace mhsa::cli
