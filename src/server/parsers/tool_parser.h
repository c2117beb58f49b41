// Tool-call parsers: find the function calls a model wrote into its output text, as vLLM's
// `--tool-call-parser` does. Pure text in, calls out; one parser object per request.
//
//   hermes       <tool_call>{"name": "f", "arguments": {...}}</tool_call>   (Qwen2.5, Qwen3, Hermes)
//   qwen3        alias of hermes (Qwen3's chat template uses the hermes format; not a vLLM name)
//   qwen3_coder  <tool_call><function=f><parameter=x>value</parameter></function></tool_call>
//                (Qwen3-Coder, Qwen3.5); values converted with the request's tool JSON schemas
//   qwen3_xml    alias of qwen3_coder (vLLM's other parser for the same format)
//
// Non-streaming: parse(text) -> content + calls. Streaming: push(delta) for each content delta
// (after the reasoning parser, if any), then finish() once. Streamed deltas have OpenAI's
// shape: the first delta of a call carries index + id + name (send `type: "function"` with it),
// later ones carry argument fragments; calls are numbered 0, 1, ... in order.
// For well-formed output, streaming and non-streaming agree for every split of the text; see
// docs/parsers.md for the one malformed case where they cannot. Linear time, no regex; never
// throws on model output.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace tessera::server {

struct ToolCall {
  std::string id;         // "chatcmpl-tool-<32 hex>"
  std::string name;       // function.name
  std::string arguments;  // function.arguments: a JSON text
};

struct ToolParseResult {
  std::string content;  // text that is not a tool call; empty: `content: null`
  std::vector<ToolCall> tool_calls;
  bool tools_called() const { return !tool_calls.empty(); }  // finish_reason "tool_calls"
};

struct ToolCallDelta {
  int index = 0;          // tool_calls[].index
  std::string id;         // set only on the call's first delta (with name)
  std::string name;       // set only on the call's first delta
  std::string arguments;  // fragment to append to function.arguments (may be empty)
  bool first() const { return !id.empty(); }
};

struct ToolStreamDelta {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;  // at most one entry per index per push
  bool empty() const { return content.empty() && tool_calls.empty(); }
};

using ToolCallIdGenerator = std::function<std::string()>;

// vLLM's id shape: "chatcmpl-tool-" + 32 random hex digits.
std::string make_tool_call_id();

struct ToolParserOptions {
  // The request's `tools` array ([{"type": "function", "function": {"name", "parameters"}}]);
  // qwen3_coder reads the parameter schemas to type the values. May be null or empty.
  nlohmann::json tools = nlohmann::json::array();
  ToolCallIdGenerator make_id = make_tool_call_id;  // injectable for tests
  // Named tool_choice: calls to any other function are dropped. Empty: keep all.
  std::string only_function;
  // parallel_tool_calls false (Anthropic: disable_parallel_tool_use): calls after the first are dropped.
  bool single_call = false;
};

class ToolParser {
 public:
  virtual ~ToolParser() = default;
  virtual ToolStreamDelta push(std::string_view delta) = 0;
  virtual ToolStreamDelta finish() = 0;
  virtual std::unique_ptr<ToolParser> fresh() const = 0;
  // Non-streaming result for a complete text; does not touch this object's streaming state.
  virtual ToolParseResult parse(std::string_view text) const;
};

// Names accepted by --tool-call-parser.
std::vector<std::string> supported_tool_parsers();

// Throws Error(kInvalidArgument) naming the supported parsers when `name` is unknown
// (validate --tool-call-parser once at startup; per request creation then cannot fail).
std::unique_ptr<ToolParser> make_tool_parser(std::string_view name, ToolParserOptions options = {});

// Folds streamed deltas into complete calls (what a client does); used by parse() and tests.
void accumulate_tool_deltas(std::vector<ToolCall>& calls, const std::vector<ToolCallDelta>& deltas);

// tool_choice handling, vLLM's rules (see docs/parsers.md):
//   "none"      -> no parser; output is content.
//   "auto"      -> needs --enable-auto-tool-choice and a --tool-call-parser, else 400.
//   "required"  -> needs a --tool-call-parser and a non-empty `tools`, else 400; enforced by
//                  constrained decoding (server/structured_output.h: tool_call_structure).
//   {"type": "function", "function": {"name": N}} -> N must be in `tools`, else 400; parsed
//                  like "required" and calls to other functions are dropped (only_function = N).
struct ToolChoicePlan {
  bool parse_tools = false;   // create a tool parser for this request
  std::string only_function;  // named choice
};
// Validates a request's `tool_choice` (null/absent means "auto" when tools are given, as in
// OpenAI and vLLM, else "none") against its `tools`. A non-ok Status is a 400 with that message.
Status plan_tool_choice(const nlohmann::json& tool_choice, const nlohmann::json& tools, bool enable_auto_tool_choice,
                        bool has_tool_parser, ToolChoicePlan* plan);

}  // namespace tessera::server
