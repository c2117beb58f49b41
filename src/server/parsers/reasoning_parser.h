// Reasoning parsers: split model output into `reasoning_content` and `content`, as vLLM's
// `--reasoning-parser` does. Pure text in, text out; one parser object per request.
//
// Non-streaming: parse(full_text). Streaming: push(delta) for every detokenized delta, then
// finish() once; the concatenation of all streamed pieces equals parse(full_text) for any
// split of the text into deltas (tags split across deltas, UTF-8 split mid-character).
// Streamed pieces never end inside a UTF-8 character. Linear time, no regex.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace tessera::server {

struct ReasoningDelta {
  std::string reasoning;  // -> delta.reasoning_content
  std::string content;    // -> delta.content
  bool empty() const { return reasoning.empty() && content.empty(); }
};

struct ReasoningResult {
  std::string reasoning;  // empty: send `reasoning_content: null`
  std::string content;    // empty: send `content: null`
};

struct ReasoningParserOptions {
  // From the request's chat_template_kwargs.enable_thinking (Qwen3's switch). When false the
  // Qwen3 template already closed an empty think block in the prompt, so all output is content.
  bool enable_thinking = true;
};

// Options from a request's `chat_template_kwargs` (null or an object). Thinking is off only for
// a boolean false `enable_thinking`: that is what Qwen3's template tests (`is false`).
ReasoningParserOptions reasoning_options_from_kwargs(const nlohmann::json& chat_template_kwargs);

class ReasoningParser {
 public:
  virtual ~ReasoningParser() = default;
  virtual ReasoningDelta push(std::string_view delta) = 0;
  virtual ReasoningDelta finish() = 0;
  // True once the reasoning part is over (everything after is content). The server feeds only
  // content to the tool-call parser, as vLLM does.
  virtual bool reasoning_ended() const = 0;
  // A parser in its initial state with the same options.
  virtual std::unique_ptr<ReasoningParser> fresh() const = 0;

  // Non-streaming split of a complete output; does not touch this object's streaming state.
  ReasoningResult parse(std::string_view text) const;
};

// Names accepted by --reasoning-parser.
std::vector<std::string> supported_reasoning_parsers();

// Throws Error(kInvalidArgument) naming the supported parsers when `name` is unknown
// (call it once at startup to validate the flag; creating a parser per request then cannot fail).
std::unique_ptr<ReasoningParser> make_reasoning_parser(std::string_view name,
                                                       const ReasoningParserOptions& options = {});

}  // namespace tessera::server
