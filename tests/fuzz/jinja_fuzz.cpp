// tests/fuzz/jinja_fuzz.cpp — libFuzzer target for the chat-template interpreter (ChatTemplate).
// The input is a template; it is rendered with a small conversation and a few variables, with the
// generation prompt and again continuing the final (assistant) message. Any
// input must either render or throw mhsa::Error; anything else — a crash, a hang past the work
// bound, a sanitizer report (stack overflow on deep nesting, a leak from a macro's closure),
// another exception type — is a bug. scripts/test.sh runs it for a bounded time from the seed
// files in tests/fuzz/jinja_corpus (the test templates and one using every statement).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "mhsa/chat_template.h"
#include "mhsa/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const mhsa::ChatTemplate t({reinterpret_cast<const char*>(data), size});
    const char* messages = R"([{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi é\n"},
        {"role": "assistant", "content": "Hello", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "user", "content": ""}, {"role": "assistant", "content": "Sure, "}])";
    const char* variables = R"({"bos_token": "<s>", "eos_token": "</s>", "d": {"k": 1, "j": [1.5, null, true]},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})";
    try {
      t.render(messages, true, variables);
    } catch (const mhsa::Error&) {
    }
    t.render(messages, false, variables, "content");
  } catch (const mhsa::Error&) {
  }
  return 0;
}
