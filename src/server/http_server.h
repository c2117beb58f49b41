// HTTP/1.1 server on Boost.Beast: one acceptor, a small pool of I/O threads running one
// io_context, a strand per connection (no thread per connection), keep-alive, limits on
// header and body size, read/idle and write timeouts, and chunked streaming for SSE; plain
// TCP or TLS (OpenSSL through Asio's ssl stream), with one session code path for both.
#pragma once
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "server/http_types.h"

namespace tessera::server {

// HTTPS (vLLM's --ssl-* flags, as uvicorn reads them): TLS 1.2 or later over OpenSSL. Off while certfile is empty.
struct TlsOptions {
  std::string certfile;  // PEM: the server's certificate, then its chain
  std::string keyfile;   // PEM private key (unencrypted); empty: the key is in certfile
  std::string ca_certs;  // PEM CA certificates that client certificates are verified against
  int cert_reqs = 0;     // Python's ssl.CERT_*: 0 no client certificate, 1 optional (verified if sent), 2 required
  std::string ciphers;   // OpenSSL cipher list for TLS 1.2 (empty: OpenSSL's default)
  bool enabled() const { return !certfile.empty(); }
};

// Loads the TLS files as the server will (certificate chain, key, their match, CA certificates, ciphers), and
// throws tessera::Error naming the flag and the file when one cannot be used. `tessera serve` calls it with the
// flag checks, before anything starts.
void check_tls_options(const TlsOptions& tls);

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  int port = 8000;
  int threads = 2;
  size_t max_body_bytes = 10u << 20;    // larger bodies get 413
  size_t max_header_bytes = 16u << 10;  // larger header blocks get 431
  // Time to receive one whole request (headers and body) and the longest idle keep-alive wait.
  std::chrono::milliseconds read_timeout{30000};
  // Time for one write to complete (a client that stops reading is closed).
  std::chrono::milliseconds write_timeout{60000};
  // Beyond this a new connection closes the oldest idle one (waiting for a request, or for the rest of its
  // headers or body) to make room, so idle connections never lock out /health; only when every connection
  // has a request being answered does a new one get 503 and close.
  int max_connections = 4096;
  // HTTPS when tls.enabled(): every connection starts with a TLS handshake (under read_timeout), then is served
  // as a plain one is.
  TlsOptions tls;
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, RequestHandler handler, ErrorBodyFn error_body);
  ~HttpServer();
  // Checks each request's headers before its body is read (authentication); set before start().
  void set_header_check(HeaderCheckFn check);
  // Binds and listens (throws tessera::Error naming host:port when it cannot): the port is taken at once,
  // and connections wait in the backlog until start(). `tessera serve` calls it before loading the model.
  void listen();
  // Listens (unless listen() did), then accepts and starts the threads.
  void start();
  int port() const;            // the bound port (useful with port 0)
  const char* scheme() const;  // "https" with TLS, else "http"
  // Closes the listening socket; open connections go on.
  void stop_accepting();
  // Connections open now (the connection-limit tests wait on it).
  size_t open_connections() const;
  // Stops the I/O threads (open connections are dropped) and joins them.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::server
