// The reasoning parser and the tool-call parser chained, as vLLM's chat endpoint chains them:
// reasoning first, then tool calls parsed from the content only. One object per request.
//
//   auto out = ChatOutputParser(make_reasoning_parser("qwen3", {.enable_thinking = true}),
//                               make_tool_parser("hermes", {.tools = request_tools}));
//   streaming:      for each detokenized delta: ChatDelta d = out.push(delta); ...; out.finish();
//   non-streaming:  ChatParseResult r = out.parse(full_text);
//
// Either parser may be null (no --reasoning-parser; tool_choice "none" or no tools).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/parsers/reasoning_parser.h"
#include "server/parsers/tool_parser.h"

namespace tessera::server {

struct ChatDelta {
  std::string reasoning;                  // delta.reasoning_content
  std::string content;                    // delta.content
  std::vector<ToolCallDelta> tool_calls;  // delta.tool_calls
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  // Appends a later delta (e.g. finish() after the last push()), keeping one entry per call
  // index: argument fragments for the same call are joined.
  void append(ChatDelta&& later);
};

struct ChatParseResult {
  std::string reasoning;  // message.reasoning_content (empty: null)
  std::string content;    // message.content (empty: null)
  std::vector<ToolCall> tool_calls;
  bool tools_called() const { return !tool_calls.empty(); }  // finish_reason "tool_calls"
};

class ChatOutputParser {
 public:
  ChatOutputParser(std::unique_ptr<ReasoningParser> reasoning, std::unique_ptr<ToolParser> tools);

  ChatDelta push(std::string_view delta);
  ChatDelta finish();
  // Whether any tool call was streamed so far (for finish_reason "tool_calls").
  bool tools_called() const { return tools_called_; }

  // Non-streaming; independent of the streaming state.
  ChatParseResult parse(std::string_view text) const;

 private:
  ChatDelta from_tools(ReasoningDelta r, ToolStreamDelta t);

  std::unique_ptr<ReasoningParser> reasoning_;
  std::unique_ptr<ToolParser> tools_;
  bool tools_called_ = false;
};

// OpenAI JSON for the parsed calls, in OpenAI's key order with nlohmann::ordered_json.
// message.tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}]
template <class Json = nlohmann::ordered_json>
Json tool_calls_json(const std::vector<ToolCall>& calls) {
  Json out = Json::array();
  for (const ToolCall& c : calls)
    out.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return out;
}

// delta.tool_calls: the first delta of a call has index, id, type and function.name (and
// arguments, possibly ""); later ones index and function.arguments only.
template <class Json = nlohmann::ordered_json>
Json tool_call_deltas_json(const std::vector<ToolCallDelta>& deltas) {
  Json out = Json::array();
  for (const ToolCallDelta& d : deltas) {
    if (d.first())
      out.push_back({{"index", d.index},
                     {"id", d.id},
                     {"type", "function"},
                     {"function", {{"name", d.name}, {"arguments", d.arguments}}}});
    else
      out.push_back({{"index", d.index}, {"function", {{"arguments", d.arguments}}}});
  }
  return out;
}

}  // namespace tessera::server
