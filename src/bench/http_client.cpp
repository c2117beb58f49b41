#include "bench/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <limits>
#include <optional>
#include <vector>

#include "core/error.h"

namespace tessera::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

BaseUrl parse_base_url(std::string_view url) {
  BaseUrl out;
  out.text = std::string(url);
  std::string_view rest = url;
  if (rest.substr(0, 8) == "https://")
    fail(ErrorKind::kUnsupported,
         "--base-url {}: https is not supported yet; use the server's plain http address (or a local TLS proxy)", url);
  if (rest.substr(0, 7) == "http://")
    rest.remove_prefix(7);
  else if (rest.find("://") != std::string_view::npos)
    fail(ErrorKind::kInvalidArgument, "--base-url {}: expected http://HOST:PORT", url);
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  if (authority.empty()) fail(ErrorKind::kInvalidArgument, "--base-url {}: no host; expected http://HOST:PORT", url);
  size_t colon = authority.rfind(':');
  if (colon != std::string_view::npos && authority.find(']') == std::string_view::npos) {
    out.host = std::string(authority.substr(0, colon));
    out.port = std::string(authority.substr(colon + 1));
  } else if (!authority.empty() && authority.front() == '[') {  // [::1]:8000
    size_t close = authority.find(']');
    out.host = std::string(authority.substr(1, close - 1));
    out.port = close + 2 <= authority.size() ? std::string(authority.substr(close + 2)) : "80";
  } else {
    out.host = std::string(authority);
    out.port = "80";
  }
  if (out.port.empty()) out.port = "80";
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  if (path.size() >= 3 && path.substr(path.size() - 3) == "/v1") path.remove_suffix(3);
  out.path_prefix = std::string(path);
  return out;
}

// Not in an anonymous namespace: HttpClient::State (declared in the header) holds them.
namespace http_client_detail {

struct Connection {
  explicit Connection(asio::io_context& io) : socket(io) {}
  tcp::socket socket;
  beast::flat_buffer buffer;  // bytes read past the end of the previous response stay here
};

}  // namespace http_client_detail
using http_client_detail::Connection;

struct HttpClient::State {
  State(asio::io_context& io_context, BaseUrl url, std::string key, HttpHeaders extra)
      : io(io_context), base_url(std::move(url)), api_key(std::move(key)), headers(std::move(extra)) {}
  asio::io_context& io;
  BaseUrl base_url;
  std::string api_key;
  HttpHeaders headers;
  tcp::resolver::results_type endpoints;
  std::vector<std::unique_ptr<Connection>> idle;
  size_t connections_opened = 0;
};

namespace {

class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(std::shared_ptr<HttpClient::State> state, const HttpExchange& spec, std::shared_ptr<HttpObserver> observer)
      : state_(std::move(state)), observer_(std::move(observer)), deadline_(state_->io) {
    request_.method(spec.method == "GET" ? http::verb::get : http::verb::post);
    request_.target(state_->base_url.path_prefix + spec.path);
    request_.version(11);
    request_.set(http::field::host, state_->base_url.host + ":" + state_->base_url.port);
    request_.set(http::field::user_agent, "tessera-bench");
    request_.set(http::field::accept, "application/json, text/event-stream");
    if (!state_->api_key.empty()) request_.set(http::field::authorization, "Bearer " + state_->api_key);
    if (request_.method() == http::verb::post) {
      request_.set(http::field::content_type, "application/json");
      request_.body() = spec.body;
    }
    for (const auto& [name, value] : state_->headers) request_.set(name, value);
    for (const auto& [name, value] : spec.headers) request_.set(name, value);
    request_.keep_alive(true);
    request_.prepare_payload();
    timeout_ = spec.timeout;
  }

  void start() {
    deadline_.expires_after(timeout_);
    deadline_.async_wait([self = shared_from_this()](error_code ec) {
      if (ec || self->finished_) return;
      self->timed_out_ = true;
      error_code ignored;
      if (self->connection_) self->connection_->socket.close(ignored);
    });
    take_connection();
  }

 private:
  void take_connection() {
    parser_.emplace();
    // Streams may be long. Not boost::none: Beast 1.74 compares Content-Length against an empty
    // optional and then rejects every sized body.
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    received_bytes_ = false;
    if (!state_->idle.empty()) {
      connection_ = std::move(state_->idle.back());
      state_->idle.pop_back();
      reused_ = true;
      write();
      return;
    }
    reused_ = false;
    connection_ = std::make_unique<Connection>(state_->io);
    ++state_->connections_opened;
    asio::async_connect(connection_->socket, state_->endpoints,
                        [self = shared_from_this()](error_code ec, const tcp::endpoint&) { self->on_connect(ec); });
  }

  void on_connect(error_code ec) {
    if (ec) return fail_with(timed_out_ ? TransportError::kTimeout : TransportError::kConnect, ec);
    error_code ignored;
    connection_->socket.set_option(tcp::no_delay(true), ignored);
    write();
  }

  void write() {
    http::async_write(connection_->socket, request_,
                      [self = shared_from_this()](error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(error_code ec) {
    if (ec) return retry_or_fail(ec);
    read_some();
  }

  void read_some() {
    parser_->get().body().data = body_buffer_;
    parser_->get().body().size = sizeof(body_buffer_);
    http::async_read_some(connection_->socket, connection_->buffer, *parser_,
                          [self = shared_from_this()](error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(error_code ec) {
    Clock::time_point now = Clock::now();  // the arrival time of whatever this read brought
    if (ec == http::error::need_buffer) ec = {};
    if (ec) return retry_or_fail(ec);
    received_bytes_ = true;
    if (!header_reported_ && parser_->is_header_done()) {
      header_reported_ = true;
      status_ = parser_->get().result_int();
      observer_->on_response_start(status_, now);
    }
    size_t filled = sizeof(body_buffer_) - parser_->get().body().size;
    if (filled) observer_->on_body(std::string_view(body_buffer_, filled), now);
    if (finished_) return;  // the observer may not abort today, but stay safe if it ever does
    if (parser_->is_done()) {
      bool keep_alive = parser_->get().keep_alive();
      finish(HttpOutcome{TransportError::kNone, status_, {}}, keep_alive);
      return;
    }
    read_some();
  }

  // A reused keep-alive connection may have been closed by the server while idle; that is not
  // the request's fault, so it gets one fresh connection before counting as an error.
  void retry_or_fail(error_code ec) {
    if (timed_out_) return fail_with(TransportError::kTimeout, ec);
    if (reused_ && !received_bytes_) {
      error_code ignored;
      connection_->socket.close(ignored);
      connection_.reset();
      take_connection();
      return;
    }
    bool protocol = ec.category() == http::make_error_code(http::error::bad_version).category() &&
                    ec != http::error::partial_message && ec != http::error::end_of_stream;
    fail_with(protocol ? TransportError::kProtocol : TransportError::kDisconnected, ec);
  }

  void fail_with(TransportError error, error_code ec) {
    std::string message = ec.message();
    if (error == TransportError::kTimeout)
      message = "no complete response within " + std::to_string(timeout_.count()) + " ms";
    finish(HttpOutcome{error, status_, message}, false);
  }

  void finish(HttpOutcome outcome, bool reusable) {
    if (finished_) return;
    finished_ = true;
    Clock::time_point now = Clock::now();
    deadline_.cancel();
    if (reusable && connection_) {
      state_->idle.push_back(std::move(connection_));
    } else if (connection_) {
      error_code ignored;
      connection_->socket.close(ignored);
      connection_.reset();
    }
    observer_->on_finish(outcome, now);
  }

  std::shared_ptr<HttpClient::State> state_;
  std::shared_ptr<HttpObserver> observer_;
  asio::steady_timer deadline_;
  std::chrono::milliseconds timeout_{};
  http::request<http::string_body> request_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  std::unique_ptr<Connection> connection_;
  char body_buffer_[16 * 1024];
  int status_ = 0;
  bool reused_ = false;
  bool received_bytes_ = false;
  bool header_reported_ = false;
  bool timed_out_ = false;
  bool finished_ = false;
};

}  // namespace

HttpClient::HttpClient(asio::io_context& io, BaseUrl base_url, std::string api_key, HttpHeaders headers)
    : state_(std::make_shared<State>(io, std::move(base_url), std::move(api_key), std::move(headers))) {
  tcp::resolver resolver(io);
  error_code ec;
  state_->endpoints = resolver.resolve(state_->base_url.host, state_->base_url.port, ec);
  if (ec)
    fail(ErrorKind::kNetwork, "cannot resolve '{}' from --base-url {}: {}; check the host name", state_->base_url.host,
         state_->base_url.text, ec.message());
}

HttpClient::~HttpClient() {
  error_code ignored;
  for (auto& connection : state_->idle) connection->socket.close(ignored);
  state_->idle.clear();
}

void HttpClient::send(const HttpExchange& exchange, std::shared_ptr<HttpObserver> observer) {
  std::make_shared<Exchange>(state_, exchange, std::move(observer))->start();
}

const BaseUrl& HttpClient::base_url() const { return state_->base_url; }
size_t HttpClient::connections_opened() const { return state_->connections_opened; }

}  // namespace tessera::bench
