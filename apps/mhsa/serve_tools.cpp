// apps/mhsa/serve_tools.cpp — see serve_tools.h.
#include "serve_tools.h"

#include <algorithm>
#include <random>
#include <regex>

#include "core/check.h"
#include "io/json.h"
#include "mhsa/error.h"
#include "mhsa/grammar.h"
#include "mhsa/tokenizer.h"

namespace mhsa::cli {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using detail::message;

constexpr size_t kMaxTools = 128;
constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (const char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

// A message's content as text: a string, text parts, or null/absent ("").
std::string content_text(const json& msg, const std::string& where) {
  const json* c = field(msg, "content");
  if (!c) return "";
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) bad_field(where + ".content", "a string, an array of text parts or null", *c);
  std::string text;
  for (size_t k = 0; k < c->size(); ++k) {
    const json& part = (*c)[k];
    const std::string at = message(where, ".content[", k, "]");
    if (!part.is_object() || !part.contains("type")) bad_field(at, "a {\"type\": \"text\", \"text\": ...} object", part);
    if (string_field(part["type"], at + ".type") != "text") unsupported_field(at + ".type", "content other than text");
    if (!part.contains("text")) bad_field(at + ".text", "a string", json());
    text += string_field(part["text"], at + ".text");
  }
  return text;
}

// JSON text of an object, or the ApiError naming where it was.
json parse_object(const std::string& text, const std::string& where) {
  try {
    json v = detail::parse_json(text, "request", where, "a JSON object");
    if (v.is_object()) return v;
  } catch (const Error&) {
  }
  bad_field(where, "JSON text of an object", json(text));
}

std::string random_id(size_t n) {
  static const char alphabet[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 gen{std::random_device{}()};
  std::string s(n, 'a');
  for (char& c : s) c = alphabet[gen() % (sizeof alphabet - 1)];
  return s;
}

// The system message's text describing the tools, for templates that do not render them.
std::string tools_prompt(const json& tools) {
  std::string s =
      "# Tools\n\nYou may call one or more functions to answer. Their signatures are JSON objects within "
      "<tools></tools> tags:\n<tools>";
  for (const json& t : tools) s += "\n" + t.dump(-1, ' ', false, json::error_handler_t::replace);
  s += "\n</tools>\n\nTo call a function, write a JSON object with its name and arguments within "
       "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function name>, \"arguments\": <a JSON object>}\n"
       "</tool_call>";
  return s;
}

// A tool's parameters as a GBNF grammar whose rules are renamed apart (prefix + s0, ref0, ...)
// and whose start is returned as `start`; the shared JSON rules (ws, json-value, ...) are left out
// for the caller to add once.
std::string tool_rules(const json& tool, const std::string& prefix, std::string& start, std::string& primitives) {
  const json* params = field(tool["function"], "parameters");
  const std::string schema = params ? params->dump() : R"({"type": "object"})";
  const std::string where = message("tools[", prefix.substr(1), "].function.parameters");
  std::string gbnf;
  try {
    gbnf = Grammar::json_schema_to_gbnf(schema, where);
  } catch (const Error& e) {
    throw ApiError{400, e.what(), "invalid_request_error", where, ""};
  }
  // Rename the schema's own rules (s<N>, ref<N>, root) outside literals and character classes.
  std::string out;
  bool in_literal = false, in_class = false;
  for (size_t i = 0; i < gbnf.size();) {
    const char c = gbnf[i];
    if (in_literal || in_class) {
      out += c;
      if (c == '\\' && i + 1 < gbnf.size()) out += gbnf[++i];
      else if (in_literal && c == '"') in_literal = false;
      else if (in_class && c == ']') in_class = false;
      ++i;
      continue;
    }
    if (c == '"' || c == '[') {
      (c == '"' ? in_literal : in_class) = true;
      out += c;
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < gbnf.size() && (std::isalnum(static_cast<unsigned char>(gbnf[j])) || gbnf[j] == '-' || gbnf[j] == '_')) ++j;
      const std::string word = gbnf.substr(i, j - i);
      const bool own = word == "root" || std::regex_match(word, std::regex("(s|ref)[0-9]+"));
      out += own ? prefix + word : word;
      i = j;
      continue;
    }
    out += c;
    ++i;
  }
  start = prefix + "root";
  // The shared rules are the tail that starts with "ws ::=": kept once.
  const size_t at = out.find("\nws ::=");
  if (at != std::string::npos) {
    if (primitives.empty()) primitives = out.substr(at + 1);
    out.resize(at + 1);
  }
  return out;
}

}  // namespace

ToolRequest parse_tools(const json& b) {
  ToolRequest t;
  if (const json* v = field(b, "tools")) {
    if (!v->is_array() || v->size() > kMaxTools)
      bad_field("tools", message("an array of at most ", kMaxTools, " {\"type\": \"function\", \"function\": ...} objects"), *v);
    for (size_t i = 0; i < v->size(); ++i) {
      const json& tool = (*v)[i];
      const std::string at = message("tools[", i, "]");
      if (!tool.is_object()) bad_field(at, "a {\"type\": \"function\", \"function\": ...} object", tool);
      if (const json* type = field(tool, "type"); !type || *type != "function")
        bad_field(at + ".type", "\"function\"", type ? *type : json());
      const json* f = field(tool, "function");
      if (!f || !f->is_object()) bad_field(at + ".function", "an object with \"name\"", f ? *f : json());
      const json* name = field(*f, "name");
      if (!name || !name->is_string() || !valid_name(name->get<std::string>()))
        bad_field(at + ".function.name", "a name of 1 to 64 letters, digits, '_' or '-'", name ? *name : json());
      for (size_t k = 0; k < i; ++k)
        if ((*v)[k]["function"]["name"] == *name) bad_field(at + ".function.name", "a name no other tool has", *name);
      if (const json* d = field(*f, "description")) string_field(*d, at + ".function.description");
      if (const json* p = field(*f, "parameters"); p && !p->is_object())
        bad_field(at + ".function.parameters", "a JSON Schema object", *p);
      if (const json* s = field(*f, "strict"); s && !s->is_boolean()) bad_field(at + ".function.strict", "true or false", *s);
      json clean = {{"type", "function"}, {"function", {{"name", *name}}}};
      for (const char* key : {"description", "parameters"})
        if (const json* x = field(*f, key)) clean["function"][key] = *x;
      t.tools.push_back(std::move(clean));
    }
  }
  if (const json* c = field(b, "tool_choice")) {
    const std::string expected = "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}";
    if (c->is_string()) {
      const std::string s = c->get<std::string>();
      if (s == "none") t.choice = ToolRequest::Choice::none;
      else if (s == "auto") t.choice = ToolRequest::Choice::automatic;
      else if (s == "required") t.choice = ToolRequest::Choice::required;
      else bad_field("tool_choice", expected, *c);
    } else if (c->is_object() && c->value("type", "") == "function" && c->contains("function") &&
               (*c)["function"].is_object() && (*c)["function"].contains("name") && (*c)["function"]["name"].is_string()) {
      t.choice = ToolRequest::Choice::named;
      t.named = (*c)["function"]["name"].get<std::string>();
      bool known = false;
      for (const json& tool : t.tools) known |= tool["function"]["name"] == t.named;
      if (!known) bad_field("tool_choice.function.name", "the name of one of the tools", json(t.named));
    } else {
      bad_field("tool_choice", expected, *c);
    }
    if (t.choice != ToolRequest::Choice::none && t.choice != ToolRequest::Choice::automatic && t.tools.empty())
      bad_field("tool_choice", "\"none\" or \"auto\" without tools", *c);
  }
  t.parallel = boolean_field(b, "parallel_tool_calls", true);
  return t;
}

ToolFormat tool_format(const ServedModel& m) {
  const std::string source = m.tokenizer->chat_template();
  if (source.find("[TOOL_CALLS]") != std::string::npos) return ToolFormat::mistral;
  if (source.find("<tool_call>") == std::string::npos && source.find("tools_in_user_message") != std::string::npos)
    return ToolFormat::llama3;
  return ToolFormat::hermes;
}

std::vector<int32_t> encode_tool_conversation(const ServedModel& m, const json& messages, const ToolRequest& tools,
                                              std::vector<int32_t>& end_ids) {
  if (!m.chat)
    throw ApiError{400, "this model has no chat template (chat_template in tokenizer_config.json or chat_template.jinja): use /v1/completions",
                   "invalid_request_error", "messages", "no_chat_template"};
  const std::string source = m.tokenizer->chat_template();
  // A template that reads `tools` renders them, and the calls and results, itself.
  const bool native = source.find("tools") != std::string::npos;
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& msg = messages[i];
    const std::string where = message("messages[", i, "]");
    if (!msg.is_object()) bad_field(where, "an object with \"role\" and \"content\"", msg);
    check_message_fields(msg, where);
    const json* role = field(msg, "role");
    if (!role) bad_field(where + ".role", "a string", json());
    std::string r = string_field(*role, where + ".role");
    if (r == "developer") r = "system";
    std::string content = content_text(msg, where);
    if (r == "tool") {
      const json* id = field(msg, "tool_call_id");
      if (!id) bad_field(where + ".tool_call_id", "the id of the call this answers", json());
      string_field(*id, where + ".tool_call_id");
      if (native) {
        out.push_back({{"role", "tool"}, {"tool_call_id", *id}, {"content", content}});
      } else {  // consecutive results: one user turn of <tool_response> blocks
        const std::string block = "<tool_response>\n" + content + "\n</tool_response>";
        if (!out.empty() && out.back().value("mhsa_tool_results", false))
          out.back()["content"] = out.back()["content"].get<std::string>() + "\n" + block;
        else
          out.push_back({{"role", "user"}, {"content", block}, {"mhsa_tool_results", true}});
      }
      continue;
    }
    json rendered = {{"role", r}, {"content", content}};
    if (const json* calls = field(msg, "tool_calls"); calls && !(calls->is_array() && calls->empty())) {
      if (r != "assistant") bad_field(where + ".tool_calls", "tool calls only in an assistant message", *calls);
      if (!calls->is_array()) bad_field(where + ".tool_calls", "an array of calls", *calls);
      json list = json::array();
      for (size_t k = 0; k < calls->size(); ++k) {
        const json& call = (*calls)[k];
        const std::string at = message(where, ".tool_calls[", k, "]");
        if (!call.is_object()) bad_field(at, "a {\"id\", \"type\": \"function\", \"function\"} object", call);
        const json* f = field(call, "function");
        if (!f || !f->is_object()) bad_field(at + ".function", "an object with \"name\" and \"arguments\"", f ? *f : json());
        const json* name = field(*f, "name");
        if (!name) bad_field(at + ".function.name", "a string", json());
        string_field(*name, at + ".function.name");
        const json* args = field(*f, "arguments");
        const json arguments = args ? parse_object(string_field(*args, at + ".function.arguments"), at + ".function.arguments")
                                    : json::object();
        const json* id = field(call, "id");
        list.push_back({{"id", id ? string_field(*id, at + ".id") : ""}, {"type", "function"},
                        {"function", {{"name", *name}, {"arguments", arguments}}}});
      }
      if (native) {
        rendered["tool_calls"] = list;
      } else {
        std::string text = content;
        for (const json& call : list)
          text += (text.empty() ? "" : "\n") + std::string(kOpen) + "\n" +
                  json{{"name", call["function"]["name"]}, {"arguments", call["function"]["arguments"]}}.dump() + "\n" +
                  std::string(kClose);
        rendered["content"] = text;
      }
    }
    out.push_back(std::move(rendered));
  }
  if (out.empty()) bad_field("messages", "a non-empty array of {\"role\", \"content\"} objects", messages);
  for (json& msg : out) msg.erase("mhsa_tool_results");
  json variables = json::object();
  if (!tools.tools.empty()) {
    if (native) {
      variables["tools"] = tools.tools;
    } else {
      const std::string prompt = tools_prompt(tools.tools);
      if (out[0]["role"] == "system")
        out[0]["content"] = out[0]["content"].get<std::string>() + "\n\n" + prompt;
      else
        out.insert(out.begin(), json{{"role", "system"}, {"content", prompt}});
    }
  }
  try {
    ChatTemplateOptions o;
    o.add_generation_prompt = true;
    const std::string vars = variables.dump(), msgs = out.dump(-1, ' ', false, json::error_handler_t::strict);
    o.variables_json = vars;
    const std::string text = m.tokenizer->apply_chat_template(msgs, o);
    end_ids = m.chat->end_of_turn_ids();
    return m.tokenizer->encode(text, EncodeOptions{false, true});
  } catch (const json::exception&) {
    throw ApiError{400, "messages: expected UTF-8 text, got invalid UTF-8", "invalid_request_error", "messages", ""};
  } catch (const Error& e) {  // the template's raise_exception, a bound on its work
    throw ApiError{400, message("messages: ", e.what()), "invalid_request_error", "messages", ""};
  }
}

std::vector<int32_t> prepare_tool_request(const ServedModel& m, const json& messages, ToolRequest& tools,
                                          serve::Request& request) {
  tools.format = tool_format(m);
  std::vector<int32_t> ids = encode_tool_conversation(m, messages, tools, request.end_ids);
  using Choice = ToolRequest::Choice;
  if (tools.choice == Choice::required || tools.choice == Choice::named) {
    if (tools.format != ToolFormat::hermes)
      unsupported_field("tool_choice", "a required or named tool with this model's call format (Llama 3.1's, Mistral's)");
    // The answer starts as a call does (of the named function): the model writes the rest.
    tools.forced = "<tool_call>\n{\"name\": \"";
    if (tools.choice == Choice::named) tools.forced += tools.named + "\", \"arguments\": ";
    const std::vector<int32_t> forced = m.tokenizer->encode(tools.forced, EncodeOptions{false, true});
    ids.insert(ids.end(), forced.begin(), forced.end());
    request.stop.push_back(std::string(kClose));  // one call is what was asked for
    // The rest of the call held to the grammar: a name among the tools (required) and arguments
    // that are an instance of the function's parameters schema.
    if (request.options.constraint)
      unsupported_field("tool_choice", "a required or named tool together with response_format or grammar");
    std::string rules, primitives, alternatives;
    for (size_t i = 0; i < tools.tools.size(); ++i) {
      const json& tool = tools.tools[i];
      const std::string name = tool["function"]["name"].get<std::string>();
      if (tools.choice == Choice::named && name != tools.named) continue;
      std::string start;
      rules += tool_rules(tool, message("t", i, "-"), start, primitives);
      // (Names are letters, digits, '_' and '-': nothing to escape in a literal.)
      const std::string head = tools.choice == Choice::named ? "" : "\"" + name + "\\\", \\\"arguments\\\": \" ";
      alternatives += (alternatives.empty() ? "" : " | ") + head + start;
    }
    const std::string gbnf = "root ::= ( " + alternatives + " ) ws \"}\" \"\\n</tool_call>\"\n" + rules + primitives;
    try {
      request.options.constraint = std::make_shared<const Constraint>(Grammar::from_gbnf(gbnf, "tool call"), m.chat_vocabulary);
    } catch (const Error& e) {
      throw ApiError{400, message("tools: ", e.what()), "invalid_request_error", "tools", ""};
    }
  }
  return ids;
}

ToolCallStream::ToolCallStream(ToolFormat format, const json& tools) : format_(format) {
  for (const json& t : tools) names_.push_back(t["function"]["name"].get<std::string>());
}

ToolCallStream::Out ToolCallStream::add(std::string_view text) {
  pending_ += text;
  return scan(false);
}

ToolCallStream::Out ToolCallStream::finish() { return scan(true); }

ToolCallStream::Out ToolCallStream::scan(bool final) {
  Out out;
  const auto parse = [](std::string_view text) -> json {
    try {
      return detail::parse_json(text, "model", "tool call", "JSON");
    } catch (const Error&) {
      return json();
    }
  };
  const auto call_of = [&](const json& v) -> bool {
    if (!v.is_object() || !v.contains("name") || !v["name"].is_string()) return false;
    if (std::find(names_.begin(), names_.end(), v["name"].get<std::string>()) == names_.end()) return false;
    const char* key = v.contains("arguments") ? "arguments" : "parameters";
    const json args = v.contains(key) ? v[key] : json::object();
    // Arguments are an object, or JSON text of one (some models write them as a string).
    const json object = args.is_string() ? parse(args.get<std::string>()) : args;
    if (!object.is_object()) return false;
    std::string arguments = object.dump(-1, ' ', false, json::error_handler_t::replace);
    out.calls.push_back({format_ == ToolFormat::mistral ? random_id(9) : "call_" + random_id(24), v["name"].get<std::string>(),
                         std::move(arguments)});
    ++calls_;
    return true;
  };
  if (format_ != ToolFormat::hermes) {  // the whole answer is a call, or it is text
    if (!decided_) {
      const size_t at = pending_.find_first_not_of(" \t\r\n");
      if (at == std::string::npos && !final) return out;
      decided_ = true;
      whole_ = at != std::string::npos && pending_[at] == (format_ == ToolFormat::mistral ? '[' : '{');
    }
    if (!whole_) {
      out.content = std::move(pending_);
      pending_.clear();
      return out;
    }
    if (!final) return out;
    const json v = parse(pending_);
    bool ok = v.is_array() ? !v.empty() : v.is_object();
    if (ok) {
      const size_t before = out.calls.size();
      for (const json& c : v.is_array() ? v : json::array({v})) ok = ok && call_of(c);
      if (!ok) out.calls.resize(before);
    }
    if (!ok) out.content = pending_;
    pending_.clear();
    return out;
  }
  while (true) {
    if (!in_call_) {  // in text: up to the next <tool_call>
      if (after_call_) {  // whitespace after a call is not content, whatever follows
        pending_.erase(0, std::min(pending_.find_first_not_of(" \t\r\n"), pending_.size()));
        if (pending_.empty()) return out;
        after_call_ = false;
      }
      const size_t at = pending_.find(kOpen);
      if (at == std::string::npos) {
        size_t keep = 0;  // a tail that may be the start of <tool_call>
        if (!final)
          for (size_t k = std::min(kOpen.size() - 1, pending_.size()); k > 0; --k)
            if (pending_.compare(pending_.size() - k, k, kOpen, 0, k) == 0) {
              keep = k;
              break;
            }
        out.content += pending_.substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return out;
      }
      out.content += pending_.substr(0, at);
      pending_.erase(0, at + kOpen.size());
      in_call_ = true;
    }
    const size_t end = pending_.find(kClose);
    if (end == std::string::npos && !final) return out;
    const std::string body = pending_.substr(0, end);
    const int before = calls_;
    if (!call_of(parse(body))) out.content += std::string(kOpen) + body + (end == std::string::npos ? "" : std::string(kClose));
    pending_.erase(0, end == std::string::npos ? pending_.size() : end + kClose.size());
    in_call_ = false;
    after_call_ = calls_ > before;
  }
}

ojson tool_calls_json(const std::vector<ToolCall>& calls, int first_index, bool delta) {
  ojson list = ojson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    ojson c = ojson::object();
    if (delta) c["index"] = first_index + static_cast<int>(i);
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    list.push_back(std::move(c));
  }
  return list;
}

}  // namespace mhsa::cli

namespace mhsa::cli {

nlohmann::ordered_json tool_completion_json(const ResponseIds& ids, const ServedModel& m, const std::string& content,
                                            const std::vector<ToolCall>& calls, serve::Finish finish,
                                            int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  ojson j = completion_json(ids, m, true, content, finish, prompt_tokens, completion_tokens, nullptr, cached_tokens);
  ojson& choice = j["choices"][0];
  if (!calls.empty()) {
    if (content.empty()) choice["message"]["content"] = nullptr;
    choice["message"]["tool_calls"] = tool_calls_json(calls, 0, false);
    choice["finish_reason"] = "tool_calls";
  }
  return j;
}

std::vector<nlohmann::ordered_json> tool_chunks(const ResponseIds& ids, const ServedModel& m, const ToolCallStream::Out& out,
                                                bool& first, int& calls_sent) {
  std::vector<ojson> chunks;
  if (!out.content.empty()) {
    chunks.push_back(chunk_json(ids, m, true, out.content, serve::Finish::running, first));
    first = false;
  }
  for (const ToolCall& call : out.calls) {
    ojson c = chunk_json(ids, m, true, "", serve::Finish::running, first);
    ojson& delta = c["choices"][0]["delta"];
    delta.erase("content");
    delta["tool_calls"] = tool_calls_json({call}, calls_sent++, true);
    chunks.push_back(std::move(c));
    first = false;
  }
  return chunks;
}

}  // namespace mhsa::cli
