// text/chat_template.cpp — mhsa::ChatTemplate: the public face of the Jinja interpreter
// (text/jinja.h), preparing the variables as transformers' apply_chat_template does before it
// renders: message keys whose value is null dropped, the reasoning fields aliased, `tools` and
// `documents` defined (null unless given), `add_generation_prompt` set; and continue_final_message's
// cut after the rendering.
#include "mhsa/chat_template.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include "io/json.h"
#include "mhsa/error.h"
#include "text/jinja.h"

namespace mhsa {
namespace {

using ordered_json = nlohmann::ordered_json;

ordered_json parse_ordered(std::string_view text, std::string_view arg) {
  return detail::parse_ordered_json(text, "ChatTemplate::render", arg);
}

std::string excerpt(const ordered_json& v) { return detail::json_excerpt(nlohmann::json(v)); }

// transformers' continue_final_message: a marker appended to the final message's text, found in
// the rendering and cut there.
constexpr const char* kContinueTag = "CONTINUE_FINAL_MESSAGE_TAG ";
constexpr const char* kReasoningFields[] = {"reasoning_content", "thinking", "reasoning"};

// Appends the marker to the final message's `field` (and to each copy of a reasoning field that
// holds the same text), or to the last text block when the field is a list of blocks; returns the
// text being continued. Errors as transformers raises them.
std::string mark_final_message(ordered_json& chat, std::string_view field, const std::string& source) {
  constexpr std::string_view fn = "ChatTemplate::render";
  const std::string key(field), arg = "continue_final_message";
  if (chat.empty()) detail::fail(fn, arg, "a conversation to continue", "no messages");
  ordered_json& last = chat.back();
  if (!last.contains(key))
    detail::fail(fn, arg, "a final message with a \"" + key + "\" to continue", "none in " + excerpt(last));
  const ordered_json final = last[key];
  std::vector<std::string> fields{key};
  if (std::find(std::begin(kReasoningFields), std::end(kReasoningFields), key) != std::end(kReasoningFields)) {
    fields.clear();  // a reasoning text is copied under several names: mark each, whichever the template reads
    for (const char* f : kReasoningFields)
      if (last.contains(f) && last[f] == final) fields.emplace_back(f);
  }
  if (std::none_of(fields.begin(), fields.end(), [&](const std::string& f) { return source.find(f) != std::string::npos; }))
    detail::fail(fn, arg, "a field the template reads", "\"" + key + "\", which it never names");
  if (final.is_array()) {
    ordered_json& blocks = last[key];
    for (size_t i = blocks.size(); i-- > 0;) {
      ordered_json& block = blocks[i];
      if (!block.is_object() || !block.contains("text")) continue;
      if (!block["text"].is_string()) detail::fail(fn, arg, "a string \"text\" in the last text block", excerpt(block["text"]));
      std::string text = block["text"].get<std::string>();
      block["text"] = text + kContinueTag;
      return text;
    }
    detail::fail(fn, arg, "a content block with \"text\" in the final message", excerpt(final));
  }
  if (!final.is_string()) detail::fail(fn, arg, "a string or a list of content blocks to continue", excerpt(final));
  for (const std::string& f : fields) last[f] = last[f].get<std::string>() + kContinueTag;
  return final.get<std::string>();
}

}  // namespace

struct ChatTemplate::Impl {
  std::string source;
  jinja::NodePtr root;
};

ChatTemplate::ChatTemplate(std::string_view source) : impl_(std::make_unique<Impl>()) {
  impl_->source = source;
  impl_->root = jinja::parse(source);
}

ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(std::string_view messages_json, bool add_generation_prompt,
                                 std::string_view variables_json, std::string_view continue_final_message) const {
  constexpr std::string_view fn = "ChatTemplate::render";
  const ordered_json messages = parse_ordered(messages_json, "messages");
  ordered_json vars = parse_ordered(variables_json, "variables");
  if (!messages.is_array()) detail::fail(fn, "messages", "a JSON array of messages", excerpt(messages));
  if (!vars.is_object()) detail::fail(fn, "variables", "a JSON object", excerpt(vars));
  ordered_json chat = ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ordered_json& m = messages[i];
    if (!m.is_object()) detail::fail(fn, detail::message("messages[", i, "]"), "an object", excerpt(m));
    ordered_json kept = ordered_json::object();
    for (const auto& [k, v] : m.items())
      if (!v.is_null()) kept[k] = v;
    // transformers' _alias_reasoning_fields: the first of these present fills `thinking` (unless
    // set) and `reasoning_content`.
    for (const char* key : kReasoningFields) {
      if (!kept.contains(key)) continue;
      const ordered_json r = kept[key];
      ordered_json aliased = ordered_json::object();
      aliased["thinking"] = r;
      for (const auto& [k, v] : kept.items()) aliased[k] = v;
      aliased["reasoning_content"] = r;
      kept = std::move(aliased);
      break;
    }
    chat.push_back(std::move(kept));
  }
  std::string final_text;
  if (!continue_final_message.empty()) final_text = mark_final_message(chat, continue_final_message, impl_->source);
  vars["messages"] = std::move(chat);
  vars["add_generation_prompt"] = add_generation_prompt;
  for (const char* key : {"tools", "documents"})
    if (!vars.contains(key)) vars[key] = nullptr;
  std::string out = jinja::render(*impl_->root, vars);
  if (continue_final_message.empty()) return out;
  // The prompt ends where the final message does: cut at the marker (and the space the template
  // trimmed off the message's end, if it did).
  const std::string mark = jinja::strip(kContinueTag, nullptr, true, true);
  const size_t at = out.rfind(mark);
  if (out.find(jinja::strip(final_text, nullptr, true, true)) == std::string::npos || at == std::string::npos)
    detail::fail(fn, "continue_final_message",
                 "the final message to appear in the rendered template (the template must not cut it)",
                 detail::message("a rendering without it (", out.size(), " bytes)"));
  if (out.compare(at, std::string_view(kContinueTag).size(), kContinueTag) == 0) return out.substr(0, at);
  return jinja::strip(out.substr(0, at), nullptr, false, true);
}

}  // namespace mhsa
