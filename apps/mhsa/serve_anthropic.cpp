// apps/mhsa/serve_anthropic.cpp — Anthropic's Messages API (POST /v1/messages) over the server's
// scheduler, for the `anthropic` client and the tools built on it: `system`, messages of text
// blocks, `max_tokens` (required, as Anthropic requires it), `stop_sequences`, temperature,
// top_p, top_k, streaming as Anthropic's events (message_start, content_block_start, ping,
// content_block_delta, content_block_stop, message_delta, message_stop; `error` on a failure).
// As Anthropic's API does, a field it does not know is refused (400) by name; fields mhsa does
// not implement (tools, images, extended thinking, a final assistant message to continue) are
// refused by name too, never ignored.
#include <random>
#include <set>

#include "core/check.h"
#include "io/json.h"
#include "serve_exchange.h"

namespace mhsa::cli {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using detail::message;

constexpr size_t kMaxStopSequences = 16;

// Anthropic's error types by HTTP status.
const char* error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return "api_error";
  }
}

ojson error_object(const ApiError& e) {
  return {{"type", "error"}, {"error", {{"type", error_type(e.status)}, {"message", e.message}}}};
}

std::string error_body(const ApiError& e) { return dump(error_object(e)); }

void only_known_fields(const json& object, const std::set<std::string>& known, const std::string& where) {
  for (const auto& [key, value] : object.items())
    if (!known.contains(key))
      throw ApiError{400, message(where.empty() ? "" : where + ".", key, ": Extra inputs are not permitted (",
                                  "mhsa serve's Messages API knows no such field)"),
                     "invalid_request_error", key, ""};
}

// A message's content: a string, or text blocks (other block types refused by name).
std::string content_text(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_field(where, "a string or an array of content blocks", content);
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const json& block = content[k];
    const std::string at = message(where, "[", k, "]");
    if (!block.is_object()) bad_field(at, "a content block ({\"type\": \"text\", \"text\": ...})", block);
    const json* type = field(block, "type");
    if (!type) bad_field(at + ".type", "a string", json());
    const std::string t = string_field(*type, at + ".type");
    if (t == "tool_use" || t == "tool_result") unsupported_field(at + ".type", "tool use");
    if (t != "text") unsupported_field(at + ".type", message("a ", json(t).dump(), " block (only text)"));
    // cache_control is a hint where to cache: mhsa's prefix cache needs none.
    only_known_fields(block, {"type", "text", "cache_control", "citations"}, at);
    if (const json* c = field(block, "citations"); c && !(c->is_array() && c->empty()))
      unsupported_field(at + ".citations", "citations");
    const json* t2 = field(block, "text");
    if (!t2) bad_field(at + ".text", "a string", json());
    text += string_field(*t2, at + ".text");
  }
  return text;
}

class AnthropicExchange final : public Exchange {
 public:
  AnthropicExchange(const ServedModel& m, const ResponseIds& ids) : m_(m), id_("msg_" + ids.id) {}

  std::string answer(const Outcome& o) override {
    ojson j = message_object(o.finish == serve::Finish::running ? ojson::array() : ojson::array({text_block(o.text)}));
    j["stop_reason"] = stop_reason(o);
    j["stop_sequence"] = o.stop_string.empty() ? ojson(nullptr) : ojson(o.stop_string);
    j["usage"] = usage(o);
    return dump(j);
  }

  std::string begin(int64_t prompt_tokens) override {
    ojson start = message_object(ojson::array());
    start["stop_reason"] = nullptr;
    start["stop_sequence"] = nullptr;
    start["usage"] = {{"input_tokens", prompt_tokens}, {"output_tokens", 0}};
    return sse_event("message_start", {{"type", "message_start"}, {"message", start}}) +
           sse_event("content_block_start", {{"type", "content_block_start"}, {"index", 0}, {"content_block", text_block("")}}) +
           sse_event("ping", {{"type", "ping"}});
  }

  std::string piece(std::string_view text) override {
    return sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", 0},
                                             {"delta", {{"type", "text_delta"}, {"text", std::string(text)}}}});
  }

  std::string end(const Outcome& o) override {
    const ojson delta = {{"stop_reason", stop_reason(o)},
                         {"stop_sequence", o.stop_string.empty() ? ojson(nullptr) : ojson(o.stop_string)}};
    return sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", 0}}) +
           sse_event("message_delta", {{"type", "message_delta"}, {"delta", delta}, {"usage", usage(o)}}) +
           sse_event("message_stop", {{"type", "message_stop"}});
  }

  std::string stream_error(const ApiError& e) override { return sse_event("error", error_object(e)); }

 private:
  ojson message_object(ojson content) const {
    return {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", m_.id}, {"content", std::move(content)}};
  }
  static ojson text_block(const std::string& text) { return {{"type", "text"}, {"text", text}}; }
  static ojson stop_reason(const Outcome& o) {
    if (o.finish == serve::Finish::length) return "max_tokens";
    return o.stop_string.empty() ? "end_turn" : "stop_sequence";
  }
  // Anthropic counts the prompt's tokens read from a cache apart from input_tokens.
  static ojson usage(const Outcome& o) {
    return {{"input_tokens", o.prompt_tokens - o.cached_tokens}, {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", o.cached_tokens}, {"output_tokens", o.completion_tokens}};
  }

  const ServedModel& m_;
  const std::string id_;
};

std::unique_ptr<Exchange> start(std::string_view body, const ServedModel& m, const ResponseIds& ids) {
  json b;
  try {
    b = detail::parse_json(body, "request", "body", "a JSON object");
  } catch (const Error& e) {
    throw ApiError{400, e.what(), "invalid_request_error", "", "invalid_json"};
  }
  if (!b.is_object()) bad_field("body", "a JSON object", b);
  // temperature, top_p and top_k: the API's sampling fields, which newer clients send through extra_body.
  only_known_fields(b, {"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p",
                        "top_k", "metadata", "tools", "tool_choice", "thinking", "service_tier", "cache_control",
                        "container", "diagnostics", "inference_geo", "output_config", "speed", "user_profile_id",
                        "workspace_id"}, "");
  auto x = std::make_unique<AnthropicExchange>(m, ids);
  // Any model name: the server runs one model, and clients name one they know.
  if (const json* v = field(b, "model"); !v) bad_field("model", "a string", json());
  else string_field(*v, "model");
  if (const json* v = field(b, "tools"); v && !(v->is_array() && v->empty())) unsupported_field("tools", "tool use");
  if (field(b, "tool_choice")) unsupported_field("tool_choice", "tool use");
  if (const json* v = field(b, "thinking"); v && !(v->is_object() && v->value("type", "") == "disabled"))
    unsupported_field("thinking", "extended thinking");
  if (const json* v = field(b, "metadata")) {
    if (!v->is_object()) bad_field("metadata", "an object", *v);
    only_known_fields(*v, {"user_id"}, "metadata");
  }
  if (const json* v = field(b, "cache_control"); v && !v->is_object()) bad_field("cache_control", "an object", *v);
  if (field(b, "container")) unsupported_field("container", "a code-execution container");
  if (const json* v = field(b, "diagnostics")) {  // nothing to report: one server, its cache is by prefix
    if (!v->is_object()) bad_field("diagnostics", "an object", *v);
    only_known_fields(*v, {"previous_message_id"}, "diagnostics");
  }
  if (const json* v = field(b, "output_config")) {
    if (!v->is_object()) bad_field("output_config", "an object", *v);
    only_known_fields(*v, {"effort", "format"}, "output_config");
    if (field(*v, "effort")) unsupported_field("output_config.effort", "an effort level");
    if (field(*v, "format")) unsupported_field("output_config.format", "an output format");
  }
  if (const json* v = field(b, "speed"); v && string_field(*v, "speed") != "standard")
    unsupported_field("speed", "a speed other than \"standard\"");
  for (const char* key : {"inference_geo", "user_profile_id", "workspace_id"})
    if (const json* v = field(b, key)) string_field(*v, key);
  if (const json* v = field(b, "service_tier"); v && string_field(*v, "service_tier") != "auto" &&
                                                v->get<std::string>() != "standard_only")
    bad_field("service_tier", "\"auto\" or \"standard_only\"", *v);

  std::vector<ChatMessage> messages;
  if (const json* v = field(b, "system")) {
    std::string system;
    if (v->is_string()) {
      system = v->get<std::string>();
    } else if (v->is_array()) {
      system = content_text(*v, "system");
    } else {
      bad_field("system", "a string or an array of text blocks", *v);
    }
    messages.push_back({"system", std::move(system)});
  }
  const json* v = field(b, "messages");
  if (!v || !v->is_array() || v->empty())
    bad_field("messages", "a non-empty array of {\"role\", \"content\"} objects", v ? *v : json());
  for (size_t i = 0; i < v->size(); ++i) {
    const json& msg = (*v)[i];
    const std::string where = message("messages[", i, "]");
    if (!msg.is_object()) bad_field(where, "an object with \"role\" and \"content\"", msg);
    only_known_fields(msg, {"role", "content"}, where);
    const json* role = field(msg, "role");
    if (!role || !role->is_string() || (*role != "user" && *role != "assistant"))
      bad_field(where + ".role", "\"user\" or \"assistant\"", role ? *role : json());
    const json* content = field(msg, "content");
    if (!content) bad_field(where + ".content", "a string or an array of content blocks", json());
    messages.push_back({role->get<std::string>(), content_text(*content, where + ".content")});
  }
  if (messages.back().role == "assistant")
    unsupported_field(message("messages[", v->size() - 1, "]"),
                      "a final assistant message (continuing it; end with a user message)");

  serve::Request& r = x->request;
  r.prompt = encode_conversation(m, std::move(messages), r.end_ids, "messages");
  const json* mt = field(b, "max_tokens");
  if (!mt) bad_field("max_tokens", "an integer ≥ 1 (required)", json());
  const int64_t max_tokens = integer_field(b, "max_tokens", 0, 1, std::numeric_limits<int64_t>::max());
  const int64_t prompt = static_cast<int64_t>(r.prompt.size());
  if (prompt >= m.context)
    throw ApiError{400, message("prompt is too long: ", prompt, " tokens > ", m.context - 1, " maximum (the context, ",
                                m.context, " tokens, less one to answer)"),
                   "invalid_request_error", "messages", ""};
  if (prompt + max_tokens > m.context)
    throw ApiError{400, message("max_tokens: ", prompt, " prompt tokens + max_tokens ", max_tokens, " > ", m.context,
                                ", the context limit (max_tokens at most ", m.context - prompt, " here)"),
                   "invalid_request_error", "max_tokens", ""};
  GenerationOptions& o = r.options;
  o.max_new_tokens = max_tokens;
  o.stop_at_eos = true;
  o.temperature = static_cast<float>(number_field(b, "temperature", 1.0, 0.0, 1.0));
  o.top_p = static_cast<float>(number_field(b, "top_p", 1.0, 0.0, 1.0, true));
  o.top_k = integer_field(b, "top_k", 0, 0, std::numeric_limits<int32_t>::max());
  o.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  if (const json* s = field(b, "stop_sequences")) {
    if (!s->is_array() || s->size() > kMaxStopSequences)
      bad_field("stop_sequences", message("an array of at most ", kMaxStopSequences, " strings"), *s);
    for (size_t i = 0; i < s->size(); ++i) {
      std::string stop = string_field((*s)[i], message("stop_sequences[", i, "]"));
      if (!stop.empty()) r.stop.push_back(std::move(stop));
    }
  }
  x->stream = boolean_field(b, "stream", false);
  return x;
}

}  // namespace

const ExchangeApi kAnthropicMessages{"messages", start, error_body};

std::string sse_event(const std::string& name, const ojson& data) {
  return "event: " + name + "\ndata: " + dump(data) + "\n\n";
}

}  // namespace mhsa::cli
