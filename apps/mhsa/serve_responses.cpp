// apps/mhsa/serve_responses.cpp — OpenAI's Responses API (POST /v1/responses) over the server's
// scheduler: `input` as a string or a list of messages (roles user, assistant, system, developer;
// content as a string or input_text/output_text parts), `instructions`, `max_output_tokens`,
// temperature, top_p, streaming as the Responses events (response.created, ...,
// response.output_text.delta, ..., response.completed). Nothing is stored: `store: true`,
// `previous_response_id` and tools are refused by name, as is any field the API does not have.
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

  std::string answer(const Outcome& o) override { return dump(response(o, status(o))); }

  std::string begin(int64_t) override {
    const ojson r = response(Outcome{}, "in_progress");
    ojson item = message_item("in_progress", ojson::array());
    // One statement each: the operands of + are evaluated in no fixed order, and each event takes
    // the next sequence number.
    std::string out = event("response.created", {{"response", r}});
    out += event("response.in_progress", {{"response", r}});
    out += event("response.output_item.added", {{"output_index", 0}, {"item", item}});
    out += event("response.content_part.added",
                 {{"item_id", item_id_}, {"output_index", 0}, {"content_index", 0}, {"part", text_part("")}});
    return out;
  }

  std::string piece(std::string_view text) override {
    return event("response.output_text.delta", {{"item_id", item_id_}, {"output_index", 0}, {"content_index", 0},
                                                {"delta", std::string(text)}, {"logprobs", ojson::array()}});
  }

  std::string call(const ToolCall&) override { return {}; }  // (no tools in Responses yet)

  std::string end(const Outcome& o) override {
    const char* st = status(o);
    std::string out = event("response.output_text.done", {{"item_id", item_id_}, {"output_index", 0},
                                                          {"content_index", 0}, {"text", o.text},
                                                          {"logprobs", ojson::array()}});
    out += event("response.content_part.done",
                 {{"item_id", item_id_}, {"output_index", 0}, {"content_index", 0}, {"part", text_part(o.text)}});
    out += event("response.output_item.done", {{"output_index", 0}, {"item", message_item(st, {text_part(o.text)})}});
    out += event(std::string("response.") + (o.finish == serve::Finish::length ? "incomplete" : "completed"),
                 {{"response", response(o, st)}});
    return out;
  }

  std::string stream_error(const ApiError& e) override {
    return event("error", {{"code", e.code.empty() ? ojson(nullptr) : ojson(e.code)}, {"message", e.message},
                           {"param", e.param.empty() ? ojson(nullptr) : ojson(e.param)}});
  }

 private:
  static const char* status(const Outcome& o) { return o.finish == serve::Finish::length ? "incomplete" : "completed"; }
  static ojson text_part(const std::string& text) {
    return {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}};
  }
  ojson message_item(const char* status, ojson content) const {
    return {{"id", item_id_}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", std::move(content)}};
  }
  ojson response(const Outcome& o, const char* st) const {
    const bool done = o.finish != serve::Finish::running;
    ojson r = {{"id", id_}, {"object", "response"}, {"created_at", created_}, {"status", st}, {"error", nullptr},
               {"incomplete_details", o.finish == serve::Finish::length ? ojson{{"reason", "max_output_tokens"}} : ojson(nullptr)},
               {"model", m_.id},
               {"output", done ? ojson::array({message_item(st, {text_part(o.text)})}) : ojson::array()}};
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
};

std::unique_ptr<Exchange> start(std::string_view body, const ServedModel& m, const ResponseIds& ids) {
  json b;
  try {
    b = detail::parse_json(body, "request", "body", "a JSON object");
  } catch (const Error& e) {
    throw ApiError{400, e.what(), "invalid_request_error", "", "invalid_json"};
  }
  if (!b.is_object()) bad_field("body", "a JSON object", b);
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
  if (const json* v = field(b, "tools"); v && !(v->is_array() && v->empty())) unsupported_field("tools", "tool use");
  if (const json* v = field(b, "tool_choice"); v && !(v->is_string() && (*v == "auto" || *v == "none")))
    unsupported_field("tool_choice", "a tool choice other than \"auto\" or \"none\"");
  boolean_field(b, "parallel_tool_calls", true);
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

  std::vector<ChatMessage> messages;
  if (const json* v = field(b, "instructions")) messages.push_back({"system", string_field(*v, "instructions")});
  const json* input = field(b, "input");
  if (!input) bad_field("input", "a string or an array of input items", json());
  if (input->is_string()) {
    messages.push_back({"user", input->get<std::string>()});
  } else if (input->is_array() && !input->empty()) {
    for (size_t i = 0; i < input->size(); ++i) {
      const json& item = (*input)[i];
      const std::string where = message("input[", i, "]");
      if (!item.is_object()) bad_field(where, "a message item {\"role\", \"content\"}", item);
      if (const json* t = field(item, "type"); t && string_field(*t, where + ".type") != "message")
        unsupported_field(where + ".type", message("a ", t->dump(), " item (only messages)"));
      only_known_fields(item, {"type", "role", "content", "id", "status"}, where);
      const json* role = field(item, "role");
      if (!role || !role->is_string() || (*role != "user" && *role != "assistant" && *role != "system" && *role != "developer"))
        bad_field(where + ".role", "\"user\", \"assistant\", \"system\" or \"developer\"", role ? *role : json());
      const std::string r = role->get<std::string>();
      const json* content = field(item, "content");
      if (!content) bad_field(where + ".content", "a string or an array of content parts", json());
      // Chat templates know a system role, not OpenAI's developer role: the same place in the prompt.
      messages.push_back({r == "developer" ? "system" : r, content_text(*content, where + ".content", r)});
    }
  } else {
    bad_field("input", "a string or a non-empty array of input items", *input);
  }

  serve::Request& r = x->request;
  r.prompt = encode_conversation(m, std::move(messages), r.end_ids, "input");
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
  s["tools"] = ojson::array();
  s["top_p"] = o.top_p;
  s["truncation"] = "disabled";
  s["user"] = field(b, "user") ? ojson(b["user"]) : ojson(nullptr);
  return x;
}

}  // namespace

const ExchangeApi kOpenAiResponses{"responses", start, error_body};

}  // namespace mhsa::cli
