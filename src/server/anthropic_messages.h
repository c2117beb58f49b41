// Anthropic Messages (/v1/messages) requests as OpenAI chat requests (server-internal); the response side is
// messages_writer() in protocol_writers.h.
#pragma once

#include "server/api_common.h"

namespace tessera::server::api {

// system, system-role messages (kept in place), text / tool_use / tool_result / thinking blocks, tools,
// tool_choice, stop_sequences and thinking -> the chat request the chat template renders. Throws ApiError
// (400) naming the field for anything that cannot be served, image blocks included (text only).
ojson messages_to_chat(const ojson& body, int max_messages);

}  // namespace tessera::server::api
