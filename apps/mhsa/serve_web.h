// apps/mhsa/serve_web.h — the web chat of `mhsa serve`: GET / (the page, apps/mhsa/web_chat.html,
// built into the binary) and POST /v1/explain (the attention view's numbers: what every head
// attends to over a conversation, computed as `mhsa explain --messages` computes them). The page
// itself talks to /v1/chat/completions like any other client. Not the OpenAI endpoints
// (serve_cmd.cpp, serve_api.cpp) and not the explorer's numbers (mhsa/explain.h).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include <httplib.h>

#include "serve_api.h"

namespace mhsa::cli {

class WebChat {
 public:
  // threads: the OpenMP threads an explanation runs on (0: the default), as the scheduler's.
  WebChat(const ServedModel& m, int threads);

  // GET /: the page, with a Content-Security-Policy that allows only its own inline script and
  // style (by their SHA-256) and requests to this server.
  void page(httplib::Response& res) const;
  // POST /v1/explain {"messages": [...]}: the conversation's tokens, roles, per-head summaries and
  // every head's probabilities (docs/web-chat.md). Errors are ApiErrors naming the field.
  void explain(const httplib::Request& req, httplib::Response& res);

 private:
  const ServedModel& m_;
  const int threads_;
  int64_t max_tokens_ = 0;  // /v1/explain's bound: every head's [T, T] probabilities within kExplainBytes
  std::string csp_;
  std::mutex explain_mutex_;  // one explanation at a time: its memory is the bound, not a multiple
};

}  // namespace mhsa::cli
