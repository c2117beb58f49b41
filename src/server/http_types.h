// The HTTP layer's plain types, free of Boost: the API layer (api_server.cpp) sees requests
// as these structs and answers through an Exchange, so Beast stays in one translation unit.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::server {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // target without the query string
  std::string query;
  HeaderList headers;  // names in lower case
  std::string body;
  std::string remote;  // peer address, for logs

  // The first header with this (lower-case) name, or null.
  const std::string* header(std::string_view name) const {
    for (const auto& [k, v] : headers)
      if (k == name) return &v;
    return nullptr;
  }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  HeaderList headers;
  std::string body;
};

// One request/response exchange on a connection. Every method may be called from any thread:
// they run on the connection's strand (inline when the caller is already there). After the
// client went away, writes are dropped silently.
class Exchange {
 public:
  virtual ~Exchange() = default;
  // A complete response (Content-Length framing).
  virtual void respond(HttpResponse response) = 0;
  // A streamed response: headers now (chunked, no buffering by proxies), then write() per event.
  virtual void start_stream(int status, std::string content_type, HeaderList headers) = 0;
  virtual void write(std::string data) = 0;  // sent as one chunk, flushed at once
  virtual void finish() = 0;                 // the last chunk; the connection may serve the next request
  // Runs `fn` on the connection's strand.
  virtual void post(std::function<void()> fn) = 0;
  // `fn` runs (on the strand) if the client disconnects before finish()/respond() completed.
  virtual void on_disconnect(std::function<void()> fn) = 0;
};

// An Exchange that passes everything to `inner`, with a look at each response's status and headers
// before they go (the access log, CORS).
class ForwardingExchange : public Exchange {
 public:
  explicit ForwardingExchange(std::shared_ptr<Exchange> inner) : inner_(std::move(inner)) {}
  void respond(HttpResponse response) override {
    before_headers(response.status, response.headers);
    inner_->respond(std::move(response));
  }
  void start_stream(int status, std::string content_type, HeaderList headers) override {
    before_headers(status, headers);
    inner_->start_stream(status, std::move(content_type), std::move(headers));
  }
  void write(std::string data) override { inner_->write(std::move(data)); }
  void finish() override { inner_->finish(); }
  void post(std::function<void()> fn) override { inner_->post(std::move(fn)); }
  void on_disconnect(std::function<void()> fn) override { inner_->on_disconnect(std::move(fn)); }

 protected:
  virtual void before_headers(int status, HeaderList& headers) = 0;

 private:
  std::shared_ptr<Exchange> inner_;
};

// Called on the connection's strand for each complete request. It may answer at once or later.
using RequestHandler = std::function<void(HttpRequest&&, std::shared_ptr<Exchange>)>;

// Called on the connection's strand when a request's headers are in, before its body is read (`body` is
// empty). A response refuses the request: it is sent at once (before any 100 Continue), the body is never
// read into memory, and the connection closes. nullopt: the body is read and the RequestHandler called.
using HeaderCheckFn = std::function<std::optional<HttpResponse>(const HttpRequest&)>;

// Status line reason phrases and the error body for failures the HTTP layer answers itself
// (413, 431, 400 for unparseable HTTP) come from the API layer through this hook.
using ErrorBodyFn = std::function<std::string(int status, const std::string& message)>;

}  // namespace tessera::server
