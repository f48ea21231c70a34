// text/chat_template.cpp — mhsa::ChatTemplate: the public face of the Jinja interpreter
// (text/jinja.h), preparing the variables as transformers' apply_chat_template does before it
// renders: message keys whose value is null dropped, the reasoning fields aliased, `tools` and
// `documents` defined (null unless given), `add_generation_prompt` set.
#include "mhsa/chat_template.h"

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

}  // namespace

struct ChatTemplate::Impl {
  jinja::NodePtr root;
};

ChatTemplate::ChatTemplate(std::string_view source) : impl_(std::make_unique<Impl>()) {
  impl_->root = jinja::parse(source);
}

ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(std::string_view messages_json, bool add_generation_prompt,
                                 std::string_view variables_json) const {
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
    for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
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
  vars["messages"] = std::move(chat);
  vars["add_generation_prompt"] = add_generation_prompt;
  for (const char* key : {"tools", "documents"})
    if (!vars.contains(key)) vars[key] = nullptr;
  return jinja::render(*impl_->root, vars);
}

}  // namespace mhsa
