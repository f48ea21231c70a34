// apps/mhsa/serve_api.h — the OpenAI API's requests and responses for `mhsa serve`: a JSON body
// checked field by field into a serve::Request (or an ApiError with the status and the
// OpenAI-style error body), and the JSON of completions, chat completions and their stream chunks
// (log-probabilities included: `logprobs` objects in OpenAI's two shapes, completions' and chat's).
// Responses are ordered_json: keys in OpenAI's order, top_logprobs dicts most likely first.
// No HTTP here (serve_cmd.cpp) and no scheduling (src/serve/scheduler.h).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "mhsa/chat.h"
#include "mhsa/grammar.h"
#include "mhsa/model.h"
#include "mhsa/tokenizer.h"
#include "serve/scheduler.h"

namespace mhsa::cli {

// An answer other than 200: the status and the body {"error": {message, type, param, code}}.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param, code;  // "" is written as null
};
nlohmann::ordered_json error_json(const ApiError& e);
// JSON text, any invalid UTF-8 replaced.
std::string dump(const nlohmann::ordered_json& j);

// What the endpoints share: the model, its tokenizer, the chat template (a ChatSession used only
// to render and encode conversations; null when the tokenizer has none) and the context limit.
struct ServedModel {
  std::string id;  // the name in /v1/models and in responses
  const Model* model = nullptr;
  const Tokenizer* tokenizer = nullptr;
  ChatSession* chat = nullptr;
  std::mutex* chat_mutex = nullptr;  // ChatSession is one thread's at a time
  int64_t context = 0;               // --ctx-size: prompt + completion at most
  // The vocabulary's bytes for response_format and grammar: ended by the chat template's end-of-turn
  // tokens (chat) or the model's end-of-sequence tokens (completions), as the requests are.
  std::shared_ptr<const TokenVocabulary> chat_vocabulary, completion_vocabulary;
};

// A checked request.
struct ParsedRequest {
  serve::Request request;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions' echo: the prompt's text (and log-probabilities) first
  std::string echo_text;       // the prompt as given, or its ids decoded
};

// Parses the body of POST /v1/completions (chat = false) or /v1/chat/completions. Throws ApiError.
ParsedRequest parse_request(std::string_view body, const ServedModel& m, bool chat);

// The prompt's log-probabilities for `echo` (mhsa::score_tokens): one entry per token, the first
// with a NaN log-probability (null in JSON: nothing precedes it), text offsets in code points.
// Throws mhsa::Error from the model.
std::vector<serve::TokenLogprob> prompt_logprobs(const ServedModel& m, const std::vector<int32_t>& prompt, int top);
// Code points in UTF-8 text (continuation bytes not counted).
int64_t code_points(std::string_view text);

// The response of a finished request; the stream's chunks (text, the last with the finish reason;
// the usage chunk of stream_options.include_usage). logprobs: the tokens' log-probabilities (those
// of the chunk's text in a chunk), or null when the request did not ask for them. cached_tokens:
// the prompt tokens not prefilled (shared KV blocks, the prompt cache), as OpenAI's
// usage.prompt_tokens_details.cached_tokens; −1 leaves it out.
struct ResponseIds {
  std::string id;  // "cmpl-…", "chatcmpl-…"
  int64_t created = 0;
};
nlohmann::ordered_json completion_json(const ResponseIds& ids, const ServedModel& m, bool chat, const std::string& text,
                                       serve::Finish finish, int64_t prompt_tokens, int64_t completion_tokens,
                                       const std::vector<serve::TokenLogprob>* logprobs = nullptr, int64_t cached_tokens = -1);
nlohmann::ordered_json chunk_json(const ResponseIds& ids, const ServedModel& m, bool chat, const std::string& text,
                                  serve::Finish finish, bool first,
                                  const std::vector<serve::TokenLogprob>* logprobs = nullptr);
nlohmann::ordered_json usage_chunk_json(const ResponseIds& ids, const ServedModel& m, bool chat, int64_t prompt_tokens,
                                int64_t completion_tokens, int64_t cached_tokens = -1);

}  // namespace mhsa::cli
