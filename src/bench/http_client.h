// Asynchronous HTTP/1.1 client for one base URL, built for load generation: every exchange runs
// on the caller's io_context thread, body bytes reach the observer the moment a read completes
// (so timestamps are arrival times, not parse times), and keep-alive connections are reused.
// Beast stays inside http_client.cpp; this header only needs Asio's io_context.
#pragma once
#include <boost/asio/io_context.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::bench {

using Clock = std::chrono::steady_clock;

struct BaseUrl {
  std::string host;
  std::string port;
  std::string path_prefix;  // "" or "/something" without a trailing slash; "/v1" is stripped
  std::string text;         // as the user wrote it, for messages
};

// Accepts "http://host[:port][/prefix]"; a trailing "/v1" is dropped so that both
// http://h:8000 and http://h:8000/v1 work. https is refused with a message saying what to do.
BaseUrl parse_base_url(std::string_view url);

enum class TransportError {
  kNone,
  kConnect,       // could not resolve or connect
  kTimeout,       // the request took longer than its timeout
  kDisconnected,  // the connection closed or reset before the response was complete
  kProtocol,      // the bytes were not valid HTTP
};

struct HttpOutcome {
  TransportError error = TransportError::kNone;
  int status = 0;       // 0 when no response header arrived
  std::string message;  // what went wrong, for error reports
};

// Callbacks of one exchange, all on the io_context thread.
class HttpObserver {
 public:
  virtual ~HttpObserver() = default;
  virtual void on_response_start(int status, Clock::time_point at) {}
  virtual void on_body(std::string_view bytes, Clock::time_point at) = 0;
  virtual void on_finish(const HttpOutcome& outcome, Clock::time_point at) = 0;
};

// Header fields as (name, value) pairs.
using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpExchange {
  std::string method = "POST";  // "GET" or "POST"
  std::string path;             // appended to the base URL's prefix
  std::string body;             // JSON; empty for GET
  std::chrono::milliseconds timeout{std::chrono::hours(1)};
  HttpHeaders headers{};  // this exchange's own fields, set after the client's (x-request-id)
};

class HttpClient {
 public:
  // Resolves the host once, here; throws tessera::Error if it cannot be resolved. `headers` (vLLM bench's
  // --header) go on every request after the client's own fields (Host, User-Agent, Accept, Authorization from
  // `api_key`, Content-Type), replacing a field of the same name.
  HttpClient(boost::asio::io_context& io, BaseUrl base_url, std::string api_key, HttpHeaders headers = {});
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Starts an exchange; the observer is kept alive until on_finish has returned.
  void send(const HttpExchange& exchange, std::shared_ptr<HttpObserver> observer);
  const BaseUrl& base_url() const;
  // Connections opened so far (new TCP connections, not reuses), for the overhead report.
  size_t connections_opened() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace tessera::bench
