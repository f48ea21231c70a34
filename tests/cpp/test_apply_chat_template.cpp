// tests/cpp/test_apply_chat_template.cpp — Tokenizer::apply_chat_template on a small in-memory
// tokenizer.json: tokenizer_config.json's special tokens as template variables (the caller's
// overriding them), the choice among named templates, the errors, and many threads rendering
// through the one cached template at once. Agreement with transformers on real templates is
// tests/python/test_apply_chat_template.py's.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "mhsa/error.h"
#include "mhsa/tokenizer.h"
#include "test_util.h"

namespace mhsa {
namespace {

using test::expect_error;

// A BPE vocabulary of single characters, with <s> and </s> as special added tokens.
std::string tokenizer_json() {
  std::string vocab = R"("<s>": 0, "</s>": 1)";
  const std::string chars = "abcdefghijklmnopqrstuvwxyz |:!";
  for (size_t i = 0; i < chars.size(); ++i) vocab += ", \"" + chars.substr(i, 1) + "\": " + std::to_string(i + 2);
  const std::string added = R"("single_word": false, "lstrip": false, "rstrip": false, "normalized": false})";
  return R"({"added_tokens": [{"id": 0, "content": "<s>", "special": true, )" + added +
         R"(, {"id": 1, "content": "</s>", "special": true, )" + added + R"(], "model": {"type": "BPE", "vocab": {)" +
         vocab + R"(}, "merges": []}})";
}

Tokenizer with_config(const std::string& config) { return Tokenizer::parse_json(tokenizer_json(), config); }

constexpr const char* kTokensTemplate =
    R"({"chat_template": "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ image_token }}|{{ sep_token }}|)"
    R"({% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}{% endfor %})"
    R"({% if add_generation_prompt %}assistant:{% endif %}", "bos_token": "<s>", )"
    R"("eos_token": {"content": "</s>", "special": true}, "pad_token": "</s>", "image_token": "im", )"
    R"("add_bos_token": true, "sep_token": null})";

TEST(ApplyChatTemplate, ConfigTokensAreVariablesAndTheCallerOverridesThem) {
  const Tokenizer t = with_config(kTokensTemplate);
  const std::string messages = R"([{"role": "user", "content": "hi there"}])";
  EXPECT_EQ(t.apply_chat_template(messages), "<s>|</s>|</s>|im||user:hi there</s>");
  EXPECT_EQ(t.apply_chat_template(messages, true), "<s>|</s>|</s>|im||user:hi there</s>assistant:");
  EXPECT_EQ(t.apply_chat_template(messages, false, R"({"eos_token": "!", "sep_token": "s"})"), "<s>|!|</s>|im|s|user:hi there!");
  // transformers' ids: the text encoded with special tokens matched and none added.
  const std::vector<int32_t> ids = t.encode(t.apply_chat_template(messages), EncodeOptions{false, true});
  EXPECT_EQ(ids.front(), 0);
  EXPECT_EQ(ids.back(), 1);
}

TEST(ApplyChatTemplate, NamedTemplatesPickDefaultOrToolUse) {
  const Tokenizer t = with_config(R"({"chat_template": [{"name": "tool_use", "template": "T{{ tools | length }}"},
                                                        {"name": "default", "template": "D{{ messages | length }}"}]})");
  EXPECT_EQ(t.chat_template(), "D{{ messages | length }}");
  EXPECT_EQ(t.apply_chat_template("[{}]"), "D1");
  EXPECT_EQ(t.apply_chat_template("[]", false, R"({"tools": null})"), "D0");
  EXPECT_EQ(t.apply_chat_template("[]", false, R"({"tools": [1, 2]})"), "T2");
  const Tokenizer only_tools = with_config(R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  expect_error([&] { (void)only_tools.apply_chat_template("[]"); },
               {"Tokenizer::apply_chat_template: tokenizer_config.json chat_template: expected a template named "
                "\"default\" (or chat_template given), got only tool_use"});
  // The caller's template, by name or source (transformers' chat_template=), and a prefill left open.
  ChatTemplateOptions o;
  o.chat_template = "tool_use";
  EXPECT_EQ(only_tools.apply_chat_template("[]", o), "T");
  o.chat_template = "<{{ messages[-1].content }}>";
  o.continue_final_message = "content";
  EXPECT_EQ(only_tools.apply_chat_template(R"([{"role": "assistant", "content": "Yes  "}])", o), "<Yes  ");
  o.add_generation_prompt = true;
  expect_error([&] { (void)only_tools.apply_chat_template("[]", o); },
               {"Tokenizer::apply_chat_template: continue_final_message: expected add_generation_prompt false"});
  EXPECT_EQ(only_tools.apply_chat_template("[]", false, R"({"tools": []})"), "T");
}

TEST(ApplyChatTemplate, ClearErrors) {
  expect_error([] { (void)with_config("{}").apply_chat_template("[]"); },
               {"Tokenizer::apply_chat_template: tokenizer: expected a chat_template in tokenizer_config.json"});
  expect_error([] { (void)Tokenizer::bytes().apply_chat_template("[]"); },
               {"Tokenizer::apply_chat_template: tokenizer: expected a tokenizer.json with a chat template"});
  const Tokenizer t = with_config(kTokensTemplate);
  expect_error([&] { (void)t.apply_chat_template("[]", false, "[1]"); },
               {"Tokenizer::apply_chat_template: variables: expected a JSON object, got an array [1]"});
  expect_error([&] { (void)t.apply_chat_template("[]", false, "{"); }, {"Tokenizer::apply_chat_template: variables: expected JSON"});
  expect_error([] { (void)with_config(R"({"chat_template": "{% if %}"})").apply_chat_template("[]"); },
               {"ChatTemplate: source: line 1"});
}

TEST(ApplyChatTemplate, ManyThreadsShareTheCompiledTemplate) {
  const Tokenizer t = with_config(kTokensTemplate);
  std::vector<std::string> results(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i)
    threads.emplace_back([&, i] {
      const std::string messages = R"([{"role": "user", "content": ")" + std::string(i + 1, 'a') + R"("}])";
      for (int r = 0; r < 50; ++r) results[i] = t.apply_chat_template(messages, r % 2 == 1);
    });
  for (std::thread& th : threads) th.join();
  for (size_t i = 0; i < results.size(); ++i)
    EXPECT_EQ(results[i], "<s>|</s>|</s>|im||user:" + std::string(i + 1, 'a') + "</s>assistant:");
}

}  // namespace
}  // namespace mhsa
