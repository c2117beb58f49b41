// The only translation unit that includes Boost.Beast (it is heavy to compile), and Asio's OpenSSL stream.
#include "server/http_server.h"

#include <array>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <list>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <type_traits>

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "core/error.h"
#include "core/logging.h"

namespace tessera::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// Not in the anonymous namespace: HttpServer::Impl (declared in the header) holds one.
namespace http_server_detail {

// A connection the acceptor may close to make room for a new one: one with no request being answered.
struct Evictable {
  virtual ~Evictable() = default;
  // Closes the connection on its strand if it is still idle then.
  virtual void evict_if_idle() = 0;
  std::atomic<bool> idle{true}, evicting{false};
};

struct Shared {
  HttpServerOptions options;
  RequestHandler handler;
  ErrorBodyFn error_body;
  HeaderCheckFn header_check;
  std::shared_ptr<asio::ssl::context> tls;  // null: plain HTTP
  std::atomic<size_t> connections{0};

  // Every connection, oldest first. Entries of closed connections expire and are pruned here, never by the
  // connections themselves (a destructor that locked would deadlock when the last reference dies in the walk).
  std::mutex sessions_mu;
  std::list<std::weak_ptr<Evictable>> sessions;

  void add_session(const std::shared_ptr<Evictable>& session) {
    std::lock_guard<std::mutex> lock(sessions_mu);
    if (sessions.size() > 2 * connections.load() + 64) sessions.remove_if([](const auto& w) { return w.expired(); });
    sessions.push_back(session);
  }

  // Closes the oldest idle connection (idle keep-alive, or still sending its request) so that a new one can be
  // served: idle connections must never lock out /health. False when every connection has a request in hand.
  bool evict_oldest_idle() {
    std::shared_ptr<Evictable> chosen;
    {
      std::lock_guard<std::mutex> lock(sessions_mu);
      for (auto it = sessions.begin(); it != sessions.end() && !chosen;) {
        std::shared_ptr<Evictable> s = it->lock();
        if (!s) {
          it = sessions.erase(it);
          continue;
        }
        if (s->idle.load() && !s->evicting.exchange(true)) chosen = std::move(s);
        ++it;
      }
    }
    if (chosen) chosen->evict_if_idle();
    return chosen != nullptr;
  }
};

}  // namespace http_server_detail
using http_server_detail::Evictable;
using http_server_detail::Shared;

namespace {

// The status line's reason phrase, from Beast's table ("Unknown" for a code it lacks).
std::string_view reason_phrase(int status) {
  const auto b = http::obsolete_reason(static_cast<http::status>(status));
  const std::string_view r(b.data(), b.size());
  return r == "<unknown-status>" ? std::string_view("Unknown") : r;
}

std::string head(int status, const std::string& content_type, const HeaderList& headers, bool keep_alive) {
  std::string s = fmt::format("HTTP/1.1 {} {}\r\nServer: tessera\r\nContent-Type: {}\r\nConnection: {}\r\n", status,
                              reason_phrase(status), content_type, keep_alive ? "keep-alive" : "close");
  for (const auto& [k, v] : headers) {
    // Header values come from our own code, but never let a CR/LF split the response.
    if (k.find_first_of("\r\n") != std::string::npos || v.find_first_of("\r\n") != std::string::npos) continue;
    s += k;
    s += ": ";
    s += v;
    s += "\r\n";
  }
  return s;
}

beast::string_view trim(beast::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool is_http_parse_error(const beast::error_code& ec) {
  return ec.category() == http::make_error_code(http::error::bad_target).category();
}

template <class Stream>
class Session;

template <class Stream>
class ExchangeImpl : public Exchange {
 public:
  ExchangeImpl(std::shared_ptr<Session<Stream>> s, uint64_t gen) : session_(std::move(s)), gen_(gen) {}
  void respond(HttpResponse response) override;
  void start_stream(int status, std::string content_type, HeaderList headers) override;
  void write(std::string data) override;
  void finish() override;
  void post(std::function<void()> fn) override;
  void on_disconnect(std::function<void()> fn) override;

 private:
  std::shared_ptr<Session<Stream>> session_;
  uint64_t gen_;
};

// One connection: Stream is beast::tcp_stream (HTTP) or TlsStream (HTTPS). Both go through the same code; what
// differs is the handshake before the first request and the close (TLS sends close_notify).
template <class Stream>
class Session : public Evictable, public std::enable_shared_from_this<Session<Stream>> {
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;
  using std::enable_shared_from_this<Session<Stream>>::shared_from_this;

 public:
  // `tls`: the TLS context, for a TlsStream only.
  template <class... Tls>
  Session(tcp::socket&& socket, std::shared_ptr<Shared> shared, Tls&... tls)
      : stream_(std::move(socket), tls...), sh_(std::move(shared)) {
    beast::error_code ec;
    auto ep = lowest().socket().remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
    lowest().socket().set_option(tcp::no_delay(true), ec);
  }
  ~Session() { sh_->connections--; }

  void start() {
    sh_->add_session(shared_from_this());
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      if constexpr (kTls)
        self->handshake();
      else
        self->read_header();
    });
  }
  void evict_if_idle() override {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      if (!self->in_exchange_) return self->close();
      self->evicting = false;
    });
  }
  auto executor() { return stream_.get_executor(); }
  beast::tcp_stream& lowest() { return beast::get_lowest_layer(stream_); }

  // --- exchange operations (on the strand) ---
  bool current(uint64_t gen) const { return gen == gen_ && in_exchange_ && !exchange_done_ && !closed_; }

  void respond(uint64_t gen, HttpResponse r) {
    if (!current(gen) || streaming_) return;
    std::string s = head(r.status, r.content_type, r.headers, keep_alive_);
    s += fmt::format("Content-Length: {}\r\n\r\n", r.body.size());
    if (!head_request_) s += r.body;  // RFC 9110 9.3.2: the headers a GET would get, never a body
    exchange_done_ = true;
    queue_write(std::move(s));
  }
  void start_stream(uint64_t gen, int status, const std::string& content_type, const HeaderList& headers) {
    if (!current(gen) || streaming_) return;
    streaming_ = true;
    std::string s = head(status, content_type, headers, keep_alive_);
    s += "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\n\r\n";
    queue_write(std::move(s));
  }
  void write_chunk(uint64_t gen, std::string data) {
    if (!current(gen) || !streaming_ || data.empty()) return;
    std::string s = fmt::format("{:x}\r\n", data.size());
    s += data;
    s += "\r\n";
    queue_write(std::move(s));
  }
  void finish(uint64_t gen) {
    if (!current(gen) || !streaming_) return;
    exchange_done_ = true;
    queue_write("0\r\n\r\n");
  }
  void set_on_disconnect(uint64_t gen, std::function<void()> fn) {
    if (gen != gen_) return;
    if (closed_ && in_exchange_ && !exchange_done_) {
      fn();
      return;
    }
    if (current(gen)) on_disconnect_ = std::move(fn);
  }

 private:
  void read_header() {
    if (closed_) return;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(sh_->options.max_header_bytes));
    parser_->body_limit(sh_->options.max_body_bytes);
    lowest().expires_after(sh_->options.read_timeout);
    reading_ = true;
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  bool handle_read_error(const beast::error_code& ec) {
    if (!ec) return false;
    if (ec == http::error::header_limit) {
      fail_response(431, "the request's header fields are larger than the server allows");
    } else if (ec == http::error::body_limit) {
      fail_response(413, fmt::format("the request body is larger than the server allows ({} bytes, "
                                     "--max-request-body-bytes)",
                                     sh_->options.max_body_bytes));
    } else if (is_http_parse_error(ec) && ec != http::error::end_of_stream && ec != http::error::partial_message) {
      fail_response(400, "malformed HTTP request: " + ec.message());
    } else {
      close();  // eof, timeout (slow or idle client), reset
    }
    return true;
  }

  void on_header(beast::error_code ec) {
    reading_ = false;
    if (handle_read_error(ec)) return;
    auto& req = parser_->get();
    // RFC 9112 6.3: a transfer coding other than chunked leaves the body's length unknown (reading it as
    // empty would parse the body as the next request): 400 and close. RFC 9112 3.2: HTTP/1.1 needs one Host.
    if (req.find(http::field::transfer_encoding) != req.end() &&
        !beast::iequals(trim(req[http::field::transfer_encoding]), "chunked")) {
      fail_response(400, "unsupported Transfer-Encoding (only chunked is accepted); send a Content-Length instead");
      return;
    }
    if (req.version() >= 11 && req.count(http::field::host) != 1) {
      fail_response(400, "an HTTP/1.1 request needs exactly one Host header");
      return;
    }
    // Authentication (and whatever else can be judged from the headers) before the body: a refused request's
    // body is never read into memory, and no 100 Continue invites it.
    if (sh_->header_check) {
      if (std::optional<HttpResponse> refusal = sh_->header_check(request_head(req))) {
        refuse(std::move(*refusal));
        return;
      }
    }
    auto expect = req[http::field::expect];
    if (!expect.empty()) {
      if (!beast::iequals(expect, "100-continue")) {
        fail_response(417, "unsupported Expect header (only 100-continue)");
        return;
      }
      // The client waits for this before sending a large body.
      continue_buf_ = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(stream_, asio::buffer(continue_buf_),
                        [self = shared_from_this()](beast::error_code ec2, size_t) {
                          if (ec2) return self->close();
                          self->read_body();
                        });
      return;
    }
    read_body();
  }

  void read_body() {
    if (parser_->is_done()) return dispatch_request();
    lowest().expires_after(sh_->options.read_timeout);  // for the whole body, not each read
    parse_body();
  }

  // The body is parsed here rather than by http::async_read, so that a chunked body's trailer is bounded
  // and answered: Beast keeps field sizes in 16 bits and throws std::length_error for a trailer field of
  // 64 KiB or more, which escaped the read and dropped the connection unanswered.
  void parse_body() {
    beast::error_code ec;
    try {
      while (buffer_.size() > 0 && !parser_->is_done()) {
        const size_t used = parser_->put(buffer_.data(), ec);
        buffer_.consume(used);
        if (ec == http::error::need_more) ec = {};
        if (ec || used == 0) break;
      }
    } catch (const std::length_error&) {
      return fail_response(431, "a trailer field of the chunked request body is larger than the server allows");
    }
    if (handle_read_error(ec)) return;
    if (parser_->is_done()) return dispatch_request();
    // Body bytes are consumed as they come; what stays is an unfinished chunk header or trailer, bounded
    // as the header block is.
    if (buffer_.size() > sh_->options.max_header_bytes)
      return fail_response(431, "a chunk header or trailer of the request body is larger than the server allows");
    reading_ = true;
    stream_.async_read_some(buffer_.prepare(64u << 10), [self = shared_from_this()](beast::error_code ec2, size_t n) {
      self->reading_ = false;
      if (ec2 == asio::error::eof && self->parser_->got_some()) ec2 = http::error::partial_message;
      if (self->handle_read_error(ec2)) return;
      self->buffer_.commit(n);
      self->parse_body();
    });
  }

  // The request line and header fields as the API layer sees them (names in lower case); no body.
  HttpRequest request_head(const http::request<http::string_body>& msg) const {
    HttpRequest r;
    r.method = std::string(msg.method_string());
    std::string target(msg.target());
    if (auto q = target.find('?'); q != std::string::npos) {
      r.query = target.substr(q + 1);
      target.resize(q);
    }
    r.path = std::move(target);
    for (const auto& f : msg) {
      std::string name(f.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      r.headers.emplace_back(std::move(name), std::string(f.value()));
    }
    r.remote = remote_;
    return r;
  }

  void dispatch_request() {
    auto msg = parser_->release();
    parser_.reset();
    HttpRequest r = request_head(msg);
    r.body = std::move(msg.body());
    head_request_ = msg.method() == http::verb::head;
    keep_alive_ = msg.keep_alive();
    idle = false;
    in_exchange_ = true;
    exchange_done_ = false;
    streaming_ = false;
    ++gen_;
    lowest().expires_never();  // generation may take long; writes set their own deadline
    watch();
    auto ex = std::make_shared<ExchangeImpl<Stream>>(shared_from_this(), gen_);
    try {
      sh_->handler(std::move(r), ex);
    } catch (const std::exception& e) {
      TLOG_ERROR("request handler failed: {}", e.what());
      respond(gen_, HttpResponse{500, "application/json", {}, sh_->error_body(500, "internal error")});
    }
  }

  // HTTPS: the TLS handshake under the read timeout, then the first request. A client that speaks plain HTTP
  // to the TLS port, or fails the handshake (a required client certificate missing), is closed.
  void handshake() {
    lowest().expires_after(sh_->options.read_timeout);
    reading_ = true;
    stream_.async_handshake(asio::ssl::stream_base::server, [self = shared_from_this()](beast::error_code ec) {
      self->reading_ = false;
      if (ec) {
        TLOG_DEBUG("TLS handshake with {} failed: {}", self->remote_, ec.message());
        return self->close();
      }
      self->read_header();
    });
  }

  // While a request is handled a pending read notices a disconnect at once. What the client sends
  // meanwhile (pipelined requests) is kept in the buffer, up to kWatchBuffer bytes. Past that the
  // connection is marked to close after this answer (the requests behind it go unanswered, which
  // HTTP/1.1 clients retry), the kept bytes are dropped and the socket is read on, discarding, to its
  // end: no number of pipelined bytes can hide a hang-up behind them (a FIN is only seen once every
  // byte before it has been read).
  static constexpr size_t kWatchBuffer = 64u << 10;
  void watch() {
    if (reading_ || closed_) return;
    if (!discarding_ && buffer_.size() >= kWatchBuffer) {
      keep_alive_ = false;
      buffer_.consume(buffer_.size());
      discarding_ = true;
    }
    reading_ = true;
    auto on_read = [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->reading_ = false;
      const AfterCancel after = self->after_cancel_;
      self->after_cancel_ = AfterCancel::kNone;
      if (after == AfterCancel::kDrain) {  // lingering_close cancelled it; what it read is discarded
        if (ec && ec != asio::error::operation_aborted) return self->close();
        return self->drain_more();
      }
      if (ec == asio::error::operation_aborted && after == AfterCancel::kReadHeader && !self->closed_) {
        self->read_header();  // cancelled by exchange_complete: read the next request under the idle timeout
        return;
      }
      if (ec) {
        self->close();
        return;
      }
      if (!self->discarding_) self->buffer_.commit(n);
      if (self->closed_) return;
      if (!self->in_exchange_) return self->read_header();  // the next keep-alive request began
      // A pipelined request: it waits in the buffer until this exchange completes; keep watching.
      if (!self->exchange_done_) self->watch();
    };
    if (discarding_) {
      stream_.async_read_some(asio::buffer(discard_), std::move(on_read));
    } else {
      stream_.async_read_some(buffer_.prepare(4096), std::move(on_read));
    }
  }

  void exchange_complete() {
    in_exchange_ = false;
    idle = true;
    on_disconnect_ = nullptr;
    if (!keep_alive_) return lingering_close();
    if (!reading_) return read_header();  // read_header sets the idle keep-alive limit
    // The pending watch read runs without a deadline (a new expiry does not reach an operation already
    // started); cancel it, and its handler starts read_header.
    after_cancel_ = AfterCancel::kReadHeader;
    beast::error_code ec;
    lowest().socket().cancel(ec);
  }

  void queue_write(std::string s) {
    if (closed_) return;
    outbuf_ += s;
    if (!writing_) do_write();
  }
  void do_write() {
    writing_ = true;
    wbuf_.swap(outbuf_);
    outbuf_.clear();
    lowest().expires_after(sh_->options.write_timeout);
    asio::async_write(stream_, asio::buffer(wbuf_),
                      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }
  void on_write(beast::error_code ec) {
    writing_ = false;
    wbuf_.clear();
    if (ec) return close();
    if (!outbuf_.empty()) return do_write();
    if (closing_after_write_) return lingering_close();
    if (in_exchange_) {
      if (exchange_done_)
        exchange_complete();
      else
        lowest().expires_never();
    }
  }

  // Errors the HTTP layer answers itself; the connection closes afterwards.
  void fail_response(int status, const std::string& message) {
    keep_alive_ = false;
    closing_after_write_ = true;
    std::string body = sh_->error_body(status, message);
    std::string s = head(status, "application/json", {}, false);
    s += fmt::format("Content-Length: {}\r\n\r\n", body.size());
    s += body;
    queue_write(std::move(s));
  }

  // A request the header check refused: its answer, then the connection closes without reading the body.
  void refuse(HttpResponse r) {
    keep_alive_ = false;
    closing_after_write_ = true;
    std::string s = head(r.status, r.content_type, r.headers, false);
    s += fmt::format("Content-Length: {}\r\n\r\n", r.body.size());
    s += r.body;
    queue_write(std::move(s));
  }

  // Half-close and drain what the client still sends (bounded), so it reads our answer instead of a reset. TLS:
  // close_notify, then the client's (what it sends before is discarded), bounded by the same 2 s.
  void lingering_close() {
    if (closed_) return;
    beast::error_code ec;
    if constexpr (!kTls) lowest().socket().shutdown(tcp::socket::shutdown_send, ec);
    lowest().expires_after(std::chrono::seconds(2));
    if (reading_) {
      // The watch read is still pending (a stream allows one read at a time): cancel it; its handler drains.
      after_cancel_ = AfterCancel::kDrain;
      lowest().socket().cancel(ec);
      return;
    }
    drain_more();
  }
  void drain_more() {
    if (closed_ || drained_ > (64u << 20)) return close();
    reading_ = true;
    if constexpr (kTls) {
      stream_.async_shutdown([self = shared_from_this()](beast::error_code) {
        self->reading_ = false;
        self->close();
      });
      return;
    }
    stream_.async_read_some(asio::buffer(discard_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->reading_ = false;
      if (ec) return self->close();
      self->drained_ += n;
      self->drain_more();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    lowest().socket().shutdown(tcp::socket::shutdown_both, ec);
    lowest().close();
    if (in_exchange_ && !exchange_done_) {
      auto fn = std::move(on_disconnect_);
      on_disconnect_ = nullptr;
      if (fn) fn();
    }
    on_disconnect_ = nullptr;
  }

  Stream stream_;
  std::shared_ptr<Shared> sh_;
  std::string remote_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string continue_buf_, outbuf_, wbuf_;
  std::array<char, 16384> discard_{};
  size_t drained_ = 0;
  uint64_t gen_ = 0;
  bool reading_ = false, writing_ = false, closed_ = false;
  bool in_exchange_ = false, exchange_done_ = false, streaming_ = false;
  bool keep_alive_ = true, closing_after_write_ = false, head_request_ = false, discarding_ = false;
  // What the handler of a deliberately cancelled watch read does next.
  enum class AfterCancel { kNone, kReadHeader, kDrain } after_cancel_ = AfterCancel::kNone;
  std::function<void()> on_disconnect_;
};

template <class Stream>
void ExchangeImpl<Stream>::respond(HttpResponse response) {
  asio::dispatch(session_->executor(),
                 [s = session_, g = gen_, r = std::move(response)]() mutable { s->respond(g, std::move(r)); });
}
template <class Stream>
void ExchangeImpl<Stream>::start_stream(int status, std::string content_type, HeaderList headers) {
  asio::dispatch(session_->executor(), [s = session_, g = gen_, status, ct = std::move(content_type),
                                        h = std::move(headers)] { s->start_stream(g, status, ct, h); });
}
template <class Stream>
void ExchangeImpl<Stream>::write(std::string data) {
  asio::dispatch(session_->executor(),
                 [s = session_, g = gen_, d = std::move(data)]() mutable { s->write_chunk(g, std::move(d)); });
}
template <class Stream>
void ExchangeImpl<Stream>::finish() {
  asio::dispatch(session_->executor(), [s = session_, g = gen_] { s->finish(g); });
}
template <class Stream>
void ExchangeImpl<Stream>::post(std::function<void()> fn) {
  asio::post(session_->executor(), std::move(fn));
}
template <class Stream>
void ExchangeImpl<Stream>::on_disconnect(std::function<void()> fn) {
  asio::dispatch(session_->executor(),
                 [s = session_, g = gen_, f = std::move(fn)]() mutable { s->set_on_disconnect(g, std::move(f)); });
}

// The reason of OpenSSL's first queued error (the root cause; the ones after it wrap it), and the queue cleared.
std::string openssl_reason() {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  const char* r = e ? ERR_reason_error_string(e) : nullptr;
  return r ? r : "unknown OpenSSL error";
}

// A file a TLS flag names must be readable: the error names the flag, the file and why.
void check_readable(const char* flag, const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in)
    fail(ErrorKind::kInvalidArgument, "{} {}: cannot read the file ({}); give {}", flag, path, std::strerror(errno),
         what);
}

[[noreturn]] void key_mismatch(const TlsOptions& tls, const std::string& why) {
  fail(ErrorKind::kInvalidArgument,
       "--ssl-keyfile {}: the key does not match the certificate of --ssl-certfile {} ({}); give the key the "
       "certificate was issued for",
       tls.keyfile.empty() ? tls.certfile : tls.keyfile, tls.certfile, why);
}

// OpenSSL asks for a passphrase only for an encrypted key: none is given, and the load fails saying so.
int no_passphrase(char*, int, int, void* asked) {
  *static_cast<bool*>(asked) = true;
  return 0;
}

void load_key(SSL_CTX* ctx, const TlsOptions& tls) {
  const char* flag = tls.keyfile.empty() ? "--ssl-certfile" : "--ssl-keyfile";
  const std::string& path = tls.keyfile.empty() ? tls.certfile : tls.keyfile;
  if (!tls.keyfile.empty()) check_readable(flag, path, "the PEM file of the certificate's private key");
  bool asked = false;
  SSL_CTX_set_default_passwd_cb(ctx, no_passphrase);
  SSL_CTX_set_default_passwd_cb_userdata(ctx, &asked);
  const int ok = SSL_CTX_use_PrivateKey_file(ctx, path.c_str(), SSL_FILETYPE_PEM);
  SSL_CTX_set_default_passwd_cb_userdata(ctx, nullptr);
  if (ok == 1) return;
  const unsigned long first = ERR_peek_error();
  const std::string why = openssl_reason();
  // A key of the certificate's type is checked against it as it loads.
  if (ERR_GET_LIB(first) == ERR_LIB_X509 && ERR_GET_REASON(first) == X509_R_KEY_VALUES_MISMATCH) key_mismatch(tls, why);
  if (asked)
    fail(ErrorKind::kInvalidArgument,
         "{} {}: the private key is encrypted; decrypt it (openssl pkey -in {} -out key.pem) and give that file", flag,
         path, path);
  if (tls.keyfile.empty())
    fail(ErrorKind::kInvalidArgument, "--ssl-certfile {}: holds no private key ({}); give the key with --ssl-keyfile",
         path, why);
  fail(ErrorKind::kInvalidArgument, "--ssl-keyfile {}: not a PEM private key ({}); give the certificate's private key",
       path, why);
}

// The server's TLS context from the --ssl-* flags; every failure names its flag and file.
std::shared_ptr<asio::ssl::context> make_tls_context(const TlsOptions& tls) {
  if (tls.cert_reqs < 0 || tls.cert_reqs > 2)
    fail(ErrorKind::kInvalidArgument,
         "--ssl-cert-reqs {}: use 0 (no client certificate), 1 (optional, verified if sent) or 2 (required)",
         tls.cert_reqs);
  if (tls.cert_reqs > 0 && tls.ca_certs.empty())
    fail(ErrorKind::kInvalidArgument,
         "--ssl-cert-reqs {} verifies client certificates: give the CA certificates to verify them against with "
         "--ssl-ca-certs",
         tls.cert_reqs);
  auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_server);
  SSL_CTX* native = ctx->native_handle();
  ERR_clear_error();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::single_dh_use);
  check_readable("--ssl-certfile", tls.certfile, "the server's PEM certificate (its chain after it)");
  if (SSL_CTX_use_certificate_chain_file(native, tls.certfile.c_str()) != 1)
    fail(ErrorKind::kInvalidArgument,
         "--ssl-certfile {}: not a PEM certificate ({}); give the server's certificate (its chain after it)",
         tls.certfile, openssl_reason());
  load_key(native, tls);
  if (SSL_CTX_check_private_key(native) != 1) key_mismatch(tls, openssl_reason());
  if (!tls.ca_certs.empty()) {
    check_readable("--ssl-ca-certs", tls.ca_certs, "a PEM file of CA certificates");
    if (SSL_CTX_load_verify_locations(native, tls.ca_certs.c_str(), nullptr) != 1)
      fail(ErrorKind::kInvalidArgument,
           "--ssl-ca-certs {}: no PEM CA certificate in it ({}); give the CA certificates that client "
           "certificates are verified against",
           tls.ca_certs, openssl_reason());
  }
  if (!tls.ciphers.empty() && SSL_CTX_set_cipher_list(native, tls.ciphers.c_str()) != 1)
    fail(ErrorKind::kInvalidArgument,
         "--ssl-ciphers {}: no cipher OpenSSL knows matches it ({}); use an OpenSSL cipher list such as "
         "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-CHACHA20-POLY1305",
         tls.ciphers, openssl_reason());
  const int verify = tls.cert_reqs == 0   ? SSL_VERIFY_NONE
                     : tls.cert_reqs == 1 ? SSL_VERIFY_PEER
                                          : SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
  SSL_CTX_set_verify(native, verify, nullptr);
  static const unsigned char kSessionContext[] = "tessera";
  SSL_CTX_set_session_id_context(native, kSessionContext, sizeof kSessionContext - 1);
  return ctx;
}

}  // namespace

struct HttpServer::Impl {
  std::shared_ptr<Shared> sh = std::make_shared<Shared>();
  asio::io_context ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  int port = 0;

  void do_accept() {
    acceptor->async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor->is_open()) return;
      if (ec) {
        // Out of descriptors and the like: log, pause briefly, keep accepting.
        TLOG_WARN("accept failed: {}", ec.message());
        auto timer = std::make_shared<asio::steady_timer>(acceptor->get_executor(), std::chrono::milliseconds(50));
        timer->async_wait([this, timer](beast::error_code) {
          if (acceptor->is_open()) do_accept();
        });
        return;
      }
      if (sh->connections.load() >= static_cast<size_t>(sh->options.max_connections) && !sh->evict_oldest_idle()) {
        if (sh->tls) {  // an answer would need a handshake first: close
          beast::error_code e;
          socket.close(e);
          return do_accept();
        }
        auto sock = std::make_shared<tcp::socket>(std::move(socket));
        std::string body = sh->error_body(503, "too many open connections; retry later");
        auto msg = std::make_shared<std::string>(head(503, "application/json", {{"Retry-After", "1"}}, false) +
                                                 fmt::format("Content-Length: {}\r\n\r\n", body.size()) + body);
        asio::async_write(*sock, asio::buffer(*msg), [sock, msg](beast::error_code, size_t) {
          beast::error_code e;
          sock->shutdown(tcp::socket::shutdown_both, e);
          sock->close(e);
        });
      } else {
        sh->connections++;
        if (sh->tls)
          std::make_shared<Session<TlsStream>>(std::move(socket), sh, *sh->tls)->start();
        else
          std::make_shared<Session<beast::tcp_stream>>(std::move(socket), sh)->start();
      }
      do_accept();
    });
  }
};

HttpServer::HttpServer(HttpServerOptions options, RequestHandler handler, ErrorBodyFn error_body)
    : impl_(std::make_unique<Impl>()) {
  impl_->sh->options = std::move(options);
  impl_->sh->handler = std::move(handler);
  impl_->sh->error_body = std::move(error_body);
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::set_header_check(HeaderCheckFn check) { impl_->sh->header_check = std::move(check); }

void HttpServer::listen() {
  auto& o = impl_->sh->options;
  if (o.tls.enabled() && !impl_->sh->tls) impl_->sh->tls = make_tls_context(o.tls);
  beast::error_code ec;
  tcp::resolver resolver(impl_->ioc);
  auto results = resolver.resolve(o.host, std::to_string(o.port), ec);
  if (ec || results.empty())
    fail(ErrorKind::kNetwork, "cannot resolve --host {}: {}", o.host, ec ? ec.message() : "no address");
  tcp::endpoint ep = results.begin()->endpoint();
  impl_->acceptor.emplace(asio::make_strand(impl_->ioc));
  auto& a = *impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    fail(ErrorKind::kNetwork, "cannot listen on {}:{}: {} (is another server using the port? pick one with --port)",
         o.host, o.port, ec.message());
  impl_->port = a.local_endpoint().port();
  // Bound before the model loads, so rank processes spawned since must not inherit (and hold) the port.
  ::fcntl(a.native_handle(), F_SETFD, FD_CLOEXEC);
}

void HttpServer::start() {
  if (!impl_->acceptor) listen();
  auto& o = impl_->sh->options;
  impl_->work.emplace(impl_->ioc.get_executor());
  impl_->do_accept();
  for (int i = 0; i < std::max(1, o.threads); ++i) {
    impl_->threads.emplace_back([this] {
      for (;;) {
        try {
          impl_->ioc.run();
          return;
        } catch (const std::exception& e) {
          TLOG_ERROR("HTTP I/O thread caught: {}; continuing", e.what());
        }
      }
    });
  }
}

int HttpServer::port() const { return impl_->port; }

const char* HttpServer::scheme() const { return impl_->sh->options.tls.enabled() ? "https" : "http"; }

void check_tls_options(const TlsOptions& tls) { (void)make_tls_context(tls); }

size_t HttpServer::open_connections() const { return impl_->sh->connections.load(); }

void HttpServer::stop_accepting() {
  if (!impl_->acceptor) return;
  auto done = std::make_shared<std::promise<void>>();
  auto f = done->get_future();
  asio::post(impl_->acceptor->get_executor(), [this, done] {
    beast::error_code ec;
    impl_->acceptor->close(ec);
    done->set_value();
  });
  if (!impl_->threads.empty()) f.wait_for(std::chrono::seconds(2));
}

void HttpServer::stop() {
  if (impl_->threads.empty()) return;
  impl_->work.reset();
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace tessera::server
