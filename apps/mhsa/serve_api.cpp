// apps/mhsa/serve_api.cpp — see serve_api.h. Fields are checked as OpenAI checks them (types,
// ranges, n = 1); a field mhsa does not read is refused (400 naming it) unless it has no effect on
// the answer (`user`) or is set to its neutral value (`n: 1`, `tools: []`), never silently dropped.
// Log-probabilities: `logprobs: N` (0..5) for completions, `logprobs: true` with `top_logprobs: N`
// (0..20) for chat; a token's text is its bytes, or "bytes:\xNN..." when they are not valid UTF-8
// (a piece of a character), as OpenAI writes them.
#include "serve_api.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "io/json.h"
#include "mhsa/error.h"
#include "mhsa/evaluate.h"
#include "mhsa/grammar.h"
#include "serve_tools.h"
#include "text/hf_tokenizer.h"

namespace mhsa::cli {
namespace {

using json = nlohmann::json;  // requests
using ojson = nlohmann::ordered_json;  // responses
using detail::json_excerpt;
using detail::message;

constexpr size_t kMaxStops = 4;  // as OpenAI
constexpr int64_t kMaxCompletionLogprobs = 5;  // as OpenAI's completions

std::vector<std::string> stop_strings(const json& body) {
  const json* v = field(body, "stop");
  std::vector<std::string> out;
  if (!v) return out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array() && v->size() <= kMaxStops) {
    for (size_t i = 0; i < v->size(); ++i) out.push_back(string_field((*v)[i], message("stop[", i, "]")));
  } else {
    bad_field("stop", message("a string or an array of at most ", kMaxStops, " strings"), *v);
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
  if (!v->is_object()) bad_field("logit_bias", what, *v);
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

// What mhsa serve does with each field of OpenAI's requests (its API reference, checked December
// 2026), so that no field is silently dropped: a field in none of these lists is a 400 naming it.
// Read (parse_common, completion_prompt, chat_prompt, parse_request):
constexpr std::string_view kCommonFields[] = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream",
                                              "stream_options", "presence_penalty", "frequency_penalty", "logit_bias",
                                              "logprobs", "top_logprobs", "n", "response_format", "grammar"};
constexpr std::string_view kCompletionFields[] = {"prompt", "echo", "best_of", "suffix"};
constexpr std::string_view kChatFields[] = {"messages", "max_completion_tokens", "tools", "tool_choice",
                                            "parallel_tool_calls"};
// Accepted and without effect on the answer: who the end user is (for a provider's abuse
// monitoring), tags for stored completions, a hint for the provider's prompt cache (mhsa's is keyed
// by the tokens themselves). Their types are still checked.
struct Ignored {
  std::string_view name;
  bool chat_only;
  json::value_t type;
  std::string_view expected;
};
constexpr Ignored kIgnoredFields[] = {{"user", false, json::value_t::string, "a string"},
                                      {"metadata", true, json::value_t::object, "an object"},
                                      {"prompt_cache_key", true, json::value_t::string, "a string"},
                                      {"safety_identifier", true, json::value_t::string, "a string"}};
// Not implemented: a 400 naming the field unless it is absent, null or one of the values that
// mean "not used" (OpenAI's defaults). One place, so that an entry goes when its feature lands.
struct Unimplemented {
  std::string_view name;
  std::string_view neutral;  // a JSON array of the accepted values
  std::string_view what;     // "… is not supported by mhsa serve"
};
constexpr Unimplemented kUnimplementedFields[] = {
    {"functions", "[[]]", "function calling"},
    {"function_call", R"(["none"])", "function calling"},
    {"modalities", R"([["text"]])", "output other than text"},
    {"audio", "[]", "audio output"},
    {"prediction", "[]", "predicted outputs"},
    {"reasoning_effort", "[]", "reasoning effort"},
    {"verbosity", R"(["medium"])", "verbosity other than medium"},
    {"web_search_options", "[]", "web search"},
    {"store", "[false]", "storing completions"},
    {"service_tier", R"(["auto", "default"])", "a service tier other than auto or default"},
};
// Fields of a chat message: role, content and tool calling's are read (serve_tools.cpp); the others
// (a participant's name, an assistant's refusal or audio) are refused unless neutral.
constexpr std::string_view kMessageFields[] = {"role", "content", "tool_calls", "tool_call_id"};
constexpr Unimplemented kUnimplementedMessageFields[] = {
    {"name", "[]", "a participant's name"},
    {"function_call", "[]", "function calling"},
    {"refusal", "[]", "a refusal"},
    {"audio", "[]", "audio"},
};

bool listed(std::span<const std::string_view> names, std::string_view key) {
  return std::find(names.begin(), names.end(), key) != names.end();
}

// A field name as it may be quoted in a message and in `param` (any bytes a client sends).
std::string field_name(const std::string& key) { return key.size() > 64 ? key.substr(0, 64) + "..." : key; }

// A field of an unimplemented feature set to something else than its neutral values: 400.
// Returns false when `key` is not in `table`.
template <size_t N>
bool check_unimplemented(const Unimplemented (&table)[N], const std::string& key, const json& value,
                         const std::string& param) {
  for (const Unimplemented& u : table) {
    if (u.name != key) continue;
    if (value.is_null()) return true;
    for (const json& ok : json::parse(u.neutral))
      if (ok == value) return true;
    throw ApiError{400, message(param, ": ", u.what, " is not supported by mhsa serve (got ", json_excerpt(value),
                                u.neutral == "[]" ? ")" : message("; accepted: ", u.neutral.substr(1, u.neutral.size() - 2), ")")),
                   "invalid_request_error", param, "unsupported_parameter"};
  }
  return false;
}

[[noreturn]] void unrecognized(const std::string& param) {
  throw ApiError{400, message("Unrecognized request argument supplied: ", param, " (mhsa serve implements ",
                              "the fields listed in docs/serving.md)"),
                 "invalid_request_error", param, "unknown_parameter"};
}

// Every field of the body is one this endpoint reads, accepts without effect, or refuses.
void check_fields(const json& b, bool chat) {
  for (const auto& [key, value] : b.items()) {
    if (listed(kCommonFields, key) || (chat ? listed(kChatFields, key) : listed(kCompletionFields, key))) continue;
    const auto ignored = std::find_if(std::begin(kIgnoredFields), std::end(kIgnoredFields),
                                      [&](const Ignored& f) { return f.name == key && (chat || !f.chat_only); });
    if (ignored != std::end(kIgnoredFields)) {
      if (!value.is_null() && value.type() != ignored->type) bad_field(key, std::string(ignored->expected), value);
      continue;
    }
    if (chat && check_unimplemented(kUnimplementedFields, key, value, key)) continue;
    unrecognized(field_name(key));
  }
}

// The settings both endpoints share.
void parse_common(const json& b, const ServedModel& m, bool chat, ParsedRequest& p) {
  check_fields(b, chat);
  if (const json* v = field(b, "model")) string_field(*v, "model");  // any name: see ServedModel::aliases
  if (integer_field(b, "n", 1, 1, 128) != 1) unsupported_field("n", "more than one choice");
  if (!chat && integer_field(b, "best_of", 1, 1, 20) != 1) unsupported_field("best_of", "more than one candidate");
  p.echo = !chat && boolean_field(b, "echo", false);
  if (const json* v = field(b, "suffix"); !chat && v && string_field(*v, "suffix") != "") unsupported_field("suffix", "a suffix");
  int& top = p.request.top_logprobs;
  if (chat) {
    const int n = static_cast<int>(integer_field(b, "top_logprobs", 0, 0, serve::kMaxTopLogprobs));
    if (boolean_field(b, "logprobs", false))
      top = n;
    else if (field(b, "top_logprobs"))
      throw ApiError{400, "top_logprobs: expected \"logprobs\": true with it, got no \"logprobs\": true",
                     "invalid_request_error", "top_logprobs", ""};
  } else {
    if (field(b, "top_logprobs"))
      throw ApiError{400, "top_logprobs: expected no top_logprobs in /v1/completions (\"logprobs\": N asks for the N most likely tokens), got one",
                     "invalid_request_error", "top_logprobs", ""};
    top = static_cast<int>(integer_field(b, "logprobs", -1, 0, kMaxCompletionLogprobs));
  }
  GenerationOptions& o = p.request.options;
  o.presence_penalty = static_cast<float>(number_field(b, "presence_penalty", 0.0, -2.0, 2.0));
  o.frequency_penalty = static_cast<float>(number_field(b, "frequency_penalty", 0.0, -2.0, 2.0));
  o.logit_bias = logit_bias(b, m.model->config().vocab_size);
  o.temperature = static_cast<float>(number_field(b, "temperature", 1.0, 0.0, 2.0));
  o.top_p = static_cast<float>(number_field(b, "top_p", 1.0, 0.0, 1.0, true));
  if (const json* v = field(b, "seed")) {
    if (!v->is_number_integer()) bad_field("seed", "an integer", *v);
    o.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  } else {
    o.seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }
  p.request.stop = stop_strings(b);
  p.stream = boolean_field(b, "stream", false);
  if (const json* v = field(b, "stream_options")) {
    if (!v->is_object()) bad_field("stream_options", "an object", *v);
    p.include_usage = boolean_field(*v, "include_usage", false);
    for (const auto& [key, value] : v->items()) {
      if (key == "include_usage") continue;
      if (key == "include_obfuscation") {  // random padding against length side channels
        if (boolean_field(*v, "include_obfuscation", false)) unsupported_field("stream_options.include_obfuscation", "true");
        continue;
      }
      unrecognized("stream_options." + field_name(key));
    }
  }
}

// The prompt's ids, as `mhsa generate` encodes a prompt.
std::vector<int32_t> completion_prompt(const json& b, const ServedModel& m) {
  const Tokenizer& tok = *m.tokenizer;
  const json* v = field(b, "prompt");
  if (!v) throw ApiError{400, "prompt: expected a string or an array of token ids, got none", "invalid_request_error", "prompt", ""};
  const auto one = [&](const json& p) -> const json& {  // ["text"] or [[ids]]: one prompt
    if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) return p[0];
    if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array())) unsupported_field("prompt", "more than one prompt");
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
        bad_field(message("prompt[", i, "]"), message("a token id in [0, ", m.model->config().vocab_size, ")"), t);
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
  } else {
    bad_field("prompt", "a string or an array of token ids", prompt);
  }
  if (ids.empty()) {  // as mhsa generate: start from end-of-text (or a newline for a byte-level model)
    const std::vector<int32_t>& eos = m.model->config().eos_token_ids;
    const bool bytes = tok.eos_id() < 0 && tok.vocab_size() == 256;
    if (eos.empty() && !bytes) bad_field("prompt", "some text (this model has no end-of-text token)", prompt);
    ids.push_back(bytes ? int32_t{'\n'} : eos[0]);
  }
  return ids;
}

// Every field of b is one of `known` (with `ignored`: accepted, without effect).
void only_fields(const json& b, std::span<const std::string_view> known) {
  for (const auto& [key, value] : b.items())
    if (!listed(known, key)) unrecognized(field_name(key));
}

// A list of token ids, each in [0, vocab): a 400 naming the first index out of range.
std::vector<int32_t> token_ids(const json& v, const std::string& param, int64_t vocab) {
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    if (!t.is_number_integer() || (t.is_number_unsigned() && t.get<uint64_t>() >= static_cast<uint64_t>(vocab)) ||
        t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
      bad_field(message(param, "[", i, "]"), message("a token id in [0, ", vocab, ")"), t);
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
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
    bad_field("messages", "a non-empty array of {\"role\", \"content\"} objects", v ? *v : json());
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& msg = (*v)[i];
    const std::string where = message("messages[", i, "]");
    if (!msg.is_object()) bad_field(where, "an object with \"role\" and \"content\"", msg);
    const json* role = field(msg, "role");
    if (!role) bad_field(where + ".role", "a string", json());
    check_message_fields(msg, where);
    ChatMessage out{string_field(*role, where + ".role"), ""};
    if (const json* content = field(msg, "content"); content && content->is_array()) {  // parts: text only
      for (size_t k = 0; k < content->size(); ++k) {
        const json& part = (*content)[k];
        const std::string at = message(where, ".content[", k, "]");
        if (!part.is_object() || !part.contains("type")) bad_field(at, "a {\"type\": \"text\", \"text\": ...} object", part);
        if (string_field(part["type"], at + ".type") != "text") unsupported_field(at + ".type", "content other than text");
        if (!part.contains("text")) bad_field(at + ".text", "a string", json());
        out.content += string_field(part["text"], at + ".text");
      }
    } else if (content) {
      out.content = string_field(*content, where + ".content");
    }
    messages.push_back(std::move(out));
  }
  return encode_conversation(m, std::move(messages), end_ids, "messages");
}

// A chat request with tools, or with tool calls and results in its messages: the conversation's
// ids rendered with them (and p.tools set when the answer may hold calls); {} for any other.
std::vector<int32_t> tool_prompt(const json& b, const ServedModel& m, std::vector<int32_t>& end_ids, ParsedRequest& p) {
  auto tools = std::make_shared<ToolRequest>(parse_tools(b));
  const json* messages = field(b, "messages");
  bool tool_messages = false;
  if (messages && messages->is_array())
    for (const json& msg : *messages)
      if (msg.is_object()) {
        const json* calls = field(msg, "tool_calls");
        tool_messages |= (msg.contains("role") && msg["role"] == "tool") || (calls && !(calls->is_array() && calls->empty()));
      }
  if (tools->tools.empty() && !tool_messages) return {};
  if (!messages || !messages->is_array() || messages->empty())
    bad_field("messages", "a non-empty array of {\"role\", \"content\"} objects", messages ? *messages : json());
  p.request.end_ids = end_ids;
  std::vector<int32_t> ids = prepare_tool_request(m, *messages, *tools, p.request);
  end_ids = p.request.end_ids;
  if (tools->active()) p.tools = std::move(tools);
  return ids;
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

// RFC 4648 base64, with padding.
std::string base64(std::string_view bytes) {
  static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k) v = v << 8 | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out += k <= n ? digits[(v >> (18 - 6 * k)) & 63] : '=';
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

void check_message_fields(const json& msg, const std::string& where) {
  for (const auto& [key, value] : msg.items())
    if (!listed(kMessageFields, key) &&
        !check_unimplemented(kUnimplementedMessageFields, key, value, message(where, ".", field_name(key))))
      unrecognized(message(where, ".", field_name(key)));
}

std::vector<int32_t> encode_conversation(const ServedModel& m, std::vector<ChatMessage> messages,
                                         std::vector<int32_t>& end_ids, const std::string& param, bool continue_final) {
  if (!m.chat)
    throw ApiError{400, "this model has no chat template (chat_template in tokenizer_config.json or chat_template.jinja): use /v1/completions",
                   "invalid_request_error", param, "no_chat_template"};
  if (continue_final) {  // the last message left open: transformers' continue_final_message
    try {
      json list = json::array();
      for (const ChatMessage& msg : messages) list.push_back({{"role", msg.role}, {"content", msg.content}});
      ChatTemplateOptions o;
      o.continue_final_message = "content";
      const std::string text =
          m.tokenizer->apply_chat_template(list.dump(-1, ' ', false, json::error_handler_t::strict), o);
      end_ids = m.chat->end_of_turn_ids();
      return m.tokenizer->encode(text, EncodeOptions{false, true});
    } catch (const json::exception&) {
      throw ApiError{400, message(param, ": expected UTF-8 text, got invalid UTF-8"), "invalid_request_error", param, ""};
    } catch (const Error& e) {
      throw ApiError{400, message(param, ": ", e.what()), "invalid_request_error", param, ""};
    }
  }
  std::lock_guard lock(*m.chat_mutex);
  try {
    m.chat->set_messages(std::move(messages));
    end_ids = m.chat->end_of_turn_ids();
    return m.chat->encode(true);
  } catch (const Error& e) {  // the template's raise_exception, a bound on its work
    throw ApiError{400, message(param, ": ", e.what()), "invalid_request_error", param, ""};
  }
}

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
  if (format && !format->is_object()) bad_field("response_format", "an object {\"type\": \"text\" | \"json_object\" | \"json_schema\"}", *format);
  const json* type = format ? field(*format, "type") : nullptr;
  if (format && !type) bad_field("response_format.type", "\"text\", \"json_object\" or \"json_schema\"", json());
  const std::string kind = type ? string_field(*type, "response_format.type") : "text";
  if (kind != "text" && kind != "json_object" && kind != "json_schema")
    bad_field("response_format.type", "\"text\", \"json_object\" or \"json_schema\"", *type);
  if (gbnf && kind != "text") bad_field("grammar", "no grammar beside a response_format of type " + kind, *gbnf);
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
      bad_field("response_format.json_schema", "an object {\"name\": ..., \"schema\": {...}, \"strict\": true}", js ? *js : json());
    if (const json* name = field(*js, "name")) string_field(*name, "response_format.json_schema.name");
    if (const json* strict = field(*js, "strict"); strict && !strict->is_boolean())
      bad_field("response_format.json_schema.strict", "a boolean", *strict);
    const json* schema = field(*js, "schema");
    if (!schema || (!schema->is_object() && !schema->is_boolean()))
      bad_field("response_format.json_schema.schema", "a JSON Schema object", schema ? *schema : json());
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
  const json b = parse_body(body);
  ParsedRequest p;
  parse_common(b, m, chat, p);
  serve::Request& r = p.request;
  if (chat) {
    r.prompt = tool_prompt(b, m, r.end_ids, p);
    if (r.prompt.empty()) r.prompt = chat_prompt(b, m, r.end_ids);
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
  const int64_t max_tokens = integer_field(b, key, chat ? room : std::min<int64_t>(16, room), 0,
                                     std::numeric_limits<int64_t>::max());
  if (max_tokens > room)
    throw ApiError{400, message("This model's maximum context length is ", m.context, " tokens. However, you requested ",
                                prompt + max_tokens, " tokens (", prompt, " in the ", chat ? "messages" : "prompt",
                                ", ", max_tokens, " in the completion). Please reduce the length of the ",
                                chat ? "messages" : "prompt", " or ", key, " (at most ", room, " here)."),
                   "invalid_request_error", key, "context_length_exceeded"};
  r.options.max_new_tokens = max_tokens;
  r.options.stop_at_eos = true;
  if (auto c = constraint(b, body, m, chat)) {
    if (r.options.constraint)  // (a required or named tool's call grammar)
      unsupported_field("tool_choice", "a required or named tool together with response_format or grammar");
    r.options.constraint = std::move(c);
  }
  return p;
}

ojson tokenize_json(std::string_view body, const ServedModel& m) {
  const json b = parse_body(body);
  constexpr std::string_view known[] = {"content", "prompt", "add_special", "parse_special", "with_pieces", "model"};
  only_fields(b, known);
  if (field(b, "content") && field(b, "prompt"))
    throw ApiError{400, "prompt: expected \"content\" or \"prompt\", got both", "invalid_request_error", "prompt", ""};
  const char* key = field(b, "prompt") ? "prompt" : "content";
  const json* v = field(b, key);
  if (!v) bad_field("content", "a string", json());
  const std::string text = string_field(*v, key);
  const bool add_special = boolean_field(b, "add_special", false), parse_special = boolean_field(b, "parse_special", true),
             pieces = boolean_field(b, "with_pieces", false);
  if (const json* model = field(b, "model")) string_field(*model, "model");
  const Tokenizer& tok = *m.tokenizer;
  const std::vector<int32_t> ids = tok.encode(text, EncodeOptions{add_special && tok.is_tokenizer_json(), parse_special});
  ojson tokens = ojson::array();
  for (const int32_t id : ids) {
    if (!pieces) {
      tokens.push_back(id);
      continue;
    }
    const std::string bytes = tok.token_bytes(id);
    ojson piece = bytes;
    if (text::lossy_utf8(bytes) != bytes) {
      piece = ojson::array();
      for (const char c : bytes) piece.push_back(static_cast<unsigned char>(c));
    }
    tokens.push_back({{"id", id}, {"piece", std::move(piece)}});
  }
  return {{"tokens", std::move(tokens)}};
}

ojson detokenize_json(std::string_view body, const ServedModel& m) {
  const json b = parse_body(body);
  constexpr std::string_view known[] = {"tokens", "model"};
  only_fields(b, known);
  const json* v = field(b, "tokens");
  if (!v || !v->is_array()) bad_field("tokens", "an array of token ids", v ? *v : json());
  if (const json* model = field(b, "model")) string_field(*model, "model");
  const std::vector<int32_t> ids = token_ids(*v, "tokens", m.tokenizer->vocab_size());
  return {{"content", m.tokenizer->decode(ids)}};
}

EmbeddingRequest parse_embeddings(std::string_view body, const ServedModel& m) {
  const json b = parse_body(body);
  constexpr std::string_view known[] = {"input", "model", "encoding_format", "dimensions", "user"};
  only_fields(b, known);
  if (const json* model = field(b, "model")) string_field(*model, "model");
  if (const json* user = field(b, "user")) string_field(*user, "user");
  EmbeddingRequest r;
  if (const json* v = field(b, "encoding_format")) {
    const std::string f = string_field(*v, "encoding_format");
    if (f != "float" && f != "base64") bad_field("encoding_format", "\"float\" or \"base64\"", *v);
    r.base64 = f == "base64";
  }
  const int64_t width = m.model->config().hidden_size;
  if (const json* v = field(b, "dimensions"); v && integer_field(b, "dimensions", width, 1, width) != width)
    unsupported_field("dimensions", message("a width other than the model's (", width, ")"));
  const json* v = field(b, "input");
  const std::string what = message("a string, an array of at most ", kMaxEmbeddingInputs,
                                   " strings, an array of token ids, or an array of such arrays");
  if (!v) bad_field("input", what, json());
  const Tokenizer& tok = *m.tokenizer;
  const int64_t vocab = m.model->config().vocab_size;
  const auto one = [&](const json& x, const std::string& param) {
    std::vector<int32_t> ids;
    if (x.is_string()) {
      ids = tok.encode(x.get<std::string>(), EncodeOptions{tok.is_tokenizer_json(), tok.is_tokenizer_json()});
    } else if (x.is_array()) {
      ids = token_ids(x, param, vocab);
    } else {
      bad_field(param, "a string or an array of token ids", x);
    }
    if (ids.empty()) bad_field(param, "a non-empty input (at least one token)", x);
    if (static_cast<int64_t>(ids.size()) > m.context)
      throw ApiError{400, message(param, ": expected at most ", m.context, " tokens (the context), got ", ids.size()),
                     "invalid_request_error", param, "context_length_exceeded"};
    r.inputs.push_back(std::move(ids));
  };
  if (v->is_string() || (v->is_array() && !v->empty() && v->front().is_number())) {
    one(*v, "input");
  } else if (v->is_array() && !v->empty() && v->size() <= kMaxEmbeddingInputs) {
    for (size_t i = 0; i < v->size(); ++i) one((*v)[i], message("input[", i, "]"));
  } else {
    bad_field("input", what, *v);
  }
  int64_t total = 0;
  for (const std::vector<int32_t>& ids : r.inputs) total += static_cast<int64_t>(ids.size());
  if (total > kMaxEmbeddingTokens)
    throw ApiError{400, message("input: expected at most ", kMaxEmbeddingTokens, " tokens in all, got ", total),
                   "invalid_request_error", "input", ""};
  return r;
}

ojson embeddings_json(const ServedModel& m, const EmbeddingRequest& r, const std::vector<std::vector<float>>& vectors) {
  ojson data = ojson::array();
  int64_t tokens = 0;
  for (size_t i = 0; i < vectors.size(); ++i) {
    tokens += static_cast<int64_t>(r.inputs[i].size());
    ojson embedding;
    if (r.base64) {
      std::string bytes(vectors[i].size() * sizeof(float), '\0');  // little-endian, as x86-64 and AArch64 store it
      std::memcpy(bytes.data(), vectors[i].data(), bytes.size());
      embedding = base64(bytes);
    } else {
      embedding = vectors[i];
    }
    data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::move(embedding)}});
  }
  return {{"object", "list"}, {"data", std::move(data)}, {"model", m.id},
          {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
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
