// The OpenAI wire format as a benchmark needs it: request bodies for /v1/chat/completions and
// /v1/completions, and what one streamed chunk or a whole response says (text, usage, error).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench/workload.h"

namespace tessera::bench {

enum class ApiEndpoint { kChatCompletions, kCompletions };

// "/v1/chat/completions" or "/v1/completions"; anything else throws with the accepted values.
ApiEndpoint parse_endpoint(std::string_view path);
const char* endpoint_path(ApiEndpoint endpoint);

struct GenerationParams {
  std::string model;
  double temperature = 0.0;
  bool stream = true;
  bool ignore_eos = false;  // vLLM's extension; other servers ignore the unknown field
  // vLLM bench's --extra-body: a JSON object whose members are added to every request (structured output,
  // sampling fields); empty: none.
  std::string extra_body;
};

std::string build_request_body(ApiEndpoint endpoint, const PromptSpec& prompt, const GenerationParams& params);

// One message of a chat request.
struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};
// A /v1/chat/completions body with these messages (the multi-turn conversations of --dataset-name agent).
std::string build_chat_request_body(const std::vector<ChatMessage>& messages, int max_tokens,
                                    const GenerationParams& params);

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  // usage.prompt_tokens_details.cached_tokens (prompt tokens the server's prefix cache held); -1 when absent.
  int cached_tokens = -1;
};

// What a server message carried. `error` is set for a malformed message or an error object.
struct MessageContent {
  bool is_done_marker = false;     // "data: [DONE]"
  bool has_text = false;           // generated text (content, reasoning or completion text) was present
  bool has_finish_reason = false;  // a choice ended ("stop", "length", ...)
  std::string text;
  std::string content;  // chat: the "content" part of `text` alone (no reasoning); completions: `text`
  std::optional<Usage> usage;
  std::optional<std::string> error;
};

// One SSE "data:" payload of a streamed response.
MessageContent parse_stream_message(std::string_view data, ApiEndpoint endpoint);
// The whole body of a non-streamed response.
MessageContent parse_full_response(std::string_view body, ApiEndpoint endpoint);
// The "message" of an OpenAI error body, or the body itself shortened, for error reports.
std::string error_body_summary(std::string_view body);

}  // namespace tessera::bench
