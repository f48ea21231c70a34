// mhsa/chat_template.h — a model's chat template (the Jinja `chat_template` of its
// tokenizer_config.json) rendered the way transformers' apply_chat_template(..., tokenize=False)
// renders it: jinja2 with trim_blocks and lstrip_blocks, loop controls, the `raise_exception` and
// `strftime_now` globals and transformers' `tojson`. A template is compiled once and rendered any
// number of times, from any number of threads. An interpreter for the subset of Jinja chat
// templates use (statements for/if/set/macro/break/continue, expressions, the common filters,
// tests and string and dict methods); anything outside it is refused with an error naming it,
// never rendered differently. Hostile templates and inputs are bounded (nesting, recursion,
// output size, total work). Not a general Jinja engine: no inheritance, includes or autoescaping.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace mhsa {

class ChatTemplate {
 public:
  // Parses `source`. Throws mhsa::Error "ChatTemplate: source: line L, column C: expected ..., got ...".
  explicit ChatTemplate(std::string_view source);

  // The rendered prompt. messages_json: a JSON array of messages (objects such as {"role": "user",
  // "content": "Hi"}); keys whose value is null are dropped and reasoning fields aliased as
  // transformers does. variables_json: a JSON object of further variables (bos_token, eos_token,
  // tools, documents, anything the template reads); tools and documents default to null. Throws
  // mhsa::Error "ChatTemplate::render: ..." for invalid JSON, and with the template line and column
  // for an error while rendering (raise_exception included). continue_final_message: empty, or the
  // final message's field to continue ("content"; a reasoning field): the prompt then ends with
  // that text, open for the model to go on (transformers' continue_final_message); an error when
  // the template drops or never reads it.
  std::string render(std::string_view messages_json, bool add_generation_prompt = false,
                     std::string_view variables_json = "{}", std::string_view continue_final_message = {}) const;

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mhsa
