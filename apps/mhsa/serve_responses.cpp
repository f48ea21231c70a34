// apps/mhsa/serve_responses.cpp — OpenAI's Responses API (POST /v1/responses) over the server's
// scheduler: `input` as a string or a list of messages (roles user, assistant, system, developer;
// content as a string or input_text/output_text parts), `instructions`, `max_output_tokens`,
// temperature, top_p, streaming as the Responses events (response.created, ...,
// response.output_text.delta, ..., response.completed). Nothing is stored: `store: true`,
// `previous_response_id` and hosted tools are refused by name, as is any field the API does not
// have. Function tools work as in chat completions (serve_tools.h): function_call and
// function_call_output items in, function_call items out.
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

std::string error_body(const ApiError& e) { return dump(error_json(e)); }

void only_known_fields(const json& object, const std::set<std::string>& known, const std::string& where) {
  for (const auto& [key, value] : object.items())
    if (!known.contains(key))
      throw ApiError{400, message("Unknown parameter: '", where.empty() ? "" : where + ".", key, "'."),
                     "invalid_request_error", where.empty() ? key : where + "." + key, "unknown_parameter"};
}

// A message item's content: a string or a list of text parts.
std::string content_text(const json& content, const std::string& where, const std::string& role) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_field(where, "a string or an array of content parts", content);
  std::string text;
  for (size_t k = 0; k < content.size(); ++k) {
    const json& part = content[k];
    const std::string at = message(where, "[", k, "]");
    if (!part.is_object()) bad_field(at, "a {\"type\": \"input_text\", \"text\": ...} part", part);
    const json* type = field(part, "type");
    if (!type) bad_field(at + ".type", "a string", json());
    const std::string t = string_field(*type, at + ".type");
    const char* expected = role == "assistant" ? "output_text" : "input_text";
    if (t != expected && !(role == "assistant" && t == "refusal")) {
      if (t == "input_text" || t == "output_text") bad_field(at + ".type", message("\"", expected, "\" in a ", role, " message"), *type);
      unsupported_field(at + ".type", message("a ", json(t).dump(), " part (only text)"));
    }
    only_known_fields(part, {"type", "text", "refusal", "annotations", "logprobs"}, at);
    const json* value = field(part, t == "refusal" ? "refusal" : "text");
    if (!value) bad_field(at + (t == "refusal" ? ".refusal" : ".text"), "a string", json());
    text += string_field(*value, at + (t == "refusal" ? ".refusal" : ".text"));
  }
  return text;
}

class ResponsesExchange final : public Exchange {
 public:
  ResponsesExchange(const ServedModel& m, const ResponseIds& ids)
      : m_(m), id_("resp_" + ids.id), item_id_("msg_" + ids.id), created_(ids.created) {}

  ojson settings;  // the request's settings, echoed in the response object as OpenAI does

  std::string answer(const Outcome& o) override {
    ojson items = ojson::array();
    if (!o.text.empty() || o.calls.empty()) items.push_back(message_item(item_id_, status(o), {text_part(o.text)}));
    for (const ToolCall& c : o.calls) items.push_back(call_item(c, "completed"));
    return dump(response(o, status(o), std::move(items)));
  }

  // Each event is one statement: the operands of + are evaluated in no fixed order, and each event
  // takes the next sequence number.
  std::string begin(int64_t) override {
    const ojson r = response(Outcome{}, "in_progress", ojson::array());
    std::string out = event("response.created", {{"response", r}});
    out += event("response.in_progress", {{"response", r}});
    return out;
  }

  // Output items are opened as their content comes: a message for text, a function_call per call.
  std::string piece(std::string_view text) override {
    std::string out;
    if (message_ < 0) {
      message_ = static_cast<int>(items_.size());
      items_.push_back(message_item(message_id(), "in_progress", ojson::array()));
      out += event("response.output_item.added", {{"output_index", message_}, {"item", items_.back()}});
      out += event("response.content_part.added", {{"item_id", message_id()}, {"output_index", message_},
                                                   {"content_index", 0}, {"part", text_part("")}});
    }
    text_ += text;
    out += event("response.output_text.delta", {{"item_id", message_id()}, {"output_index", message_}, {"content_index", 0},
                                                {"delta", std::string(text)}, {"logprobs", ojson::array()}});
    return out;
  }

  std::string call(const ToolCall& c) override {
    std::string out = close_message();
    const int index = static_cast<int>(items_.size());
    ojson item = call_item(c, "in_progress");
    item["arguments"] = "";
    out += event("response.output_item.added", {{"output_index", index}, {"item", item}});
    out += event("response.function_call_arguments.delta",
                 {{"item_id", item["id"]}, {"output_index", index}, {"delta", c.arguments}});
    out += event("response.function_call_arguments.done",
                 {{"item_id", item["id"]}, {"output_index", index}, {"name", c.name}, {"arguments", c.arguments}});
    items_.push_back(call_item(c, "completed"));
    out += event("response.output_item.done", {{"output_index", index}, {"item", items_.back()}});
    return out;
  }

  std::string end(const Outcome& o) override {
    std::string out;
    if (items_.empty()) out += piece("");  // an answer without text or calls is one empty message
    out += close_message(status(o));
    out += event(std::string("response.") + (o.finish == serve::Finish::length ? "incomplete" : "completed"),
                 {{"response", response(o, status(o), items_)}});
    return out;
  }

  std::string stream_error(const ApiError& e) override {
    return event("error", {{"code", e.code.empty() ? ojson(nullptr) : ojson(e.code)}, {"message", e.message},
                           {"param", e.param.empty() ? ojson(nullptr) : ojson(e.param)}});
  }

 private:
  std::string close_message(const char* st = "completed") {
    if (message_ < 0) return {};
    const ojson part = text_part(text_);
    std::string out = event("response.output_text.done", {{"item_id", message_id()}, {"output_index", message_},
                                                          {"content_index", 0}, {"text", text_}, {"logprobs", ojson::array()}});
    out += event("response.content_part.done",
                 {{"item_id", message_id()}, {"output_index", message_}, {"content_index", 0}, {"part", part}});
    items_[static_cast<size_t>(message_)] = message_item(message_id(), st, {part});
    out += event("response.output_item.done", {{"output_index", message_}, {"item", items_[static_cast<size_t>(message_)]}});
    message_ = -1;
    text_.clear();
    ++messages_;
    return out;
  }
  // The first message item has the response's message id; text after a call opens another.
  std::string message_id() const { return messages_ == 0 ? item_id_ : item_id_ + "_" + std::to_string(messages_); }
  static const char* status(const Outcome& o) { return o.finish == serve::Finish::length ? "incomplete" : "completed"; }
  static ojson text_part(const std::string& text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}};
  }
  static ojson message_item(const std::string& id, const char* status, ojson content) {
    return {{"id", id}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", std::move(content)}};
  }
  static ojson call_item(const ToolCall& c, const char* status) {
    return {{"id", "fc_" + (c.id.rfind("call_", 0) == 0 ? c.id.substr(5) : c.id)}, {"type", "function_call"},
            {"status", status}, {"arguments", c.arguments}, {"call_id", c.id}, {"name", c.name}};
  }
  ojson response(const Outcome& o, const char* st, ojson items) const {
    const bool done = o.finish != serve::Finish::running;
    ojson r = {{"id", id_}, {"object", "response"}, {"created_at", created_}, {"status", st}, {"error", nullptr},
               {"incomplete_details", o.finish == serve::Finish::length ? ojson{{"reason", "max_output_tokens"}} : ojson(nullptr)},
               {"model", m_.id}, {"output", std::move(items)}};
    for (const auto& [k, v] : settings.items()) r[k] = v;
    r["usage"] = done ? ojson{{"input_tokens", o.prompt_tokens},
                              {"input_tokens_details", {{"cached_tokens", o.cached_tokens}}},
                              {"output_tokens", o.completion_tokens},
                              {"output_tokens_details", {{"reasoning_tokens", 0}}},
                              {"total_tokens", o.prompt_tokens + o.completion_tokens}}
                      : ojson(nullptr);
    return r;
  }
  std::string event(const std::string& type, ojson fields) {
    ojson j = {{"type", type}, {"sequence_number", sequence_++}};
    for (auto& [k, v] : fields.items()) j[k] = std::move(v);
    return sse_event(type, j);
  }

  const ServedModel& m_;
  const std::string id_, item_id_;
  const int64_t created_;
  int64_t sequence_ = 0;
  ojson items_ = ojson::array();  // the stream's output items, in order
  int message_ = -1;              // the open message item's index
  int messages_ = 0;              // message items closed
  std::string text_;              // the open message's text
};

// Responses' tools and tool_choice as chat completions' (parse_tools' input).
json chat_tools(const json& b) {
  json out = json::object();
  if (const json* v = field(b, "tools")) {
    if (!v->is_array()) bad_field("tools", "an array of {\"type\": \"function\", \"name\", \"parameters\"} objects", *v);
    json list = json::array();
    for (size_t i = 0; i < v->size(); ++i) {
      const json& t = (*v)[i];
      const std::string at = message("tools[", i, "]");
      if (!t.is_object()) bad_field(at, "a {\"type\": \"function\", \"name\", \"parameters\"} object", t);
      if (const json* type = field(t, "type"); !type || *type != "function")
        unsupported_field(at + ".type", message("a tool of type ", type ? type->dump() : "null", " (only functions)"));
      only_known_fields(t, {"type", "name", "description", "parameters", "strict"}, at);
      json f = json::object();
      for (const char* key : {"name", "description", "parameters", "strict"})
        if (const json* x = field(t, key)) f[key] = *x;
      list.push_back({{"type", "function"}, {"function", f}});
    }
    out["tools"] = list;
  }
  if (const json* c = field(b, "tool_choice")) {
    if (c->is_object() && c->value("type", "") == "function" && c->contains("name"))
      out["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*c)["name"]}}}};
    else
      out["tool_choice"] = *c;
  }
  if (const json* p = field(b, "parallel_tool_calls")) out["parallel_tool_calls"] = *p;
  return out;
}

std::unique_ptr<Exchange> start(std::string_view body, const ServedModel& m, const ResponseIds& ids) {
  const json b = parse_body(body);
  only_known_fields(b, {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream",
                        "stream_options", "store", "metadata", "user", "text", "tools", "tool_choice",
                        "parallel_tool_calls", "truncation", "reasoning", "include", "background",
                        "previous_response_id", "service_tier", "top_logprobs", "max_tool_calls",
                        "prompt_cache_key", "safety_identifier", "prompt", "conversation"},
                    "");
  auto x = std::make_unique<ResponsesExchange>(m, ids);
  if (const json* v = field(b, "model")) string_field(*v, "model");  // any name: the server runs one model
  if (boolean_field(b, "store", false)) unsupported_field("store", "storing responses (send \"store\": false)");
  if (field(b, "previous_response_id")) unsupported_field("previous_response_id", "continuing a stored response");
  if (field(b, "conversation")) unsupported_field("conversation", "stored conversations");
  if (field(b, "prompt")) unsupported_field("prompt", "stored prompt templates");
  if (boolean_field(b, "background", false)) unsupported_field("background", "running in the background");
  if (field(b, "max_tool_calls")) unsupported_field("max_tool_calls", "tool use");
  if (const json* v = field(b, "reasoning"); v && !(v->is_object() && v->empty())) unsupported_field("reasoning", "reasoning options");
  if (const json* v = field(b, "include"); v && !(v->is_array() && v->empty())) unsupported_field("include", "extra output data");
  if (const json* v = field(b, "truncation"); v && string_field(*v, "truncation") != "disabled")
    unsupported_field("truncation", "truncating the input (\"auto\")");
  if (integer_field(b, "top_logprobs", 0, 0, 20) != 0) unsupported_field("top_logprobs", "log-probabilities in Responses");
  if (const json* v = field(b, "service_tier"); v && string_field(*v, "service_tier") != "auto" && *v != "default")
    bad_field("service_tier", "\"auto\" or \"default\"", *v);
  for (const char* key : {"user", "prompt_cache_key", "safety_identifier"})
    if (const json* v = field(b, key)) string_field(*v, key);
  if (const json* v = field(b, "metadata"); v && !v->is_object()) bad_field("metadata", "an object", *v);
  if (const json* v = field(b, "text")) {
    if (!v->is_object()) bad_field("text", "an object", *v);
    only_known_fields(*v, {"format", "verbosity"}, "text");
    if (const json* f = field(*v, "format"); f && !(f->is_object() && f->value("type", "") == "text"))
      unsupported_field("text.format", "a format other than {\"type\": \"text\"}");
    if (const json* f = field(*v, "verbosity"); f && *f != "medium") unsupported_field("text.verbosity", "verbosity other than \"medium\"");
  }
  if (const json* v = field(b, "stream_options")) {
    if (!v->is_object()) bad_field("stream_options", "an object", *v);
    only_known_fields(*v, {"include_obfuscation"}, "stream_options");
    boolean_field(*v, "include_obfuscation", false);  // no obfuscation padding is sent either way
  }

  // The conversation in chat completions' shape: function_call items as an assistant's
  // tool_calls, function_call_output items as tool messages.
  json messages = json::array();
  bool tool_items = false;
  if (const json* v = field(b, "instructions")) messages.push_back({{"role", "system"}, {"content", string_field(*v, "instructions")}});
  const json* input = field(b, "input");
  if (!input) bad_field("input", "a string or an array of input items", json());
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", input->get<std::string>()}});
  } else if (input->is_array() && !input->empty()) {
    for (size_t i = 0; i < input->size(); ++i) {
      const json& item = (*input)[i];
      const std::string where = message("input[", i, "]");
      if (!item.is_object()) bad_field(where, "a message item {\"role\", \"content\"}", item);
      const json* t = field(item, "type");
      const std::string type = t ? string_field(*t, where + ".type") : "message";
      if (type == "function_call") {
        only_known_fields(item, {"type", "id", "call_id", "name", "arguments", "status"}, where);
        const std::string arguments = string_field(item.value("arguments", json()), where + ".arguments");
        bool object = false;
        try {
          object = detail::parse_json(arguments, "request", where + ".arguments", "JSON").is_object();
        } catch (const Error&) {
        }
        if (!object) bad_field(where + ".arguments", "JSON text of an object", json(arguments));
        const json call = {{"id", string_field(item.value("call_id", json()), where + ".call_id")}, {"type", "function"},
                           {"function", {{"name", string_field(item.value("name", json()), where + ".name")},
                                         {"arguments", arguments}}}};
        if (!messages.empty() && messages.back()["role"] == "assistant" && messages.back().contains("tool_calls"))
          messages.back()["tool_calls"].push_back(call);
        else
          messages.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array({call})}});
        tool_items = true;
        continue;
      }
      if (type == "function_call_output") {
        only_known_fields(item, {"type", "id", "call_id", "output", "status"}, where);
        const json* out = field(item, "output");
        if (!out) bad_field(where + ".output", "a string", json());
        messages.push_back({{"role", "tool"}, {"tool_call_id", string_field(item.value("call_id", json()), where + ".call_id")},
                            {"content", out->is_string() ? out->get<std::string>() : content_text(*out, where + ".output", "user")}});
        tool_items = true;
        continue;
      }
      if (type != "message") unsupported_field(where + ".type", message("a ", json(type).dump(), " item"));
      only_known_fields(item, {"type", "role", "content", "id", "status"}, where);
      const json* role = field(item, "role");
      if (!role || !role->is_string() || (*role != "user" && *role != "assistant" && *role != "system" && *role != "developer"))
        bad_field(where + ".role", "\"user\", \"assistant\", \"system\" or \"developer\"", role ? *role : json());
      const std::string r = role->get<std::string>();
      const json* content = field(item, "content");
      if (!content) bad_field(where + ".content", "a string or an array of content parts", json());
      // Chat templates know a system role, not OpenAI's developer role: the same place in the prompt.
      messages.push_back({{"role", r == "developer" ? "system" : r}, {"content", content_text(*content, where + ".content", r)}});
    }
  } else {
    bad_field("input", "a string or a non-empty array of input items", *input);
  }

  serve::Request& r = x->request;
  auto tools = std::make_shared<ToolRequest>(parse_tools(chat_tools(b)));
  if (!tools->tools.empty() || tool_items) {
    r.prompt = prepare_tool_request(m, messages, *tools, r);
    if (tools->active()) x->tools = tools;
  } else {
    std::vector<ChatMessage> plain;
    for (const json& msg : messages) plain.push_back({msg["role"].get<std::string>(), msg["content"].get<std::string>()});
    r.prompt = encode_conversation(m, std::move(plain), r.end_ids, "input");
  }
  const int64_t prompt = static_cast<int64_t>(r.prompt.size()), room = m.context - prompt;
  if (room < 1)
    throw ApiError{400, message("Your input exceeds the context window of this model: ", prompt, " tokens, and the context is ",
                                m.context, " (one more is needed to answer)"),
                   "invalid_request_error", "input", "context_length_exceeded"};
  const int64_t max_tokens = integer_field(b, "max_output_tokens", room, 1, std::numeric_limits<int64_t>::max());
  if (max_tokens > room)
    throw ApiError{400, message("max_output_tokens: ", prompt, " input tokens + ", max_tokens, " > ", m.context,
                                ", the context limit (at most ", room, " here)"),
                   "invalid_request_error", "max_output_tokens", "context_length_exceeded"};
  GenerationOptions& o = r.options;
  o.max_new_tokens = max_tokens;
  o.stop_at_eos = true;
  o.temperature = static_cast<float>(number_field(b, "temperature", 1.0, 0.0, 2.0));
  o.top_p = static_cast<float>(number_field(b, "top_p", 1.0, 0.0, 1.0, true));
  o.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  x->stream = boolean_field(b, "stream", false);

  ojson& s = x->settings;
  s["instructions"] = field(b, "instructions") ? ojson(b["instructions"]) : ojson(nullptr);
  s["max_output_tokens"] = field(b, "max_output_tokens") ? ojson(max_tokens) : ojson(nullptr);
  s["metadata"] = field(b, "metadata") ? ojson(b["metadata"]) : ojson::object();
  s["parallel_tool_calls"] = boolean_field(b, "parallel_tool_calls", true);
  s["previous_response_id"] = nullptr;
  s["reasoning"] = {{"effort", nullptr}, {"summary", nullptr}};
  s["store"] = false;
  s["temperature"] = o.temperature;
  s["text"] = {{"format", {{"type", "text"}}}};
  s["tool_choice"] = field(b, "tool_choice") ? ojson(b["tool_choice"]) : ojson("auto");
  s["tools"] = field(b, "tools") ? ojson(b["tools"]) : ojson::array();
  s["top_p"] = o.top_p;
  s["truncation"] = "disabled";
  s["user"] = field(b, "user") ? ojson(b["user"]) : ojson(nullptr);
  return x;
}

}  // namespace

const ExchangeApi kOpenAiResponses{"responses", start, error_body};

}  // namespace mhsa::cli
