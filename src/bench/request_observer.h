// Turns the bytes of one completion response into a RequestRecord: SSE events are parsed as
// they arrive and each text chunk is stamped with the arrival time of the read that brought it.
#pragma once
#include <functional>
#include <optional>
#include <string>

#include "bench/http_client.h"
#include "bench/openai_protocol.h"
#include "bench/request_record.h"
#include "bench/sse_parser.h"

namespace tessera::bench {

class CompletionObserver : public HttpObserver {
 public:
  using DoneHandler = std::function<void(RequestRecord&&)>;
  // `sent_at` is when the request was handed to the client; `run_start` anchors start_s.
  CompletionObserver(ApiEndpoint endpoint, bool stream, int expected_prompt_tokens, bool keep_output_text,
                     Clock::time_point run_start, Clock::time_point sent_at, DoneHandler on_done);

  void on_response_start(int status, Clock::time_point at) override;
  void on_body(std::string_view bytes, Clock::time_point at) override;
  void on_finish(const HttpOutcome& outcome, Clock::time_point at) override;

 private:
  void on_event(const SseEvent& event);
  void record_text(Clock::time_point at);
  void finish_stream_record();
  void finish_full_response_record(Clock::time_point at);

  ApiEndpoint endpoint_;
  bool stream_;
  int expected_prompt_tokens_;
  bool keep_output_text_;
  Clock::time_point sent_at_;
  DoneHandler on_done_;
  SseParser sse_;
  RequestRecord record_;
  int status_ = 0;
  std::string body_;             // error bodies, whole responses, a stream until its first event
  Clock::time_point arrival_{};  // of the bytes being parsed now
  Clock::time_point last_text_at_{};
  std::optional<Usage> usage_;
  std::optional<std::string> stream_error_;
  bool malformed_ = false;
  bool stream_complete_ = false;  // [DONE] or a finish_reason arrived
  bool saw_event_ = false;        // at least one SSE event arrived
};

}  // namespace tessera::bench
