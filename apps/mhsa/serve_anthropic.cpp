// apps/mhsa/serve_anthropic.cpp — Anthropic's Messages API (POST /v1/messages) over the server's
// scheduler, for the `anthropic` client and the tools built on it: `system`, messages of text
// blocks, `max_tokens` (required, as Anthropic requires it), `stop_sequences`, temperature,
// top_p, top_k, streaming as Anthropic's events (message_start, content_block_start, ping,
// content_block_delta, content_block_stop, message_delta, message_stop; `error` on a failure).
// As Anthropic's API does, a field it does not know is refused (400) by name; fields mhsa does
// not implement (server tools, images, extended thinking) are
// refused by name too, never ignored. A final assistant message is continued (a prefill).
#include <cctype>
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

// Anthropic's ids for calls: toolu_ where OpenAI's are call_.
std::string tool_use_id(const std::string& id) { return "toolu_" + (id.rfind("call_", 0) == 0 ? id.substr(5) : id); }

// Anthropic's tools and tool_choice as OpenAI's (parse_tools' input).
json openai_tools(const json& b) {
  json out = json::object();
  if (const json* v = field(b, "tools")) {
    if (!v->is_array()) bad_field("tools", "an array of {\"name\", \"description\", \"input_schema\"} objects", *v);
    json list = json::array();
    for (size_t i = 0; i < v->size(); ++i) {
      const json& t = (*v)[i];
      const std::string at = message("tools[", i, "]");
      if (!t.is_object()) bad_field(at, "a {\"name\", \"description\", \"input_schema\"} object", t);
      if (const json* type = field(t, "type"); type && *type != "custom")
        unsupported_field(at + ".type", message("a server tool (", type->dump(), "): only client tools"));
      only_known_fields(t, {"type", "name", "description", "input_schema", "cache_control", "strict"}, at);
      const json* name = field(t, "name");
      if (!name) bad_field(at + ".name", "a string", json());
      json f = {{"name", *name}};
      if (const json* d = field(t, "description")) f["description"] = *d;
      const json* schema = field(t, "input_schema");
      if (!schema || !schema->is_object()) bad_field(at + ".input_schema", "a JSON Schema object", schema ? *schema : json());
      f["parameters"] = *schema;
      list.push_back({{"type", "function"}, {"function", f}});
    }
    out["tools"] = list;
  }
  if (const json* c = field(b, "tool_choice")) {
    const std::string expected = "{\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": ...}";
    if (!c->is_object() || !c->contains("type") || !(*c)["type"].is_string()) bad_field("tool_choice", expected, *c);
    only_known_fields(*c, {"type", "name", "disable_parallel_tool_use"}, "tool_choice");
    const std::string type = (*c)["type"].get<std::string>();
    if (type == "auto") out["tool_choice"] = "auto";
    else if (type == "any") out["tool_choice"] = "required";
    else if (type == "none") out["tool_choice"] = "none";
    else if (type == "tool" && c->contains("name")) out["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*c)["name"]}}}};
    else bad_field("tool_choice", expected, *c);
    if (const json* d = field(*c, "disable_parallel_tool_use")) {
      if (!d->is_boolean()) bad_field("tool_choice.disable_parallel_tool_use", "true or false", *d);
      out["parallel_tool_calls"] = !d->get<bool>();
    }
  }
  return out;
}

class AnthropicExchange final : public Exchange {
 public:
  AnthropicExchange(const ServedModel& m, const ResponseIds& ids) : m_(m), id_("msg_" + ids.id) {}

  std::string answer(const Outcome& o) override {
    ojson content = ojson::array();
    if (!o.text.empty() || o.calls.empty()) content.push_back(text_block(o.text));
    for (const ToolCall& c : o.calls) content.push_back(tool_use_block(c, true));
    ojson j = message_object(std::move(content));
    j["stop_reason"] = stop_reason(o);
    j["stop_sequence"] = o.stop_string.empty() || !o.calls.empty() ? ojson(nullptr) : ojson(o.stop_string);
    j["usage"] = usage(o);
    return dump(j);
  }

  std::string begin(int64_t prompt_tokens) override {
    ojson start = message_object(ojson::array());
    start["stop_reason"] = nullptr;
    start["stop_sequence"] = nullptr;
    start["usage"] = {{"input_tokens", prompt_tokens}, {"output_tokens", 0}};
    return sse_event("message_start", {{"type", "message_start"}, {"message", start}}) +
           sse_event("ping", {{"type", "ping"}});
  }

  // Blocks are opened as their content comes: text, then each call (a tool_use block whose input
  // is one input_json_delta).
  std::string piece(std::string_view text) override {
    std::string out;
    if (!text_open_) {
      out += close_block();
      out += sse_event("content_block_start",
                       {{"type", "content_block_start"}, {"index", next_}, {"content_block", text_block("")}});
      text_open_ = true;
      open_ = true;
    }
    return out + sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", next_},
                                                   {"delta", {{"type", "text_delta"}, {"text", std::string(text)}}}});
  }

  std::string call(const ToolCall& c) override {
    std::string out = close_block();
    out += sse_event("content_block_start",
                     {{"type", "content_block_start"}, {"index", next_}, {"content_block", tool_use_block(c, false)}});
    out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", next_},
                                             {"delta", {{"type", "input_json_delta"}, {"partial_json", c.arguments}}}});
    open_ = true;
    return out + close_block();
  }

  std::string end(const Outcome& o) override {
    std::string out = o.text.empty() && o.calls.empty() && next_ == 0 ? piece("") : "";  // at least one block
    out += close_block();
    const ojson delta = {{"stop_reason", stop_reason(o)},
                         {"stop_sequence", o.stop_string.empty() || !o.calls.empty() ? ojson(nullptr) : ojson(o.stop_string)}};
    return out + sse_event("message_delta", {{"type", "message_delta"}, {"delta", delta}, {"usage", usage(o)}}) +
           sse_event("message_stop", {{"type", "message_stop"}});
  }

  std::string stream_error(const ApiError& e) override { return sse_event("error", error_object(e)); }

 private:
  std::string close_block() {
    if (!open_) return {};
    open_ = text_open_ = false;
    return sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", next_++}});
  }
  ojson message_object(ojson content) const {
    return {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", m_.id}, {"content", std::move(content)}};
  }
  static ojson text_block(const std::string& text) { return {{"type", "text"}, {"text", text}}; }
  static ojson tool_use_block(const ToolCall& c, bool with_input) {
    return {{"type", "tool_use"}, {"id", tool_use_id(c.id)}, {"name", c.name},
            {"input", with_input ? ojson::parse(c.arguments) : ojson::object()}};
  }
  static ojson stop_reason(const Outcome& o) {
    if (!o.calls.empty()) return "tool_use";
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
  int next_ = 0;  // the index of the open block, or of the next one
  bool open_ = false, text_open_ = false;
};

std::unique_ptr<Exchange> start(std::string_view body, const ServedModel& m, const ResponseIds& ids) {
  const json b = parse_body(body);
  // temperature, top_p and top_k: the API's sampling fields, which newer clients send through extra_body.
  only_known_fields(b, {"model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p",
                        "top_k", "metadata", "tools", "tool_choice", "thinking", "service_tier", "cache_control",
                        "container", "diagnostics", "inference_geo", "output_config", "speed", "user_profile_id",
                        "workspace_id"}, "");
  auto x = std::make_unique<AnthropicExchange>(m, ids);
  // Any model name: the server runs one model, and clients name one they know.
  if (const json* v = field(b, "model"); !v) bad_field("model", "a string", json());
  else string_field(*v, "model");
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

  // The conversation in OpenAI's chat shape: tool_use blocks as an assistant's tool_calls,
  // tool_result blocks as tool messages before the user's text.
  json messages = json::array();
  bool tool_blocks = false;
  if (const json* v = field(b, "system")) {
    std::string system;
    if (v->is_string()) {
      system = v->get<std::string>();
    } else if (v->is_array()) {
      system = content_text(*v, "system");
    } else {
      bad_field("system", "a string or an array of text blocks", *v);
    }
    messages.push_back({{"role", "system"}, {"content", std::move(system)}});
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
    const bool assistant = *role == "assistant";
    const json* content = field(msg, "content");
    if (!content) bad_field(where + ".content", "a string or an array of content blocks", json());
    json text_blocks = json::array(), calls = json::array(), results = json::array();
    if (content->is_array()) {
      for (size_t k = 0; k < content->size(); ++k) {
        const json& block = (*content)[k];
        const std::string at = message(where, ".content[", k, "]");
        const json* type = block.is_object() ? field(block, "type") : nullptr;
        if (type && *type == "tool_use") {
          if (!assistant) bad_field(at + ".type", "tool_use blocks only in assistant messages", *type);
          only_known_fields(block, {"type", "id", "name", "input", "cache_control"}, at);
          const json* input = field(block, "input");
          if (!input || !input->is_object()) bad_field(at + ".input", "an object", input ? *input : json());
          calls.push_back({{"id", string_field(block.value("id", json()), at + ".id")}, {"type", "function"},
                           {"function", {{"name", string_field(block.value("name", json()), at + ".name")},
                                         {"arguments", input->dump()}}}});
        } else if (type && *type == "tool_result") {
          if (assistant) bad_field(at + ".type", "tool_result blocks only in user messages", *type);
          only_known_fields(block, {"type", "tool_use_id", "content", "is_error", "cache_control"}, at);
          const json* c = field(block, "content");
          std::string text = c ? content_text(*c, at + ".content") : "";
          if (const json* e = field(block, "is_error"); e && e->is_boolean() && e->get<bool>()) text = "Error: " + text;
          results.push_back({{"role", "tool"}, {"tool_call_id", string_field(block.value("tool_use_id", json()), at + ".tool_use_id")},
                             {"content", text}});
        } else {
          text_blocks.push_back(block);
        }
      }
      tool_blocks |= !calls.empty() || !results.empty();
    }
    const std::string text = content->is_array() ? content_text(text_blocks, where + ".content") : content_text(*content, where + ".content");
    for (const json& r : results) messages.push_back(r);
    if (assistant) {
      json a = {{"role", "assistant"}, {"content", text}};
      if (!calls.empty()) a["tool_calls"] = calls;
      messages.push_back(std::move(a));
    } else if (!text.empty() || results.empty()) {
      messages.push_back({{"role", "user"}, {"content", text}});
    }
  }
  // A final assistant message is a prefill: the answer continues it (and leaves it out).
  const bool prefill = (*v)[v->size() - 1].value("role", "") == "assistant";
  if (prefill && (tool_blocks || field(b, "tools")))
    unsupported_field(message("messages[", v->size() - 1, "]"), "a final assistant message with tools");

  serve::Request& r = x->request;
  auto tools = std::make_shared<ToolRequest>(parse_tools(openai_tools(b)));
  if (!tools->tools.empty() || tool_blocks) {
    r.prompt = prepare_tool_request(m, messages, *tools, r);
    if (tools->active()) x->tools = tools;
  } else {
    std::vector<ChatMessage> plain;
    for (const json& msg : messages) plain.push_back({msg["role"].get<std::string>(), msg["content"].get<std::string>()});
    // As Anthropic's API: a prefill ending in whitespace would leave the answer mid-token.
    if (prefill && !plain.back().content.empty() && std::isspace(static_cast<unsigned char>(plain.back().content.back())))
      bad_field(message("messages[", v->size() - 1, "].content"), "final assistant content without trailing whitespace",
                json(plain.back().content));
    r.prompt = encode_conversation(m, std::move(plain), r.end_ids, "messages", prefill);
  }
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
