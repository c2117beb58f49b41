#include "bench/request_observer.h"

namespace tessera::bench {
namespace {

constexpr size_t kMaxKeptBody = 1 << 20;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

const char* transport_failure_kind(TransportError error) {
  switch (error) {
    case TransportError::kConnect:
      return "connect_error";
    case TransportError::kTimeout:
      return "timeout";
    case TransportError::kDisconnected:
      return "disconnected";
    case TransportError::kProtocol:
      return "bad_response";
    case TransportError::kNone:
      break;
  }
  return "";
}

}  // namespace

CompletionObserver::CompletionObserver(ApiEndpoint endpoint, bool stream, int expected_prompt_tokens,
                                       bool keep_output_text, Clock::time_point run_start, Clock::time_point sent_at,
                                       DoneHandler on_done)
    : endpoint_(endpoint),
      stream_(stream),
      expected_prompt_tokens_(expected_prompt_tokens),
      keep_output_text_(keep_output_text),
      sent_at_(sent_at),
      on_done_(std::move(on_done)),
      sse_([this](const SseEvent& event) { on_event(event); }) {
  record_.start_s = seconds_between(run_start, sent_at);
}

void CompletionObserver::on_response_start(int status, Clock::time_point) { status_ = status; }

void CompletionObserver::on_body(std::string_view bytes, Clock::time_point at) {
  if (status_ != 200 || !stream_) {
    if (body_.size() < kMaxKeptBody) body_.append(bytes.substr(0, kMaxKeptBody - body_.size()));
    return;
  }
  arrival_ = at;
  // Until an event arrives keep the bytes: a server that ignores "stream" answers plain JSON.
  if (!saw_event_ && body_.size() < kMaxKeptBody) body_.append(bytes.substr(0, kMaxKeptBody - body_.size()));
  sse_.feed(bytes);
}

void CompletionObserver::on_event(const SseEvent& event) {
  if (!saw_event_) {
    saw_event_ = true;
    body_.clear();
  }
  MessageContent message = parse_stream_message(event.data, endpoint_);
  if (message.is_done_marker) {
    stream_complete_ = true;
    return;
  }
  if (message.error) {
    // A JSON error object is the server's word; anything unparseable is a broken stream.
    if (message.error->rfind("not JSON", 0) == 0) malformed_ = true;
    if (!stream_error_) stream_error_ = *message.error;
    return;
  }
  if (message.has_text) {
    record_text(arrival_);
    if (keep_output_text_) {
      record_.output_text += message.text;
      record_.output_content += message.content;
    }
  }
  if (message.usage) usage_ = message.usage;
  if (message.has_finish_reason) stream_complete_ = true;
}

void CompletionObserver::record_text(Clock::time_point at) {
  if (record_.text_chunks == 0) {
    record_.ttft_s = seconds_between(sent_at_, at);
  } else {
    record_.itl_s.push_back(seconds_between(last_text_at_, at));
  }
  last_text_at_ = at;
  ++record_.text_chunks;
}

void CompletionObserver::on_finish(const HttpOutcome& outcome, Clock::time_point at) {
  record_.latency_s = seconds_between(sent_at_, at);
  if (outcome.error != TransportError::kNone) {
    record_.failure_kind = transport_failure_kind(outcome.error);
    record_.failure_message = outcome.message;
  } else if (outcome.status != 200) {
    record_.failure_kind = "http_" + std::to_string(outcome.status);
    record_.failure_message = error_body_summary(body_);
  } else if (stream_) {
    sse_.finish();
    if (saw_event_)
      finish_stream_record();
    else
      finish_full_response_record(at);
  } else {
    finish_full_response_record(at);
  }
  record_.success = record_.failure_kind.empty();
  if (!record_.success) record_.itl_s.clear();
  on_done_(std::move(record_));
}

void CompletionObserver::finish_stream_record() {
  if (stream_error_) {
    record_.failure_kind = malformed_ ? "bad_response" : "stream_error";
    record_.failure_message = *stream_error_;
    return;
  }
  if (!stream_complete_) {
    // A body that ends at connection close cannot be told from a dropped connection by HTTP
    // alone; OpenAI-compatible servers end every stream with [DONE] or a finish_reason.
    record_.failure_kind = "disconnected";
    record_.failure_message = "the stream ended without 'data: [DONE]' or a finish_reason";
    return;
  }
  if (usage_) {
    record_.usage_reported = true;
    record_.prompt_tokens = usage_->prompt_tokens;
    record_.completion_tokens = usage_->completion_tokens;
    record_.cached_tokens = usage_->cached_tokens;
  } else {
    // Most servers send one token per chunk; without usage that is the best count we have.
    record_.prompt_tokens = expected_prompt_tokens_;
    record_.completion_tokens = record_.text_chunks;
  }
}

void CompletionObserver::finish_full_response_record(Clock::time_point at) {
  MessageContent message = parse_full_response(body_, endpoint_);
  if (message.error) {
    record_.failure_kind = message.error->rfind("not JSON", 0) == 0 ? "bad_response" : "stream_error";
    record_.failure_message = *message.error;
    return;
  }
  // Without streaming the first token is only seen with the last one.
  record_.ttft_s = record_.latency_s;
  record_.text_chunks = message.has_text ? 1 : 0;
  if (keep_output_text_) {
    record_.output_text = message.text;
    record_.output_content = message.content;
  }
  if (message.usage) {
    record_.usage_reported = true;
    record_.prompt_tokens = message.usage->prompt_tokens;
    record_.completion_tokens = message.usage->completion_tokens;
    record_.cached_tokens = message.usage->cached_tokens;
  } else {
    record_.prompt_tokens = expected_prompt_tokens_;
    record_.completion_tokens = estimate_tokens(message.text);
  }
}

}  // namespace tessera::bench
