// apps/mhsa/serve_api.cpp — see serve_api.h. Fields are checked as OpenAI checks them (types,
// ranges, n = 1); unknown fields are ignored, as OpenAI ignores them; options mhsa does not
// implement are refused when set to anything but their neutral value, never silently dropped.
// Log-probabilities: `logprobs: N` (0..5) for completions, `logprobs: true` with `top_logprobs: N`
// (0..20) for chat; a token's text is its bytes, or "bytes:\xNN..." when they are not valid UTF-8
// (a piece of a character), as OpenAI writes them.
#include "serve_api.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "core/check.h"
#include "io/json.h"
#include "mhsa/error.h"
#include "mhsa/evaluate.h"
#include "mhsa/grammar.h"
#include "text/hf_tokenizer.h"

namespace mhsa::cli {
namespace {

using json = nlohmann::json;  // requests
using ojson = nlohmann::ordered_json;  // responses
using detail::json_excerpt;
using detail::message;

constexpr size_t kMaxStops = 4;  // as OpenAI
constexpr int64_t kMaxCompletionLogprobs = 5;  // as OpenAI's completions

[[noreturn]] void bad(const std::string& param, const std::string& expected, const json& got) {
  throw ApiError{400, message(param, ": expected ", expected, ", got ", json_excerpt(got)), "invalid_request_error",
                 param, ""};
}

[[noreturn]] void unsupported(const std::string& param, const std::string& what) {
  throw ApiError{400, message(param, ": ", what, " is not supported by mhsa serve"), "invalid_request_error", param,
                 "unsupported_parameter"};
}

// The field, or null when absent or null (OpenAI treats null as absent).
const json* field(const json& body, const char* key) {
  const auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number(const json& body, const char* key, double fallback, double lo, double hi, bool lo_open = false) {
  const json* v = field(body, key);
  if (!v) return fallback;
  const std::string range = message("a number in ", lo_open ? "(" : "[", lo, ", ", hi, "]");
  if (!v->is_number()) bad(key, range, *v);
  const double x = v->get<double>();
  if (!(lo_open ? x > lo : x >= lo) || !(x <= hi)) bad(key, range, *v);
  return x;
}

int64_t integer(const json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  const json* v = field(body, key);
  if (!v) return fallback;
  const std::string range = message("an integer in [", lo, ", ", hi, "]");
  if (!v->is_number_integer()) bad(key, range, *v);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) bad(key, range, *v);
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) bad(key, range, *v);
  return x;
}

bool boolean(const json& body, const char* key, bool fallback) {
  const json* v = field(body, key);
  if (!v) return fallback;
  if (!v->is_boolean()) bad(key, "true or false", *v);
  return v->get<bool>();
}

std::string string_field(const json& v, const std::string& param) {
  if (!v.is_string()) bad(param, "a string", v);
  return v.get<std::string>();
}

std::vector<std::string> stop_strings(const json& body) {
  const json* v = field(body, "stop");
  std::vector<std::string> out;
  if (!v) return out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array() && v->size() <= kMaxStops) {
    for (size_t i = 0; i < v->size(); ++i) out.push_back(string_field((*v)[i], message("stop[", i, "]")));
  } else {
    bad("stop", message("a string or an array of at most ", kMaxStops, " strings"), *v);
  }
  std::erase(out, std::string());  // an empty stop string never matches
  return out;
}

// OpenAI's logit_bias: {"<token id>": bias in [-100, 100], ...}, ids in [0, vocab).
std::vector<std::pair<int32_t, float>> logit_bias(const json& b, int64_t vocab) {
  std::vector<std::pair<int32_t, float>> out;
  const json* v = field(b, "logit_bias");
  if (!v) return out;
  const std::string what = "an object of token ids (strings of digits) to biases in [-100, 100]";
  if (!v->is_object()) bad("logit_bias", what, *v);
  for (const auto& [key, value] : v->items()) {
    const std::string param = message("logit_bias[", json(key).dump(), "]");
    int64_t id = -1;
    const char* end = key.data() + key.size();
    const auto [ptr, ec] = std::from_chars(key.data(), end, id);
    if (key.empty() || key[0] == '-' || key[0] == '+' || ec != std::errc() || ptr != end || id >= vocab)
      throw ApiError{400, message(param, ": expected a token id in [0, ", vocab, "), got ", json_excerpt(json(key))),
                     "invalid_request_error", "logit_bias", ""};
    if (!value.is_number() || !(value.get<double>() >= -100.0 && value.get<double>() <= 100.0))
      throw ApiError{400, message(param, ": expected a number in [-100, 100], got ", json_excerpt(value)),
                     "invalid_request_error", "logit_bias", ""};
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(value.get<double>()));
  }
  return out;
}

// The settings both endpoints share.
void parse_common(const json& b, const ServedModel& m, bool chat, ParsedRequest& p) {
  if (const json* v = field(b, "model"); v && string_field(*v, "model") != m.id)
    throw ApiError{404, message("The model ", detail::printable(v->get<std::string>()), " does not exist: this server serves ", m.id),
                   "invalid_request_error", "model", "model_not_found"};
  if (integer(b, "n", 1, 1, 128) != 1) unsupported("n", "more than one choice");
  if (!chat && integer(b, "best_of", 1, 1, 20) != 1) unsupported("best_of", "more than one candidate");
  p.echo = !chat && boolean(b, "echo", false);
  if (const json* v = field(b, "suffix"); !chat && v && string_field(*v, "suffix") != "") unsupported("suffix", "a suffix");
  int& top = p.request.top_logprobs;
  if (chat) {
    const int n = static_cast<int>(integer(b, "top_logprobs", 0, 0, serve::kMaxTopLogprobs));
    if (boolean(b, "logprobs", false))
      top = n;
    else if (field(b, "top_logprobs"))
      throw ApiError{400, "top_logprobs: expected \"logprobs\": true with it, got no \"logprobs\": true",
                     "invalid_request_error", "top_logprobs", ""};
  } else {
    if (field(b, "top_logprobs"))
      throw ApiError{400, "top_logprobs: expected no top_logprobs in /v1/completions (\"logprobs\": N asks for the N most likely tokens), got one",
                     "invalid_request_error", "top_logprobs", ""};
    top = static_cast<int>(integer(b, "logprobs", -1, 0, kMaxCompletionLogprobs));
  }
  GenerationOptions& o = p.request.options;
  o.presence_penalty = static_cast<float>(number(b, "presence_penalty", 0.0, -2.0, 2.0));
  o.frequency_penalty = static_cast<float>(number(b, "frequency_penalty", 0.0, -2.0, 2.0));
  o.logit_bias = logit_bias(b, m.model->config().vocab_size);
  o.temperature = static_cast<float>(number(b, "temperature", 1.0, 0.0, 2.0));
  o.top_p = static_cast<float>(number(b, "top_p", 1.0, 0.0, 1.0, true));
  if (const json* v = field(b, "seed")) {
    if (!v->is_number_integer()) bad("seed", "an integer", *v);
    o.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  } else {
    o.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }
  p.request.stop = stop_strings(b);
  p.stream = boolean(b, "stream", false);
  if (const json* v = field(b, "stream_options")) {
    if (!v->is_object()) bad("stream_options", "an object", *v);
    p.include_usage = boolean(*v, "include_usage", false);
  }
}

// The prompt's ids, as `mhsa generate` encodes a prompt.
std::vector<int32_t> completion_prompt(const json& b, const ServedModel& m) {
  const Tokenizer& tok = *m.tokenizer;
  const json* v = field(b, "prompt");
  if (!v) throw ApiError{400, "prompt: expected a string or an array of token ids, got none", "invalid_request_error", "prompt", ""};
  const auto one = [&](const json& p) -> const json& {  // ["text"] or [[ids]]: one prompt
    if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) return p[0];
    if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array())) unsupported("prompt", "more than one prompt");
    return p;
  };
  const json& prompt = one(*v);
  std::vector<int32_t> ids;
  if (prompt.is_string()) {
    const std::string text = prompt.get<std::string>();
    ids = tok.encode(text, EncodeOptions{tok.is_tokenizer_json(), tok.is_tokenizer_json()});
  } else if (prompt.is_array()) {
    for (size_t i = 0; i < prompt.size(); ++i) {
      const json& t = prompt[i];
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= m.model->config().vocab_size)
        bad(message("prompt[", i, "]"), message("a token id in [0, ", m.model->config().vocab_size, ")"), t);
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
  } else {
    bad("prompt", "a string or an array of token ids", prompt);
  }
  if (ids.empty()) {  // as mhsa generate: start from end-of-text (or a newline for a byte-level model)
    const std::vector<int32_t>& eos = m.model->config().eos_token_ids;
    const bool bytes = tok.eos_id() < 0 && tok.vocab_size() == 256;
    if (eos.empty() && !bytes) bad("prompt", "some text (this model has no end-of-text token)", prompt);
    ids.push_back(bytes ? int32_t{'\n'} : eos[0]);
  }
  return ids;
}

// The conversation's ids through the chat template, and the tokens that end an answer.
std::vector<int32_t> chat_prompt(const json& b, const ServedModel& m, std::vector<int32_t>& end_ids) {
  if (!m.chat)
    throw ApiError{400, "this model has no chat template (chat_template in tokenizer_config.json or chat_template.jinja): use /v1/completions",
                   "invalid_request_error", "messages", "no_chat_template"};
  const json* v = field(b, "messages");
  if (!v || !v->is_array() || v->empty())
    bad("messages", "a non-empty array of {\"role\", \"content\"} objects", v ? *v : json());
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& msg = (*v)[i];
    const std::string where = message("messages[", i, "]");
    if (!msg.is_object()) bad(where, "an object with \"role\" and \"content\"", msg);
    const json* role = field(msg, "role");
    if (!role) bad(where + ".role", "a string", json());
    ChatMessage out{string_field(*role, where + ".role"), ""};
    if (const json* content = field(msg, "content"); content && content->is_array()) {  // parts: text only
      for (size_t k = 0; k < content->size(); ++k) {
        const json& part = (*content)[k];
        const std::string at = message(where, ".content[", k, "]");
        if (!part.is_object() || !part.contains("type")) bad(at, "a {\"type\": \"text\", \"text\": ...} object", part);
        if (string_field(part["type"], at + ".type") != "text") unsupported(at + ".type", "content other than text");
        if (!part.contains("text")) bad(at + ".text", "a string", json());
        out.content += string_field(part["text"], at + ".text");
      }
    } else if (content) {
      out.content = string_field(*content, where + ".content");
    }
    messages.push_back(std::move(out));
  }
  std::lock_guard lock(*m.chat_mutex);
  try {
    m.chat->set_messages(std::move(messages));
    end_ids = m.chat->end_of_turn_ids();
    return m.chat->encode(true);
  } catch (const Error& e) {  // the template's raise_exception, a bound on its work
    throw ApiError{400, message("messages: ", e.what()), "invalid_request_error", "messages", ""};
  }
}

ojson usage(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  ojson u = {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens},
             {"total_tokens", prompt_tokens + completion_tokens}};
  if (cached_tokens >= 0) u["prompt_tokens_details"] = {{"cached_tokens", cached_tokens}};
  return u;
}

ojson finish_value(serve::Finish f) { return f == serve::Finish::running ? ojson(nullptr) : ojson(serve::finish_name(f)); }

ojson envelope(const ResponseIds& ids, const ServedModel& m, const char* object) {
  return {{"id", ids.id}, {"object", object}, {"created", ids.created}, {"model", m.id}};
}

// A token's bytes ("" for an id past the tokenizer's: a padded embedding's row).
std::string token_bytes(const ServedModel& m, int32_t id) {
  return id < m.tokenizer->vocab_size() ? m.tokenizer->token_bytes(id) : std::string();
}

// The bytes as text, or "bytes:\xNN..." when they are not valid UTF-8.
std::string token_text(const std::string& bytes) {
  if (text::lossy_utf8(bytes) == bytes) return bytes;
  static const char hex[] = "0123456789abcdef";
  std::string out = "bytes:";
  for (const char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    out += {'\\', 'x', hex[u >> 4], hex[u & 15]};
  }
  return out;
}

// As OpenAI: no −∞ in JSON (a token of probability 0 in float64) but −9999.
double logprob_value(double x) { return std::max(x, -9999.0); }

// OpenAI's completions shape: parallel lists, top_logprobs as {token: logprob} dicts.
ojson completion_logprobs(const ServedModel& m, const std::vector<serve::TokenLogprob>& lps) {
  ojson tokens = ojson::array(), values = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  for (const serve::TokenLogprob& lp : lps) {
    tokens.push_back(token_text(token_bytes(m, lp.token)));
    offsets.push_back(lp.text_offset);
    if (std::isnan(lp.logprob)) {  // an echoed prompt's first token: nothing precedes it
      values.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    values.push_back(logprob_value(lp.logprob));
    ojson top = ojson::object();
    for (const auto& [id, v] : lp.top) top.emplace(token_text(token_bytes(m, id)), logprob_value(v));  // first of equal texts
    tops.push_back(std::move(top));
  }
  return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// OpenAI's chat shape: {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
ojson chat_logprobs(const ServedModel& m, const std::vector<serve::TokenLogprob>& lps) {
  const auto entry = [&](int32_t id, double v) {
    const std::string bytes = token_bytes(m, id);
    ojson list = ojson::array();
    for (const char c : bytes) list.push_back(static_cast<unsigned char>(c));
    return ojson{{"token", token_text(bytes)}, {"logprob", logprob_value(v)}, {"bytes", list}};
  };
  ojson content = ojson::array();
  for (const serve::TokenLogprob& lp : lps) {
    ojson e = entry(lp.token, lp.logprob), top = ojson::array();
    for (const auto& [id, v] : lp.top) top.push_back(entry(id, v));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return {{"content", content}, {"refusal", nullptr}};
}

ojson logprobs_value(const ServedModel& m, bool chat, const std::vector<serve::TokenLogprob>* lps) {
  if (!lps) return nullptr;
  return chat ? chat_logprobs(m, *lps) : completion_logprobs(m, *lps);
}

}  // namespace

ojson error_json(const ApiError& e) {
  const auto or_null = [](const std::string& s) { return s.empty() ? ojson(nullptr) : ojson(s); };
  return {{"error", {{"message", e.message}, {"type", e.type}, {"param", or_null(e.param)}, {"code", or_null(e.code)}}}};
}

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// response_format (text, json_object, json_schema) or mhsa's `grammar` (GBNF text, as llama.cpp's
// server takes it): the constraint on the answer, null for none. A schema is read again from the
// body with its keys in order, so that properties are generated in the order the schema gives.
std::shared_ptr<const Constraint> constraint(const json& b, std::string_view body, const ServedModel& m, bool chat) {
  const json* format = field(b, "response_format");
  const json* gbnf = field(b, "grammar");
  if (format && !format->is_object()) bad("response_format", "an object {\"type\": \"text\" | \"json_object\" | \"json_schema\"}", *format);
  const json* type = format ? field(*format, "type") : nullptr;
  if (format && !type) bad("response_format.type", "\"text\", \"json_object\" or \"json_schema\"", json());
  const std::string kind = type ? string_field(*type, "response_format.type") : "text";
  if (kind != "text" && kind != "json_object" && kind != "json_schema")
    bad("response_format.type", "\"text\", \"json_object\" or \"json_schema\"", *type);
  if (gbnf && kind != "text") bad("grammar", "no grammar beside a response_format of type " + kind, *gbnf);
  std::optional<Grammar> grammar;
  if (gbnf) {
    const std::string text = string_field(*gbnf, "grammar");
    try {
      grammar = Grammar::from_gbnf(text, "grammar");
    } catch (const Error& e) {
      throw ApiError{400, e.what(), "invalid_request_error", "grammar", ""};
    }
  } else if (kind == "json_object") {
    grammar = Grammar::json_object();
  } else if (kind == "json_schema") {
    const json* js = field(*format, "json_schema");
    if (!js || !js->is_object())
      bad("response_format.json_schema", "an object {\"name\": ..., \"schema\": {...}, \"strict\": true}", js ? *js : json());
    if (const json* name = field(*js, "name")) string_field(*name, "response_format.json_schema.name");
    if (const json* strict = field(*js, "strict"); strict && !strict->is_boolean())
      bad("response_format.json_schema.strict", "a boolean", *strict);
    const json* schema = field(*js, "schema");
    if (!schema || (!schema->is_object() && !schema->is_boolean()))
      bad("response_format.json_schema.schema", "a JSON Schema object", schema ? *schema : json());
    const std::string param = "response_format.json_schema.schema";
    try {
      const nlohmann::ordered_json ordered = detail::parse_ordered_json(body, "request", "body");
      grammar = Grammar::from_json_schema(ordered["response_format"]["json_schema"]["schema"].dump(), param);
    } catch (const Error& e) {
      throw ApiError{400, e.what(), "invalid_request_error", param, ""};
    }
  }
  if (!grammar) return nullptr;
  return std::make_shared<const Constraint>(std::move(*grammar), chat ? m.chat_vocabulary : m.completion_vocabulary);
}

ParsedRequest parse_request(std::string_view body, const ServedModel& m, bool chat) {
  json b;
  try {
    b = detail::parse_json(body, "request", "body", "a JSON object");
  } catch (const Error& e) {
    throw ApiError{400, e.what(), "invalid_request_error", "", "invalid_json"};
  }
  if (!b.is_object()) bad("body", "a JSON object", b);
  ParsedRequest p;
  parse_common(b, m, chat, p);
  serve::Request& r = p.request;
  if (chat) {
    r.prompt = chat_prompt(b, m, r.end_ids);
  } else {
    r.prompt = completion_prompt(b, m);
    r.end_ids = m.model->config().eos_token_ids;  // as mhsa generate
    if (p.echo) {
      const json& given = *field(b, "prompt");
      const json& one = given.is_array() && given.size() == 1 ? given[0] : given;
      p.echo_text = one.is_string() ? one.get<std::string>() : m.tokenizer->decode(r.prompt);
      r.logprob_end_token = true;
    }
  }
  const int64_t prompt = static_cast<int64_t>(r.prompt.size()), room = m.context - prompt;
  if (room < 1)
    throw ApiError{400, message("This model's maximum context length is ", m.context, " tokens. However, your ",
                                chat ? "messages resulted in " : "prompt has ", prompt,
                                " tokens, which leaves no room for a completion. Please shorten the ",
                                chat ? "messages." : "prompt."),
                   "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded"};
  const char* key = chat && field(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const int64_t max_tokens = integer(b, key, chat ? room : std::min<int64_t>(16, room), 0,
                                     std::numeric_limits<int64_t>::max());
  if (max_tokens > room)
    throw ApiError{400, message("This model's maximum context length is ", m.context, " tokens. However, you requested ",
                                prompt + max_tokens, " tokens (", prompt, " in the ", chat ? "messages" : "prompt",
                                ", ", max_tokens, " in the completion). Please reduce the length of the ",
                                chat ? "messages" : "prompt", " or ", key, " (at most ", room, " here)."),
                   "invalid_request_error", key, "context_length_exceeded"};
  r.options.max_new_tokens = max_tokens;
  r.options.stop_at_eos = true;
  r.options.constraint = constraint(b, body, m, chat);
  return p;
}

int64_t code_points(std::string_view text) {
  int64_t n = 0;
  for (const char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::vector<serve::TokenLogprob> prompt_logprobs(const ServedModel& m, const std::vector<int32_t>& prompt, int top) {
  const std::vector<TokenScore> scores = score_tokens(*m.model, prompt, std::max(top, 0));
  std::vector<serve::TokenLogprob> out(prompt.size());
  int64_t offset = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    out[i].token = prompt[i];
    out[i].logprob = scores[i].logprob;
    out[i].top = scores[i].top;
    out[i].text_offset = offset;
    offset += code_points(token_bytes(m, prompt[i]));
  }
  return out;
}

ojson completion_json(const ResponseIds& ids, const ServedModel& m, bool chat, const std::string& text,
                      serve::Finish finish, int64_t prompt_tokens, int64_t completion_tokens,
                      const std::vector<serve::TokenLogprob>* logprobs, int64_t cached_tokens) {
  ojson j = envelope(ids, m, chat ? "chat.completion" : "text_completion");
  ojson choice = {{"index", 0}};
  if (chat)
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  else
    choice["text"] = text;
  choice["logprobs"] = logprobs_value(m, chat, logprobs);
  choice["finish_reason"] = finish_value(finish);
  j["choices"] = ojson::array({choice});
  j["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens);
  return j;
}

ojson chunk_json(const ResponseIds& ids, const ServedModel& m, bool chat, const std::string& text, serve::Finish finish,
                 bool first, const std::vector<serve::TokenLogprob>* logprobs) {
  ojson j = envelope(ids, m, chat ? "chat.completion.chunk" : "text_completion");
  ojson choice = {{"index", 0}};
  if (chat) {
    ojson delta = ojson::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && finish == serve::Finish::running)) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs_value(m, chat, logprobs);
  choice["finish_reason"] = finish_value(finish);
  j["choices"] = ojson::array({choice});
  return j;
}

ojson usage_chunk_json(const ResponseIds& ids, const ServedModel& m, bool chat, int64_t prompt_tokens,
                       int64_t completion_tokens, int64_t cached_tokens) {
  ojson j = envelope(ids, m, chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = ojson::array();
  j["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens);
  return j;
}

}  // namespace mhsa::cli
