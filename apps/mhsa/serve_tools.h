// apps/mhsa/serve_tools.h — tools (function calling) for the server's chat endpoint: the request's
// `tools`, `tool_choice` and tool messages checked; the conversation rendered with the tools, by
// the model's chat template when it knows tools (Qwen's, Hermes', Llama 3.1's, Mistral's) or else
// with the tools described in the system message in the Hermes format; and the answer's text split
// into content and calls in the format the template asks of the model (ToolCallStream), as it
// streams. No HTTP here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve_api.h"

namespace mhsa::cli {

// How a model writes a call.
enum class ToolFormat {
  hermes,   // <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number, text around them
  llama3,   // the whole answer one {"name": ..., "parameters": {...}} object
  mistral,  // [TOOL_CALLS] (a special token, not in the text) then [{"name": ..., "arguments": {...}}, ...]
};

struct ToolRequest {
  nlohmann::json tools = nlohmann::json::array();  // OpenAI's [{type: function, function: {name, ...}}]
  enum class Choice { none, automatic, required, named } choice = Choice::automatic;
  std::string named;  // with Choice::named
  bool parallel = true;
  ToolFormat format = ToolFormat::hermes;  // the model's (tool_format)
  // With tool_choice required or a named function (Hermes format): the start of a call put after
  // the generation prompt, so that the answer is one ("<tool_call>\n{\"name\": \"NAME\", ...").
  // The answer's text is parsed as prefix + text.
  std::string forced;
  bool active() const { return !tools.empty() && choice != Choice::none; }
};

// The request's tools, tool_choice and parallel_tool_calls (OpenAI's chat shapes). Throws ApiError.
ToolRequest parse_tools(const nlohmann::json& body);

// The format the model's template asks for.
ToolFormat tool_format(const ServedModel& m);

// The conversation's ids with the tools: `messages` as OpenAI's chat sends them (assistant
// messages may carry tool_calls, whose arguments are JSON text; `tool` messages carry
// tool_call_id and content). Throws ApiError naming the message and field.
std::vector<int32_t> encode_tool_conversation(const ServedModel& m, const nlohmann::json& messages,
                                              const ToolRequest& tools, std::vector<int32_t>& end_ids);

// encode_tool_conversation, then what the choice asks for: with "required" or a named function
// the start of a call put after the prompt (tools.forced) and "</tool_call>" added to the request's
// stops; sets tools.format and request.end_ids; returns the prompt's ids. Throws ApiError.
std::vector<int32_t> prepare_tool_request(const ServedModel& m, const nlohmann::json& messages, ToolRequest& tools,
                                          serve::Request& request);

struct ToolCall {
  std::string id;         // "call_" + 24 characters, unique in the answer
  std::string name;
  std::string arguments;  // JSON text
};

// Splits an answer's text, as it streams, into content and calls. Text that may begin a call is
// held back until it is known not to; a call that does not parse as one is given back as content.
class ToolCallStream {
 public:
  // tools: the request's (OpenAI's shape); a call of a function not among them is content.
  ToolCallStream(ToolFormat format, const nlohmann::json& tools);
  struct Out {
    std::string content;
    std::vector<ToolCall> calls;
  };
  Out add(std::string_view text);
  Out finish();

 private:
  Out scan(bool final);
  ToolFormat format_;
  std::vector<std::string> names_;
  std::string pending_;
  bool in_call_ = false;     // hermes: after a <tool_call>
  bool after_call_ = false;  // hermes: right after a call's end
  bool decided_ = false;  // llama3/mistral: whether the answer is a call, once known
  bool whole_ = false;    // llama3/mistral: the answer is held whole
  int calls_ = 0;
};

// The calls as OpenAI's message.tool_calls (or a stream delta's, with "index").
nlohmann::ordered_json tool_calls_json(const std::vector<ToolCall>& calls, int first_index, bool delta);

}  // namespace mhsa::cli

namespace mhsa::cli {

// A whole chat answer with its calls: completion_json's, the message's content null when there is
// none, its tool_calls, and finish_reason "tool_calls" when there are calls.
nlohmann::ordered_json tool_completion_json(const ResponseIds& ids, const ServedModel& m, const std::string& content,
                                            const std::vector<ToolCall>& calls, serve::Finish finish,
                                            int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);
// A stream's chunks for what the splitter gave out: one for its content, one per call (their
// index counted on from calls_sent). `first`: no chunk has been sent yet (the first carries the
// role); both are updated.
std::vector<nlohmann::ordered_json> tool_chunks(const ResponseIds& ids, const ServedModel& m, const ToolCallStream::Out& out,
                                                bool& first, int& calls_sent);

}  // namespace mhsa::cli
