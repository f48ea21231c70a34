// The tool-call splitter of `mhsa serve` (apps/mhsa/serve_tools.h): an answer's text, given in
// pieces cut anywhere, splits into the same content and calls as given whole; what only looks like
// a call (unknown function, broken JSON, no call at all) stays content, every byte of it.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve_tools.h"

namespace mhsa::cli {
namespace {

using json = nlohmann::json;

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather"}},
                                    {"type": "function", "function": {"name": "add"}}])");

struct Split {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

// The text given in pieces at the cuts (sorted offsets).
Split run(ToolFormat format, const std::string& text, const std::vector<size_t>& cuts) {
  ToolCallStream s(format, kTools);
  Split out;
  const auto take = [&](const ToolCallStream::Out& o) {
    out.content += o.content;
    for (const ToolCall& c : o.calls) {
      EXPECT_FALSE(c.id.empty());
      out.calls.emplace_back(c.name, c.arguments);
    }
  };
  size_t at = 0;
  for (const size_t cut : cuts) {
    take(s.add(text.substr(at, cut - at)));
    at = cut;
  }
  take(s.add(text.substr(at)));
  take(s.finish());
  return out;
}

void expect_any_cuts_give(ToolFormat format, const std::string& text, const Split& expected) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> cuts;
    const int n = trial == 0 ? 0 : static_cast<int>(gen() % 6);
    for (int i = 0; i < n; ++i) cuts.push_back(gen() % (text.size() + 1));
    if (trial == 1)  // every byte on its own
      for (size_t i = 1; i < text.size(); ++i) cuts.push_back(i);
    std::sort(cuts.begin(), cuts.end());
    const Split got = run(format, text, cuts);
    ASSERT_EQ(got.content, expected.content) << text << " trial " << trial;
    ASSERT_EQ(got.calls, expected.calls) << text << " trial " << trial;
  }
}

TEST(ToolCallStream, HermesCallsAmongText) {
  expect_any_cuts_give(ToolFormat::hermes, "No call here, < and <tool but no call.",
                       {"No call here, < and <tool but no call.", {}});
  expect_any_cuts_give(ToolFormat::hermes,
                       "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                       {"Let me look.\n", {{"get_weather", R"({"city":"Paris"})"}}});
  // Two calls (whitespace between them is not content), arguments as JSON text.
  expect_any_cuts_give(ToolFormat::hermes,
                       "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": [2, 3]}}</tool_call>\n\n"
                       "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}</tool_call>",
                       {"", {{"add", R"({"a":1,"b":[2,3]})"}, {"get_weather", R"({"city":"Oslo"})"}}});
  // A call cut off by a stop string before its closing tag.
  expect_any_cuts_give(ToolFormat::hermes, "<tool_call>\n{\"name\": \"add\", \"arguments\": {}}\n",
                       {"", {{"add", "{}"}}});
}

TEST(ToolCallStream, WhatIsNotACallStaysContent) {
  for (const std::string text : {
           std::string("<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>"),  // not a given tool
           std::string("<tool_call>{\"name\": \"add\", \"arguments\": {</tool_call> after"),  // broken JSON
           std::string("<tool_call>{\"name\": \"add\", \"arguments\": 5}</tool_call>"),       // arguments not an object
           std::string("<tool_call>[1, 2]</tool_call>"), std::string("<tool_call>"),
           std::string("text <tool_call>{\"name\": \"add\""),  // cut inside the call
       })
    expect_any_cuts_give(ToolFormat::hermes, text, {text, {}});
}

TEST(ToolCallStream, Llama3AndMistralAnswersAreWholeCallsOrText) {
  expect_any_cuts_give(ToolFormat::llama3, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
                       {"", {{"get_weather", R"({"city":"Rome"})"}}});
  expect_any_cuts_give(ToolFormat::llama3, "It is {sunny}.", {"It is {sunny}.", {}});
  expect_any_cuts_give(ToolFormat::llama3, "{not json", {"{not json", {}});
  expect_any_cuts_give(ToolFormat::mistral,
                       "[{\"name\": \"add\", \"arguments\": {\"a\": 1}}, {\"name\": \"get_weather\", \"arguments\": {}}]",
                       {"", {{"add", R"({"a":1})"}, {"get_weather", "{}"}}});
  expect_any_cuts_give(ToolFormat::mistral, "[{\"name\": \"add\"}, {\"name\": \"nope\"}]",
                       {"[{\"name\": \"add\"}, {\"name\": \"nope\"}]", {}});
  expect_any_cuts_give(ToolFormat::mistral, "[1] is a list", {"[1] is a list", {}});
  // Mistral's template wants ids of 9 letters and digits.
  ToolCallStream s(ToolFormat::mistral, kTools);
  s.add("[{\"name\": \"add\", \"arguments\": {}}]");
  const auto out = s.finish();
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].id.size(), 9u);
}

TEST(ToolRequests, ChecksNameTheField) {
  const auto error_of = [](const std::string& body) {
    try {
      parse_tools(json::parse(body));
    } catch (const ApiError& e) {
      return e.message;
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(error_of(R"({"tools": [{"type": "function", "function": {"name": "a b"}}]})"),
            "tools[0].function.name: expected a name of 1 to 64 letters, digits, '_' or '-', got a string \"a b\"");
  EXPECT_EQ(error_of(R"({"tools": [{"type": "retrieval"}]})"), "tools[0].type: expected \"function\", got a string \"retrieval\"");
  EXPECT_EQ(error_of(R"({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}})"),
            "tool_choice.function.name: expected the name of one of the tools, got a string \"g\"");
  EXPECT_EQ(error_of(R"({"tool_choice": "required"})"),
            "tool_choice: expected \"none\" or \"auto\" without tools, got a string \"required\"");
  EXPECT_EQ(error_of(R"({"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]})"),
            "tools[1].function.name: expected a name no other tool has, got a string \"f\"");
  EXPECT_EQ(error_of(R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]})"),
            "tools[0].function.parameters: expected a JSON Schema object, got an array []");
  EXPECT_EQ(error_of(R"({"tools": [], "tool_choice": "auto", "parallel_tool_calls": false})"), "(accepted)");
}

}  // namespace
}  // namespace mhsa::cli
