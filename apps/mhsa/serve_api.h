// apps/mhsa/serve_api.h — the OpenAI API's requests and responses for `mhsa serve`: a JSON body
// checked field by field into a serve::Request (or an ApiError with the status and the
// OpenAI-style error body), and the JSON of completions, chat completions and their stream chunks
// (log-probabilities included: `logprobs` objects in OpenAI's two shapes, completions' and chat's).
// Responses are ordered_json: keys in OpenAI's order, top_logprobs dicts most likely first. Also
// the bodies of /tokenize, /detokenize and /v1/embeddings (their pooling: serve_cmd.cpp).
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
#include "serve_fields.h"

namespace mhsa::cli {

nlohmann::ordered_json error_json(const ApiError& e);
// JSON text, any invalid UTF-8 replaced.
std::string dump(const nlohmann::ordered_json& j);

// What the endpoints share: the model, its tokenizer, the chat template (a ChatSession used only
// to render and encode conversations; null when the tokenizer has none) and the context limit.
struct ServedModel {
  std::string id;  // the name in /v1/models and in responses
  // Other names /v1/models lists for it (--alias, the weights file's stem, "default"). A request
  // may name any model, listed or not: it gets this one (many tools hard-code a model's name).
  std::vector<std::string> aliases;
  const Model* model = nullptr;
  const Tokenizer* tokenizer = nullptr;
  ChatSession* chat = nullptr;
  std::mutex* chat_mutex = nullptr;  // ChatSession is one thread's at a time
  int64_t context = 0;               // --ctx-size: prompt + completion at most
  // The vocabulary's bytes for response_format and grammar: ended by the chat template's end-of-turn
  // tokens (chat) or the model's end-of-sequence tokens (completions), as the requests are.
  std::shared_ptr<const TokenVocabulary> chat_vocabulary, completion_vocabulary;
};

struct ToolRequest;  // serve_tools.h

// A checked request.
struct ParsedRequest {
  serve::Request request;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions' echo: the prompt's text (and log-probabilities) first
  std::string echo_text;       // the prompt as given, or its ids decoded
  // Chat with tools the model may call (tool_choice not "none"): its answer is split into content
  // and calls (ToolCallStream).
  std::shared_ptr<const ToolRequest> tools;
};

// Parses the body of POST /v1/completions (chat = false) or /v1/chat/completions. Throws ApiError.
ParsedRequest parse_request(std::string_view body, const ServedModel& m, bool chat);

// Every field of a chat message is one mhsa reads, or an unimplemented one at a neutral value;
// else a 400 naming it (`where`: "messages[i]"). Throws ApiError.
void check_message_fields(const nlohmann::json& msg, const std::string& where);

// A conversation's ids through the model's chat template, and the tokens that end an answer.
// `param`: the request's field the messages came from, named in errors. continue_final: the last
// message is left open for the answer to go on (no generation prompt; transformers'
// continue_final_message). Throws ApiError (no template; the template's own errors).
std::vector<int32_t> encode_conversation(const ServedModel& m, std::vector<ChatMessage> messages,
                                         std::vector<int32_t>& end_ids, const std::string& param,
                                         bool continue_final = false);

// POST /tokenize (llama-server's shape): {"content" (or "prompt"): text, "add_special": false,
// "parse_special": true, "with_pieces": false} → {"tokens": [id, ...]}, or with_pieces
// {"tokens": [{"id", "piece"}, ...]}, a piece its text or, when its bytes are not valid UTF-8 (part
// of a character), the list of its bytes. add_special: the tokenizer's BOS/EOS as `mhsa tokenize`
// adds them; parse_special: special tokens written in the text become their ids. Throws ApiError.
nlohmann::ordered_json tokenize_json(std::string_view body, const ServedModel& m);
// POST /detokenize: {"tokens": [id, ...]} → {"content": text}, special tokens' text included. An id
// outside the tokenizer's vocabulary is a 400 naming its index. Throws ApiError.
nlohmann::ordered_json detokenize_json(std::string_view body, const ServedModel& m);

// POST /v1/embeddings (OpenAI's shape): `input` a string, strings, token ids or lists of ids (at
// most kMaxEmbeddingInputs, each non-empty and within the context, kMaxEmbeddingTokens in all);
// `encoding_format` float or base64 (little-endian float32); `dimensions` only the model's width.
// Strings are encoded as /v1/completions encodes a prompt.
constexpr size_t kMaxEmbeddingInputs = 2048;       // as OpenAI
constexpr int64_t kMaxEmbeddingTokens = 1 << 16;  // a bound on one request's work (OpenAI's: 300,000)
struct EmbeddingRequest {
  std::vector<std::vector<int32_t>> inputs;  // each input's ids
  bool base64 = false;
};
EmbeddingRequest parse_embeddings(std::string_view body, const ServedModel& m);
// The response: one embedding per input, in order; usage.prompt_tokens the inputs' tokens.
nlohmann::ordered_json embeddings_json(const ServedModel& m, const EmbeddingRequest& r,
                                       const std::vector<std::vector<float>>& vectors);

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
