// OpenAI chat messages as vLLM's server hands them to a chat template (vllm/entrypoints/chat_utils.py):
// each message keeps role, content, name, tool_calls (assistant), reasoning/reasoning_content (assistant) and
// tool_call_id (tool); content becomes a string ("\n"-joined text parts, "" for null) or, for templates that
// loop over content parts, a list of {"type": "text", "text": ...} / {"type": "image"|"audio"|"video"} parts;
// tool-call arguments given as JSON strings become objects, and an empty tool_calls list is dropped.
// transformers' apply_chat_template does none of this; ChatTemplate applies it only when asked.
#pragma once
#include <nlohmann/json.hpp>

namespace tessera::tokenizer {

enum class ContentFormat {
  kString,  // content is one string (most templates)
  kOpenAI,  // content is a list of typed parts (templates that loop over message.content)
};

// Throws tessera::Error (kInvalidArgument) for messages vLLM rejects: no role, tool calls that are not
// function objects, content parts of an unknown type.
nlohmann::ordered_json vllm_messages(const nlohmann::ordered_json& messages, ContentFormat format);

}  // namespace tessera::tokenizer
