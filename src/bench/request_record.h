// What one benchmark request measured, in seconds from the start of its run.
#pragma once
#include <string>
#include <vector>

namespace tessera::bench {

struct RequestRecord {
  bool success = false;
  // Empty on success, else one of: "http_<status>", "timeout", "connect_error", "disconnected"
  // (closed mid-response), "bad_response" (malformed HTTP, SSE or JSON), "stream_error" (the
  // server sent an error object inside a 200 stream).
  std::string failure_kind;
  std::string failure_message;

  double start_s = 0;         // when the request was sent, from the run's start
  double ttft_s = -1;         // first generated text after sending; -1 when none arrived
  double latency_s = 0;       // end to end: send to last byte
  std::vector<double> itl_s;  // gaps between successive text chunks
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = -1;       // usage.prompt_tokens_details.cached_tokens; -1 when the server sent none
  bool usage_reported = false;  // false: token counts are estimates (text chunks, prompt length)
  int text_chunks = 0;
  size_t prompt_index = 0;     // which prompt of the workload (--dataset-name agent: which conversation)
  int turn = 0;                // --dataset-name agent: which turn of its conversation, from 0
  std::string output_text;     // kept only when asked (RequestSettings::keep_output_text)
  std::string output_content;  // chat: the message content alone (no reasoning), kept with output_text
};

}  // namespace tessera::bench
