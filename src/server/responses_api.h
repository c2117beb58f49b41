// The OpenAI Responses API (POST /v1/responses) on top of the chat-completions machinery, as vLLM serves
// it: a Responses request becomes a chat request (input items -> messages, function tools -> tools), the
// generation runs through the same bookkeeping and output parsers (reasoning, tool calls) as
// /v1/chat/completions, and ResponseBuilder turns the parsed output into Responses output items
// (reasoning, message, function_call) and, when streaming, into the event sequence the official SDKs
// parse (response.created ... response.completed).
//
//   ResponsesRequest rq = responses_to_chat(body);         // throws Error(kInvalidArgument) -> 400
//   ResponseBuilder b(id, model, created, rq);
//   streaming:     sse(b.start()); per parsed delta sse(b.push(delta)); sse(b.finish(reason, usage));
//   non-streaming: b.add(parse_result); respond(b.response(reason, usage));
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/parsers/chat_output_parser.h"

namespace tessera::server {

struct ResponsesRequest {
  nlohmann::ordered_json chat;             // the equivalent /v1/chat/completions request body
  nlohmann::ordered_json echo;             // request settings the response object repeats (instructions, tools, ...)
  bool reasoning_summary = false;          // reasoning.summary was asked for: reasoning goes into summary parts
  std::vector<std::string> ignored_tools;  // hosted tool types dropped from `tools` (for the log)
};

// Throws Error(kInvalidArgument) with a message naming the field for anything that cannot be served.
ResponsesRequest responses_to_chat(const nlohmann::ordered_json& body);

struct ResponsesUsage {
  int input_tokens = 0, cached_tokens = 0, output_tokens = 0, reasoning_tokens = 0;
};

class ResponseBuilder {
 public:
  ResponseBuilder(std::string id, std::string model, int64_t created, const ResponsesRequest& request);

  // Server-sent events, each "event: <type>\ndata: <json>\n\n".
  std::string start();                   // response.created, response.in_progress
  std::string push(const ChatDelta& d);  // items opened/extended for one parsed delta
  // Closes the open items; response.completed, response.incomplete (finish "length": max_output_tokens)
  // or response.failed (finish "error", with `error_message`).
  std::string finish(const std::string& finish_reason, const ResponsesUsage& usage,
                     const std::string& error_message = {});

  // Non-streaming: all output items of a complete parse at once.
  void add(const ChatParseResult& r);
  // The response object (as in response.completed).
  nlohmann::ordered_json response(const std::string& finish_reason, const ResponsesUsage& usage) const;

  // All reasoning text so far (the caller counts its tokens for usage.output_tokens_details).
  const std::string& reasoning_text() const { return reasoning_all_; }

 private:
  struct Item {
    std::string type;  // "reasoning", "message", "function_call"
    nlohmann::ordered_json json;
    int tool_index = -1;  // function_call: the parser's call index
  };
  nlohmann::ordered_json object(const std::string& status) const;
  std::string event(const char* type, nlohmann::ordered_json fields);
  std::string open(const std::string& type, int tool_index = -1);
  std::string close_open();
  std::string item_id(const char* prefix);

  std::string id_, model_;
  int64_t created_;
  nlohmann::ordered_json echo_;
  bool summary_;
  std::vector<Item> items_;
  bool open_ = false;  // items_.back() is still streaming
  int seq_ = 0, next_item_ = 0;
  std::string reasoning_all_;
};

}  // namespace tessera::server
