// One ProtocolWriter per API (server-internal): how a generation request's choices become that API's
// stream events and response body. The bookkeeping they share is in generation.h.
#pragma once

#include <memory>

#include "server/generation.h"
#include "server/responses_api.h"

namespace tessera::server::api {

// OpenAI /v1/chat/completions: chat.completion(.chunk), reasoning_content and tool_calls from the parsers.
std::unique_ptr<ProtocolWriter> chat_writer(const TokenText& text);
// OpenAI /v1/completions: text_completion, echo of the prompt, completion logprobs.
std::unique_ptr<ProtocolWriter> completion_writer(const TokenText& text);
// Anthropic /v1/messages: thinking, text and tool_use blocks (anthropic_messages.cpp).
std::unique_ptr<ProtocolWriter> messages_writer();
// OpenAI /v1/responses: reasoning, message and function_call output items (ResponseBuilder).
std::unique_ptr<ProtocolWriter> responses_writer(const TokenText& text, ResponsesRequest request);

}  // namespace tessera::server::api
