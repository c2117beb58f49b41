// A loopback OpenAI-compatible server whose timing and failures are scripted per request.
// Tests use it to check that measured metrics equal the script; `tessera bench --self-test`
// uses it (answering instantly) to measure how many requests and streams the client sustains.
// It speaks just enough HTTP/1.1: keep-alive, Content-Length request bodies, chunked or
// close-delimited SSE responses.
#pragma once
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tessera::bench {

struct ScriptedResponse {
  int status = 200;                        // anything else: an OpenAI-style JSON error body, sent at once
  double ttft_s = 0;                       // delay from the request to the first text chunk
  double token_interval_s = 0;             // delay between text chunks, kept on an absolute schedule
  int tokens = -1;                         // text chunks to send; -1 takes the request's max_tokens
  int prompt_tokens = 7;                   // reported in usage
  bool include_usage = true;               // send the final usage chunk when streaming, usage when not
  int drop_after_tokens = -1;              // close the connection after this many text chunks
  bool chunked = true;                     // Transfer-Encoding: chunked; false: body ends at connection close
  bool garbage_after_first_token = false;  // send a "data:" line that is not JSON, then finish
  bool never_respond = false;              // read the request and stay silent (client timeouts)
  bool close_without_response = false;     // close as soon as the request is read
  bool ignore_stream = false;              // answer one JSON body even when the request asked to stream
};

// When a streamed response's bytes actually left the server, measured from the request's
// arrival. On a busy machine timers fire late, so tests compare the client's figures with these
// rather than with the script alone.
struct ServedTiming {
  std::string prompt;               // the user message (chat) or prompt (completions)
  double first_text_s = -1;         // first text chunk written
  double last_byte_s = 0;           // end of the response written
  std::vector<double> text_gaps_s;  // between successive text chunk writes
  // The same moments on the steady clock, to compare with a client in the same process.
  std::chrono::steady_clock::time_point first_text_at, last_byte_at;
  std::vector<std::chrono::steady_clock::time_point> text_at;
};

// Decides the response of the `index`-th request (0-based, in arrival order) from its body.
using ResponseScript = std::function<ScriptedResponse(size_t index, const nlohmann::json& body)>;

class ScriptedServer {
 public:
  // Listens on 127.0.0.1 on a free port and serves on `threads` background threads.
  // A non-empty `required_api_key` answers 401 to requests without "Bearer <key>".
  explicit ScriptedServer(ResponseScript script, int threads = 1, std::string required_api_key = "");
  ~ScriptedServer();
  ScriptedServer(const ScriptedServer&) = delete;
  ScriptedServer& operator=(const ScriptedServer&) = delete;

  int port() const;
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port()); }
  size_t completion_requests() const;                // POSTs to a completions endpoint so far
  std::vector<ServedTiming> served_timings() const;  // streams completed so far, in completion order
  // The header fields of every request so far (GET /v1/models too), in arrival order; names in lower case.
  std::vector<std::map<std::string, std::string>> request_headers() const;
  static constexpr const char* kModelId = "scripted-model";

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::bench
