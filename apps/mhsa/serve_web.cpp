// apps/mhsa/serve_web.cpp — see serve_web.h.
//
// /v1/explain and the scheduler: the model is const and shared. A forward keeps its scratch in
// thread_local buffers and the explanation runs over no KV cache (the scheduler's paged pool is
// untouched), so it runs beside the scheduler's steps without a lock, as `echo`'s prompt scoring
// does; it takes CPU from them while it runs. It runs on a thread of its own that ends with it:
// an OpenMP team started on an HTTP thread would outlive the request, and more libgomp threads than
// CPUs make every barrier of every step wait for a futex wake-up (see serve_cmd.cpp's loading).
// Explanations run one at a time, so the memory they take is that of one, bounded by kExplainBytes.
#include "serve_web.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <exception>
#include <optional>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "explain_tokens.h"
#include "io/json.h"
#include "io/sha256.h"
#include "mhsa/error.h"
#include "mhsa/explain.h"
#include "options.h"
#include "web_chat_html.h"

namespace mhsa::cli {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using detail::message;

// Every head's [T, T] float32 probabilities of one explanation at most: 256 MiB allows 498 tokens
// for SmolLM2-135M's 30 layers × 9 heads. The answer holds their lower triangles in base64 (about
// 2/3 of this) besides.
constexpr int64_t kExplainBytes = int64_t{256} << 20;
constexpr size_t kMaxMessages = 256;
constexpr size_t kMaxRoleBytes = 64;

std::vector<ChatMessage> explain_messages(std::string_view body) {
  const json b = parse_body(body);
  for (const auto& [key, value] : b.items())
    if (key != "messages" && key != "model")
      throw ApiError{400, message(detail::printable(key), ": expected only \"messages\" (and \"model\") in /v1/explain, got this field too"),
                     "invalid_request_error", key, "unsupported_parameter"};
  if (b.contains("model") && !b["model"].is_string()) bad_field("model", "a string", b["model"]);
  const auto it = b.find("messages");
  const std::string what = message("an array of 1 to ", kMaxMessages, " {\"role\", \"content\"} objects");
  if (it == b.end() || !it->is_array() || it->empty() || it->size() > kMaxMessages)
    bad_field("messages", what, it == b.end() ? json() : *it);
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = message("messages[", i, "]");
    if (!m.is_object()) bad_field(where, "an object with \"role\" and \"content\"", m);
    for (const auto& [key, value] : m.items())
      if (key != "role" && key != "content") bad_field(where + "." + detail::printable(key), "no such field (only role and content)", value);
    const json role = m.value("role", json()), content = m.value("content", json());
    if (!role.is_string() || role.get_ref<const std::string&>().empty() || role.get_ref<const std::string&>().size() > kMaxRoleBytes)
      bad_field(where + ".role", message("a string of 1 to ", kMaxRoleBytes, " bytes"), role);
    if (!content.is_string()) bad_field(where + ".content", "a string", content);
    messages.push_back({role.get<std::string>(), content.get<std::string>()});
  }
  return messages;
}

// The page's Content-Security-Policy sources for its inline <tag> elements: " 'sha256-<base64>'" of
// each one's text. web_chat.html writes each tag only where it is used (its header comment says so).
std::string element_hashes(const std::string& page, const std::string& tag) {
  std::string out;
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  for (size_t at = page.find(open); at != std::string::npos; at = page.find(open, at)) {
    at += open.size();
    const size_t end = page.find(close, at);
    if (end == std::string::npos) break;
    detail::Sha256 sha;
    sha.update(page.data() + at, end - at);
    const std::array<uint8_t, 32> digest = sha.finish();
    out += " 'sha256-" + base64(std::vector<uint8_t>(digest.begin(), digest.end())) + "'";
    at = end;
  }
  return out;
}

}  // namespace

WebChat::WebChat(const ServedModel& m, int threads) : m_(m), threads_(threads) {
  const ModelConfig& c = m.model->config();
  const auto per_token_pair = static_cast<double>(c.num_layers * c.num_heads * 4);
  max_tokens_ = std::min<int64_t>(m.context, static_cast<int64_t>(std::sqrt(static_cast<double>(kExplainBytes) / per_token_pair)));
  const std::string page = kWebChatHtml;
  const std::string scripts = element_hashes(page, "script"), styles = element_hashes(page, "style");
  if (scripts.empty() || styles.empty())  // as explain's missing data marker: a page edited wrongly
    throw Error("mhsa serve: the built-in chat page has no inline script or style for its Content-Security-Policy");
  // Only the page's own script and style run; it may talk to this server and nothing else.
  csp_ = "default-src 'none'; script-src" + scripts + "; style-src" + styles +
         "; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
}

void WebChat::page(httplib::Response& res) const {
  res.set_header("Content-Security-Policy", csp_);
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  res.set_header("Cache-Control", "no-cache");
  res.set_content(kWebChatHtml, "text/html; charset=utf-8");
}

void WebChat::explain(const httplib::Request& req, httplib::Response& res) {
  const auto fail = [&](const ApiError& e) {
    res.status = e.status;
    res.set_content(dump(error_json(e)), "application/json");
  };
  std::vector<std::string> roles;
  std::vector<int32_t> ids;
  try {
    const std::vector<ChatMessage> messages = explain_messages(req.body);
    if (m_.tokenizer->chat_template().empty())
      throw ApiError{400, "this model has no chat template (chat_template in tokenizer_config.json or chat_template.jinja)",
                     "invalid_request_error", "messages", "no_chat_template"};
    ids = conversation_ids(*m_.tokenizer, messages, max_tokens_, "the attention view's limit for this model", "messages", roles);
  } catch (const ApiError& e) {
    return fail(e);
  } catch (const Error& e) {  // too many tokens, the template's raise_exception or a bound on its work
    return fail({400, e.what(), "invalid_request_error", "messages", ""});
  }
  if (ids.empty()) return fail({400, "messages: expected some text, got a conversation of no tokens", "invalid_request_error", "messages", ""});

  std::optional<Explanation> e;
  std::exception_ptr failed;
  {
    std::lock_guard lock(explain_mutex_);
    std::thread([&] {
      use_threads(threads_);
      try {
        e.emplace(mhsa::explain(*m_.model, ids, 0, 0));
      } catch (...) {
        failed = std::current_exception();
      }
    }).join();
  }
  if (failed) {
    try {
      std::rethrow_exception(failed);
    } catch (const std::exception& x) {
      return fail({500, message("The explanation could not be computed: ", x.what()), "server_error", "", ""});
    }
  }

  const ModelConfig& c = m_.model->config();
  const auto T = static_cast<int64_t>(ids.size());
  std::vector<std::string> texts, labels;
  for (int32_t id : ids) {
    texts.push_back(token_text(m_.tokenizer->token_bytes(id)));
    labels.push_back(token_label(texts.back()));
  }
  // Every head's lower triangle (key j ≤ query i), row by row, layer by layer and head by head, as
  // float32 little-endian: the bits mhsa::explain computed (mhsa explain --json prints the same
  // values as text, the report's exact block holds one head's in the same layout).
  std::vector<uint8_t> bytes;
  bytes.reserve(static_cast<size_t>(c.num_layers * c.num_heads * T * (T + 1) / 2 * 4));
  for (const Tensor& a : e->attention)  // [1, H, T, T]
    for (int64_t h = 0; h < c.num_heads; ++h)
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          uint32_t bits;
          std::memcpy(&bits, a.data() + (h * T + i) * T + j, 4);
          for (int k = 0; k < 4; ++k) bytes.push_back(static_cast<uint8_t>(bits >> (8 * k)));
        }
  ojson out = {{"object", "explanation"}, {"model", m_.id}, {"tokens", texts}, {"labels", labels},
               {"roles", roles}, {"ids", ids}, {"layers", c.num_layers}, {"heads", c.num_heads},
               {"embed_dim", c.hidden_size}, {"head_dim", c.head_dim}};
  const std::pair<const char*, double HeadSummary::*> metrics[] = {{"entropy", &HeadSummary::entropy},
      {"first_token", &HeadSummary::first_token}, {"previous_token", &HeadSummary::previous_token},
      {"self", &HeadSummary::self}};
  for (const auto& [key, field] : metrics) {  // [layer][head], as the report's
    ojson table = ojson::array();
    for (const std::vector<HeadSummary>& heads : e->summaries) {
      ojson row = ojson::array();
      for (const HeadSummary& s : heads) row.push_back(s.*field);
      table.push_back(std::move(row));
    }
    out["summaries"][key] = std::move(table);
  }
  out["attention"] = base64(bytes);
  res.set_content(dump(out), "application/json");
}

}  // namespace mhsa::cli
