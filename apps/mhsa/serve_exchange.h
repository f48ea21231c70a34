// apps/mhsa/serve_exchange.h — one request of the server's conversation APIs beside OpenAI's
// completions and chat (serve_api.h): Anthropic's Messages (POST /v1/messages) and OpenAI's
// Responses (POST /v1/responses). An Exchange is the checked request, then the answer or the
// stream's events in its API's own shapes; serve_cmd.cpp submits the job and writes what the
// exchange returns. No HTTP and no scheduling here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "serve/scheduler.h"
#include "serve_api.h"
#include "serve_tools.h"

namespace mhsa::cli {

// What a job produced: all of it (a whole answer, a stream's end).
struct Outcome {
  std::string text;             // the content (without the calls)
  std::vector<ToolCall> calls;  // with tools: the calls the answer made
  serve::Finish finish = serve::Finish::running;
  std::string stop_string;  // the stop sequence that ended it ("" for an end-of-turn token)
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

class Exchange {
 public:
  virtual ~Exchange() = default;
  // The whole answer's JSON.
  virtual std::string answer(const Outcome& o) = 0;
  // The stream's server-sent events: those that open it, one piece of text, those that close it
  // (o.finish is stop or length), an error that ends it.
  virtual std::string begin(int64_t prompt_tokens) = 0;
  virtual std::string piece(std::string_view text) = 0;
  virtual std::string call(const ToolCall& c) = 0;  // with tools: a call, whole
  virtual std::string end(const Outcome& o) = 0;
  virtual std::string stream_error(const ApiError& e) = 0;

  serve::Request request;  // what the scheduler runs (moved out when submitted)
  bool stream = false;
  // Tools the answer may call (tool choice not none): its text is split into content and calls.
  std::shared_ptr<const ToolRequest> tools;
};

// An API: its request checked into an Exchange (throws ApiError), and its error body.
struct ExchangeApi {
  const char* name;  // "messages", "responses": the ids' prefixes, the metrics' paths
  std::unique_ptr<Exchange> (*start)(std::string_view body, const ServedModel& m, const ResponseIds& ids);
  std::string (*error_body)(const ApiError& e);
};
extern const ExchangeApi kAnthropicMessages;  // POST /v1/messages
extern const ExchangeApi kOpenAiResponses;    // POST /v1/responses

// "event: NAME\ndata: JSON\n\n".
std::string sse_event(const std::string& name, const nlohmann::ordered_json& data);

}  // namespace mhsa::cli
