// apps/mhsa/serve_cmd.cpp — `mhsa serve`: an OpenAI-compatible HTTP server over one model
// (POST /v1/completions, POST /v1/chat/completions with server-sent-event streaming, POST
// /v1/embeddings, POST /tokenize and /detokenize, GET /v1/models, /health, /metrics) that also
// answers Anthropic's Messages (POST /v1/messages) and OpenAI's Responses (POST /v1/responses),
// with a web chat at / and its attention view's POST /v1/explain (serve_web.h), on Debian's
// cpp-httplib. HTTP threads parse and validate (serve_api.cpp) and stream; one scheduler thread
// owns the model's generation (src/serve/scheduler.h). One access-log line per request on stderr.
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
#include <cmath>
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
#include "mhsa/evaluate.h"
#include "options.h"
#include "serve/scheduler.h"
#include "serve_api.h"
#include "serve_exchange.h"
#include "serve_http.h"
#include "serve_tools.h"
#include "serve_web.h"
#include "speculation_options.h"

namespace mhsa::cli {
namespace {

using json = nlohmann::ordered_json;
using detail::message;
using serve::Finish;

constexpr size_t kMaxBodyBytes = size_t{1} << 20;
constexpr size_t kDrainBytes = size_t{64} << 20;  // larger declared bodies: 413 at once, unread
constexpr time_t kReadTimeoutSeconds = 2;  // between two reads of one request (and a kept-alive connection's next)
constexpr auto kPoll = std::chrono::milliseconds(100);  // how often a waiting stream looks at its client
constexpr int64_t kEmbeddingBatchTokens = 4096;  // padded rows per embeddings forward at most

struct ServeArgs {
  std::string model, host = "127.0.0.1", api_key, dtype, kv_dtype = "f32", kv_alloc = "auto";
  std::vector<std::string> aliases;
  std::string log_requests = "on";
  int port = 8080, parallel = 4, queue = 16, threads = 0;
  int64_t ctx_size = 0, kv_blocks = 0;
  bool no_prefix_sharing = false;
  bool preempt = false;
  int64_t prompt_cache_ram_mib = 1024, cache_dir_max_mib = 4096;
  std::string cache_dir;
  int64_t draft = -1;  // --draft: prompt-lookup guesses per step (-1: kDefaultDraft for greedy requests)
};

constexpr int64_t kBlockTokens = 16;  // tokens per KV block

// Request counts by path and status, and the latencies of finished generations: /metrics.
class Metrics {
 public:
  void count(const std::string& path, int status) {
    static const char* const known[] = {"/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses",
                                        "/v1/embeddings",  "/tokenize",            "/detokenize",  "/v1/models",
                                        "/health",         "/metrics",             "/",            "/v1/explain"};
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
    metric("mhsa_speculative_guesses_total", "counter", "Guessed tokens (prompt lookup) checked in the steps' forwards.");
    out += message("mhsa_speculative_guesses_total ", s.guesses_drafted, "\n");
    metric("mhsa_speculative_guesses_accepted_total", "counter", "Guessed tokens kept: tokens made without a forward of their own.");
    out += message("mhsa_speculative_guesses_accepted_total ", s.guesses_accepted, "\n");
    metric("mhsa_decode_forwards_total", "counter",
           "Sequences' forwards that sampled tokens (mhsa_generated_tokens_total ÷ this: tokens per forward).");
    out += message("mhsa_decode_forwards_total ", s.decode_forwards, "\n");
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

// What the access log says of the request a thread serves: httplib runs a request's handlers, its
// content provider and its logger on the connection's thread, one request after another.
struct RequestRecord {
  std::chrono::steady_clock::time_point start;
  bool started = false;  // the headers were read (pre-routing ran); else no duration
  std::string id;
  int64_t prompt_tokens = -1, completion_tokens = -1;  // −1: not a generation, or not known
  int64_t streamed_bytes = 0;                          // a content provider's bytes
  int64_t drafted = 0, accepted = 0;                   // speculation's guesses checked and kept
  void took(const serve::Job::Update& u) {
    completion_tokens = u.completion_tokens;
    drafted = u.drafted;
    accepted = u.accepted;
  }
};
thread_local RequestRecord t_request;

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump(error_json(e)), "application/json");
}

// An error answered before the body is read, on a connection then closed, so that what follows the
// headers is not read as a next request (a client that sent "Content-Length: -5" and a body waited
// 2 s for the close). httplib closes a connection whose content provider fails: the body goes as
// one whole chunk, then the provider reports failure.
void send_error_and_close(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_header("Connection", "close");
  auto body = std::make_shared<const std::string>(dump(error_json(e)));
  res.set_chunked_content_provider("application/json", [body](size_t, httplib::DataSink& sink) {
    if (sink.write(body->data(), body->size())) t_request.streamed_bytes += static_cast<int64_t>(body->size());
    sink.done();
    return false;
  });
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
      : args_(a), m_(std::move(served)), scheduler_(scheduler), web_(m_, a.threads), log_(a.log_requests == "on") {
    http_.new_task_queue = [] { return new ConnectionThreads(); };
    http_.set_payload_max_length(kMaxBodyBytes);
    http_.set_read_timeout(kReadTimeoutSeconds, 0);
    http_.set_keep_alive_timeout(kReadTimeoutSeconds);
    http_.set_socket_options([this](socket_t sock) {  // not httplib's SO_REUSEPORT: a port in use is an error
      const int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_socket_ = sock;  // the last one tried is the one bound
    });
    http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      t_request = RequestRecord{std::chrono::steady_clock::now(), true, message("req-", ++next_id_), -1, -1, 0};
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
          send_error_and_close(res, {400, message("Content-Length: expected a decimal byte count, got ",
                                                  dump(json(length.substr(0, 40)))),
                                     "invalid_request_error", "", ""});
          return httplib::Server::HandlerResponse::Handled;
        }
        if (std::stoull(length) > kDrainBytes) {
          send_error_and_close(res, {413, message("The request body is larger than ", kMaxBodyBytes,
                                                  " bytes (Content-Length: ", length, ")"),
                                     "invalid_request_error", "", ""});
          return httplib::Server::HandlerResponse::Handled;
        }
      }
      // The chat page holds no secret: it asks for the key and sends it with its requests.
      if (args_.api_key.empty() || req.path == "/health" || (req.path == "/" && req.method == "GET"))
        return httplib::Server::HandlerResponse::Unhandled;
      // OpenAI's clients send the key as a bearer token, Anthropic's as x-api-key.
      if (same_secret(req.get_header_value("Authorization"), "Bearer " + args_.api_key) ||
          (req.has_header("x-api-key") && same_secret(req.get_header_value("x-api-key"), args_.api_key)))
        return httplib::Server::HandlerResponse::Unhandled;
      send_error(res, {401, "Incorrect or missing API key: expected the header 'Authorization: Bearer <key>' with the key given to --api-key",
                       "invalid_request_error", "", "invalid_api_key"});
      return httplib::Server::HandlerResponse::Handled;
    });
    http_.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty() || res.content_provider_)  // already an API error (send_error_and_close's a provider)
        return httplib::Server::HandlerResponse::Unhandled;
      ApiError e{res.status, message("HTTP error ", res.status), res.status >= 500 ? "server_error" : "invalid_request_error", "", ""};
      if (res.status == 404)
        e.message = message("Unknown request: ", req.method, " ", dump(json(req.path.substr(0, 200))),
                            " (endpoints: POST /v1/completions, POST /v1/chat/completions, POST /v1/messages, POST /v1/responses, "
                            "POST /v1/embeddings, POST /tokenize, POST /detokenize, GET /v1/models, GET /health, GET /metrics, "
                            "GET / (the web chat), POST /v1/explain)");
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
    http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      metrics_.count(req.path, res.status);
      if (log_.on()) log_.add(access_line(req, res));
      t_request = RequestRecord{};
    });
    http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); });
    http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); });
    http_.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) { converse(req, res, kAnthropicMessages); });
    http_.Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) { converse(req, res, kOpenAiResponses); });
    http_.Post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res) { embeddings(req, res); });
    http_.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
      try {
        res.set_content(dump(tokenize_json(req.body, m_)), "application/json");
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    });
    http_.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
      try {
        res.set_content(dump(detokenize_json(req.body, m_)), "application/json");
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    });
    http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      // The served id first, then its other names (every name, listed or not, gets this model).
      json data = json::array();
      for (const std::string& name : names()) {
        json model = {{"id", name}, {"object", "model"}, {"created", started_}, {"owned_by", "mhsa"},
                      {"context_length", m_.context}, {"embedding_width", m_.model->config().hidden_size},
                      {"embedding_pooling", "mean of the final norm's output over the input's tokens, L2-normalised"}};
        if (name != m_.id) model["root"] = m_.id;
        data.push_back(std::move(model));
      }
      res.set_content(dump({{"object", "list"}, {"data", std::move(data)}}), "application/json");
    });
    http_.Get("/", [this](const httplib::Request&, httplib::Response& res) { web_.page(res); });
    http_.Post("/v1/explain", [this](const httplib::Request& req, httplib::Response& res) { web_.explain(req, res); });
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
    // httplib listens with a backlog of 5: a burst of new connections beyond it waited for the
    // client's SYN retransmission, 1 s and more (600 connections opened at once took 15 s). Listening
    // again sets the backlog (Linux; capped by net.core.somaxconn).
    ::listen(listen_socket_, SOMAXCONN);
    return port;
  }
  void listen() { http_.listen_after_bind(); }
  void stop() { http_.stop(); }

 private:
  // The served id and its aliases, each once, in that order.
  std::vector<std::string> names() const {
    std::vector<std::string> out{m_.id};
    for (const std::string& a : m_.aliases)
      if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
    return out;
  }

  // time=… id=… client=ADDR:PORT method=… path=… status=… bytes=… [prompt_tokens=… completion_tokens=…]
  // [drafted=… accepted=…] (speculation's guesses checked and kept)
  // duration=SECONDS (from the headers read to the last byte written); never a body or a header.
  std::string access_line(const httplib::Request& req, const httplib::Response& res) const {
    const RequestRecord& r = t_request;
    std::string line = message("time=", utc_now(), " id=", r.id.empty() ? "-" : r.id, " client=", req.remote_addr, ":",
                               req.remote_port, " method=", loggable(req.method), " path=", loggable(req.path),
                               " status=", res.status, " bytes=", static_cast<int64_t>(res.body.size()) + r.streamed_bytes);
    if (r.prompt_tokens >= 0) line += message(" prompt_tokens=", r.prompt_tokens);
    if (r.completion_tokens >= 0) line += message(" completion_tokens=", r.completion_tokens);
    if (r.drafted > 0) line += message(" drafted=", r.drafted, " accepted=", r.accepted);
    if (r.started) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3f", s);
      line += message(" duration=", buf);
    }
    return line + "\n";
  }

  // Mean pooling over the final norm's output, L2-normalised: what sentence-transformers' mean
  // pooling gives for a decoder, with no instruction or last-token convention to guess. Inputs are
  // run in batches of right-padded rows (causal: the padding changes no input's rows), one
  // request at a time on this thread, as echo's prompt scoring.
  void embeddings(const httplib::Request& req, httplib::Response& res) {
    EmbeddingRequest r;
    try {
      r = parse_embeddings(req.body, m_);
    } catch (const ApiError& e) {
      return send_error(res, e);
    }
    const int64_t C = m_.model->config().hidden_size;
    std::vector<std::vector<float>> vectors;
    int64_t tokens = 0;
    try {
      std::lock_guard lock(echo_mutex_);
      for (size_t first = 0; first < r.inputs.size();) {
        size_t last = first;  // the batch: [first, last)
        int64_t T = 0;
        while (last < r.inputs.size()) {
          const int64_t t = std::max<int64_t>(T, static_cast<int64_t>(r.inputs[last].size()));
          if (last > first && t * static_cast<int64_t>(last - first + 1) > kEmbeddingBatchTokens) break;
          T = t;
          ++last;
        }
        const auto B = static_cast<int64_t>(last - first);
        std::vector<int32_t> ids(static_cast<size_t>(B * T), 0);  // [B, T], right-padded with id 0
        for (int64_t b = 0; b < B; ++b)
          std::copy(r.inputs[first + b].begin(), r.inputs[first + b].end(), ids.begin() + b * T);
        const Tensor h = hidden_states(*m_.model, ids, B, T);  // [B, T, C]
        for (int64_t b = 0; b < B; ++b) {
          const auto n = static_cast<int64_t>(r.inputs[first + b].size());
          std::vector<double> sum(static_cast<size_t>(C), 0.0);
          for (int64_t t = 0; t < n; ++t)
            for (int64_t c = 0; c < C; ++c) sum[c] += h.data()[(b * T + t) * C + c];
          double norm = 0;
          for (const double v : sum) norm += v * v;
          norm = std::sqrt(norm);
          std::vector<float> v(static_cast<size_t>(C));
          for (int64_t c = 0; c < C; ++c) v[c] = static_cast<float>(norm > 0 ? sum[c] / norm : 0.0);
          vectors.push_back(std::move(v));
          tokens += n;
        }
        first = last;
      }
    } catch (const std::exception& e) {
      return send_error(res, {500, message("The embeddings could not be computed: ", e.what()), "server_error", "", ""});
    }
    t_request.id = "embd-" + t_request.id.substr(4);
    t_request.prompt_tokens = tokens;
    res.set_content(dump(embeddings_json(m_, r, vectors)), "application/json");
  }

  void generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    ParsedRequest p;
    try {
      p = parse_request(req.body, m_, chat);
    } catch (const ApiError& e) {
      return send_error(res, e);
    }
    const ResponseIds ids{message(chat ? "chatcmpl-" : "cmpl-", t_request.id.substr(4)), unix_time()};
    t_request.id = ids.id;
    const int64_t prompt_tokens = static_cast<int64_t>(p.request.prompt.size());
    t_request.prompt_tokens = prompt_tokens;
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
    speculate(p.request);
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
      t_request.took(u);
      if (p.tools) {
        ToolCallStream split(p.tools->format, p.tools->tools);
        ToolCallStream::Out a = split.add(p.tools->forced + text), b = split.finish();
        a.content += b.content;
        a.calls.insert(a.calls.end(), b.calls.begin(), b.calls.end());
        res.set_content(dump(tool_completion_json(ids, m_, a.content, a.calls, u.finish, prompt_tokens,
                                                  u.completion_tokens, u.cached_tokens)),
                        "application/json");
        return;
      }
      res.set_content(dump(completion_json(ids, m_, chat, text, u.finish, prompt_tokens, u.completion_tokens,
                                           logprobs ? &lps : nullptr, u.cached_tokens)),
                      "application/json");
      return;
    }
    const bool usage = p.include_usage;
    auto first = std::make_shared<bool>(true);
    std::shared_ptr<ToolCallStream> split;
    if (p.tools) {
      split = std::make_shared<ToolCallStream>(p.tools->format, p.tools->tools);
      split->add(p.tools->forced);  // (held back: the start of a call)
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, ids, chat, usage, prompt_tokens, first, logprobs, echo, echo_text, after_echo,
         echoed = std::make_shared<bool>(!p.echo), tools = p.tools,
         split,
         calls = std::make_shared<int>(0)](size_t, httplib::DataSink& sink) {
          const auto send = [&](const std::string& s) {
            if (sink.write(s.data(), s.size())) {
              t_request.streamed_bytes += static_cast<int64_t>(s.size());
              return true;
            }
            job->cancel();  // the client is gone
            return false;
          };
          if (tools) {  // content and calls as they are known: text that may begin a call is held back
            serve::Job::Update u = job->wait(kPoll);
            ToolCallStream::Out out = split->add(u.text);
            if (u.finish == Finish::stop || u.finish == Finish::length) {
              ToolCallStream::Out rest = split->finish();
              out.content += rest.content;
              out.calls.insert(out.calls.end(), rest.calls.begin(), rest.calls.end());
            }
            for (const json& c : tool_chunks(ids, m_, out, *first, *calls))
              if (!send(sse(c))) return false;
            if (u.finish == Finish::running) {
              if (sink.is_writable()) return true;
              job->cancel();
              return false;
            }
            t_request.took(u);
            if (u.finish == Finish::cancelled || u.finish == Finish::error) {
              send(sse(error_json({u.finish == Finish::error ? 500 : 503,
                                   u.finish == Finish::error ? "The request could not be run: " + u.error : "The server is shutting down",
                                   "server_error", "", ""})));
            } else {
              json last = chunk_json(ids, m_, true, "", u.finish, *first);
              if (*calls > 0) last["choices"][0]["finish_reason"] = "tool_calls";
              if (send(sse(last)) &&
                  (!usage || send(sse(usage_chunk_json(ids, m_, true, prompt_tokens, u.completion_tokens, u.cached_tokens)))))
                send("data: [DONE]\n\n");
            }
            sink.done();
            return true;
          }
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
          t_request.took(u);
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

  // A request of Anthropic's Messages or OpenAI's Responses API: the exchange checks it and writes
  // its answer or events; the job runs as a chat completion's does.
  void converse(const httplib::Request& req, httplib::Response& res, const ExchangeApi& api) {
    const auto fail = [&](const ApiError& e) {
      res.status = e.status;
      res.set_content(api.error_body(e), "application/json");
    };
    const ResponseIds ids{t_request.id.substr(4), unix_time()};  // (the log's request number)
    std::shared_ptr<Exchange> x;
    try {
      x = api.start(req.body, m_, ids);
    } catch (const ApiError& e) {
      return fail(e);
    }
    t_request.id = message(api.name == std::string("messages") ? "msg_" : "resp_", ids.id);
    const int64_t prompt_tokens = static_cast<int64_t>(x->request.prompt.size());
    t_request.prompt_tokens = prompt_tokens;
    speculate(x->request);
    auto job = std::make_shared<serve::Job>(std::move(x->request));
    if (!scheduler_.fits(job->request()))
      return fail({503, message("The request's prompt + max tokens (", prompt_tokens, " + ",
                                job->request().options.max_new_tokens, " tokens) needs more KV cache than the server has (--kv-blocks)"),
                   "server_error", "", "kv_cache_full"});
    if (!scheduler_.submit(job))
      return fail({503, message("The server is busy (", args_.queue, " requests already waiting) or shutting down; retry later"),
                   "server_error", "", "overloaded"});
    const auto outcome = [prompt_tokens](std::string text, std::vector<ToolCall> calls, const serve::Job::Update& u) {
      return Outcome{std::move(text), std::move(calls), u.finish, u.stop_string, prompt_tokens, u.completion_tokens,
                     u.cached_tokens};
    };
    std::shared_ptr<ToolCallStream> split;
    if (x->tools) {
      split = std::make_shared<ToolCallStream>(x->tools->format, x->tools->tools);
      split->add(x->tools->forced);  // (held back: the start of a call)
    }
    const auto failure = [](const serve::Job::Update& u) {
      return u.finish == Finish::error ? ApiError{500, "The request could not be run: " + u.error, "server_error", "", ""}
                                       : ApiError{503, "The server is shutting down", "server_error", "", "shutting_down"};
    };
    if (!x->stream) {
      std::string text;
      serve::Job::Update u;
      do {
        u = job->wait(std::chrono::seconds(1));
        text += u.text;
      } while (u.finish == Finish::running);
      metrics_.finished(*job);
      t_request.took(u);
      if (u.finish == Finish::cancelled || u.finish == Finish::error) return fail(failure(u));
      std::vector<ToolCall> calls;
      if (split) {
        ToolCallStream::Out a = split->add(text), b = split->finish();
        text = a.content + b.content;
        calls = std::move(a.calls);
        calls.insert(calls.end(), b.calls.begin(), b.calls.end());
      }
      res.set_content(x->answer(outcome(std::move(text), std::move(calls), u)), "application/json");
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [x, job, prompt_tokens, outcome, failure, split, begun = std::make_shared<bool>(false),
         text = std::make_shared<std::string>(),
         calls = std::make_shared<std::vector<ToolCall>>()](size_t, httplib::DataSink& sink) {
          const auto send = [&](const std::string& s) {
            if (sink.write(s.data(), s.size())) {
              t_request.streamed_bytes += static_cast<int64_t>(s.size());
              return true;
            }
            job->cancel();  // the client is gone
            return false;
          };
          if (!*begun) {
            *begun = true;
            return send(x->begin(prompt_tokens));
          }
          serve::Job::Update u = job->wait(kPoll);
          ToolCallStream::Out out{u.text, {}};
          if (split) {
            out = split->add(u.text);
            if (u.finish == Finish::stop || u.finish == Finish::length) {
              ToolCallStream::Out rest = split->finish();
              out.content += rest.content;
              out.calls.insert(out.calls.end(), rest.calls.begin(), rest.calls.end());
            }
          }
          *text += out.content;
          if (!out.content.empty() && !send(x->piece(out.content))) return false;
          for (const ToolCall& c : out.calls) {
            calls->push_back(c);
            if (!send(x->call(c))) return false;
          }
          if (u.finish == Finish::running) {
            if (!u.text.empty() || sink.is_writable()) return true;
            job->cancel();  // nothing new, and the client has gone
            return false;
          }
          t_request.took(u);
          if (u.finish == Finish::cancelled || u.finish == Finish::error)
            send(x->stream_error(failure(u)));
          else
            send(x->end(outcome(*text, *calls, u)));
          sink.done();
          return true;
        },
        [this, job](bool) {
          job->cancel();  // a no-op once it has finished
          metrics_.finished(*job);
        });
  }

  // As mhsa generate: by default only greedy requests guess (their tokens are plain decoding's bit
  // for bit); a sampled one keeps its distribution but not the text its seed gives without, so only
  // an explicit --draft speculates it.
  void speculate(serve::Request& r) const {
    r.options.speculation.draft_tokens = args_.draft >= 0 ? args_.draft : r.options.temperature <= 0 ? kDefaultDraft : 0;
  }

  const ServeArgs& args_;
  const ServedModel m_;
  serve::Scheduler& scheduler_;
  httplib::Server http_;
  Metrics metrics_;
  AccessLog log_;
  socket_t listen_socket_ = -1;
  std::atomic<int64_t> next_id_{0};
  std::mutex echo_mutex_;  // one echoed prompt scored, or one embeddings request run, at a time
  const int64_t started_ = unix_time();
  WebChat web_;  // after m_, which it reads
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
  std::vector<std::string> aliases = a.aliases;
  if (loaded.dir.has_extension()) aliases.push_back(loaded.dir.stem().string());  // a .gguf file's stem
  aliases.push_back("default");
  ServedModel served{id, aliases, &loaded.model, &loaded.tokenizer, chat.get(), &chat_mutex,
                     a.ctx_size > 0 ? a.ctx_size : max_positions};
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
  cmd->add_option("-m,--model", a->model,
                  "model directory (Hugging Face layout: GPT-2, Llama, Qwen, Mistral, Gemma 2); default: the embedded "
                  "byte-level model");
  cmd->add_option("--host", a->host, "address to listen on (0.0.0.0: every interface)")->default_val("127.0.0.1");
  cmd->add_option("--port", a->port, "port to listen on (0: a free one, printed)")->default_val(8080)->check(integer_in(0, 65535));
  cmd->add_option("--parallel", a->parallel, "requests generated together at most")->default_val(4)->check(integer_in(1, 256));
  cmd->add_option("--queue", a->queue, "requests waiting at most (then 503)")->default_val(16)->check(integer_in(1, 4096));
  cmd->add_option("-c,--ctx-size", a->ctx_size, "prompt + completion tokens at most (0: the model's context)")
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
  cmd->add_option("--alias", a->aliases,
                  "another name /v1/models lists for the model (repeatable); a request naming any model, listed or "
                  "not, gets this one");
  cmd->add_option("--log-requests", a->log_requests,
                  "one line per request on stderr: time, id, client, method, path, status, bytes, tokens, duration "
                  "(never a body or a key)")
      ->default_val("on")
      ->check(one_of({"on", "off"}));
  cmd->add_option("--draft,--draft-max", a->draft,
                  "speculative decoding: tokens guessed ahead by prompt lookup per request and checked in the step's "
                  "forward (0: off; default " + std::to_string(kDefaultDraft) +
                      " for greedy requests, none for sampled ones; given, sampled requests guess too). Only as many "
                      "as pay are checked, and a step keeps to the rows that give each one a lone step's bits")
      ->check(integer_in(0, 64));
  add_threads_option(cmd, a->threads);
  cmd->callback([a] { run(*a); });
}

}  // namespace mhsa::cli
