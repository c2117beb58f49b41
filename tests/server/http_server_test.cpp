// The HTTP layer alone, with a stub handler: keep-alive, limits (413, 431, 400), chunked
// streaming, disconnect notification, HTTPS (certificates made here, an OpenSSL client), metrics text. The full API is
// tested through the real binary (tests/integration/server_*.sh, tests/node/server_*.test.mjs).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/async_engine.h"
#include "server/api_server.h"
#include "server/http_server.h"
#include "server/metrics.h"

namespace tessera::server {
namespace {

int connect_to(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

void send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Reads until `until` appears, the peer closes, or 5 s pass.
std::string read_until(int fd, const std::string& until) {
  std::string out;
  char buf[4096];
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    if (!until.empty() && out.find(until) != std::string::npos) break;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

struct Fixture : ::testing::Test {
  std::atomic<int> disconnects{0}, handled{0};
  std::unique_ptr<HttpServer> server;
  void SetUp() override { start(options()); }
  static HttpServerOptions options() {
    HttpServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.threads = 2;
    o.max_body_bytes = 1000;
    o.max_header_bytes = 2048;
    o.read_timeout = std::chrono::milliseconds(1000);
    return o;
  }
  // /secret needs an Authorization header (checked before the body); /hold is never answered.
  void start(const HttpServerOptions& o) {
    if (server) server->stop();
    server = std::make_unique<HttpServer>(
        o,
        [this](HttpRequest&& r, std::shared_ptr<Exchange> ex) {
          handled++;
          if (r.path == "/hold") {
            ex->on_disconnect([this] { disconnects++; });
            return;
          }
          if (r.path == "/stream") {
            ex->on_disconnect([this] { disconnects++; });
            ex->start_stream(200, "text/event-stream", {});
            ex->write("data: 1\n\n");
            if (r.query == "finish") {
              ex->write("data: [DONE]\n\n");
              ex->finish();
            }
            return;  // else: left open until the client goes away
          }
          ex->respond(HttpResponse{200, "text/plain", {}, r.method + " " + r.path + " " + r.body});
        },
        &ApiServer::error_body);
    server->set_header_check([](const HttpRequest& r) -> std::optional<HttpResponse> {
      if (r.path != "/secret" || r.header("authorization")) return std::nullopt;
      return HttpResponse{401, "application/json", {}, R"({"error": "key"})"};
    });
    server->start();
  }
  void wait_for(const std::atomic<int>& counter, int value) {
    for (int i = 0; i < 300 && counter.load() < value; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  void TearDown() override { server->stop(); }
};

TEST_F(Fixture, KeepAliveServesSeveralRequests) {
  int fd = connect_to(server->port());
  ASSERT_GE(fd, 0);
  send_all(fd, "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc");
  std::string r1 = read_until(fd, "POST /a abc");
  EXPECT_NE(r1.find("HTTP/1.1 200 OK"), std::string::npos);
  EXPECT_NE(r1.find("Connection: keep-alive"), std::string::npos);
  send_all(fd, "GET /b HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(read_until(fd, "GET /b ").find("GET /b "), std::string::npos);
  close(fd);
}

TEST_F(Fixture, BodyOverTheLimitIs413) {
  int fd = connect_to(server->port());
  send_all(fd, "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n");
  std::string r = read_until(fd, "}}");
  EXPECT_EQ(r.rfind("HTTP/1.1 413 ", 0), 0u) << r;
  EXPECT_NE(r.find("\"error\""), std::string::npos);
  close(fd);
}

TEST_F(Fixture, HeadersOverTheLimitAre431) {
  int fd = connect_to(server->port());
  send_all(fd, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(4000, 'a') + "\r\n\r\n");
  std::string r = read_until(fd, "}}");
  EXPECT_EQ(r.rfind("HTTP/1.1 431 ", 0), 0u) << r;
  close(fd);
}

TEST_F(Fixture, GarbageIs400) {
  int fd = connect_to(server->port());
  send_all(fd, "\x01\x02 garbage\r\n\r\n");
  std::string r = read_until(fd, "}}");
  EXPECT_EQ(r.rfind("HTTP/1.1 400 ", 0), 0u) << r;
  close(fd);
}

TEST_F(Fixture, IncompleteRequestIsClosedByTheReadTimeout) {
  int fd = connect_to(server->port());
  send_all(fd, "GET / HTTP/1.1\r\nHost:");
  const auto t0 = std::chrono::steady_clock::now();
  std::string r = read_until(fd, "");
  EXPECT_EQ(r, "");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(3000));
  close(fd);
}

TEST_F(Fixture, StreamIsChunkedAndEnds) {
  int fd = connect_to(server->port());
  send_all(fd, "GET /stream?finish HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string r = read_until(fd, "0\r\n\r\n");
  EXPECT_NE(r.find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_NE(r.find("X-Accel-Buffering: no"), std::string::npos);
  EXPECT_NE(r.find("9\r\ndata: 1\n\n\r\n"), std::string::npos) << r;
  EXPECT_NE(r.find("e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"), std::string::npos) << r;
  close(fd);
  EXPECT_EQ(disconnects.load(), 0);
}

TEST_F(Fixture, DisconnectMidStreamIsReported) {
  int fd = connect_to(server->port());
  send_all(fd, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
  read_until(fd, "data: 1");
  close(fd);
  for (int i = 0; i < 200 && disconnects.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(disconnects.load(), 1);
}

// A request without a valid key is answered 401 right after its headers: its body is never awaited (the
// read timeout would have closed the connection without an answer), the handler never runs, and the
// connection closes.
TEST_F(Fixture, RefusedHeadersAreAnsweredBeforeTheBody) {
  int fd = connect_to(server->port());
  const auto t0 = std::chrono::steady_clock::now();
  send_all(fd, "POST /secret HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\nonly part of the body");
  std::string r = read_until(fd, "");  // until the server closes
  EXPECT_EQ(r.rfind("HTTP/1.1 401 ", 0), 0u) << r;
  EXPECT_NE(r.find("Connection: close"), std::string::npos) << r;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(900));
  close(fd);
  // With Expect: 100-continue the client is never invited to send the body.
  fd = connect_to(server->port());
  send_all(fd, "POST /secret HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\nExpect: 100-continue\r\n\r\n");
  r = read_until(fd, "");
  EXPECT_EQ(r.rfind("HTTP/1.1 401 ", 0), 0u) << r;
  EXPECT_EQ(r.find("100 Continue"), std::string::npos) << r;
  close(fd);
  EXPECT_EQ(handled.load(), 0);
  // With the header the request goes through.
  fd = connect_to(server->port());
  send_all(fd, "POST /secret HTTP/1.1\r\nHost: x\r\nAuthorization: k\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_NE(read_until(fd, "POST /secret abc").find("200 OK"), std::string::npos);
  close(fd);
}

// A request followed by more pipelined bytes than the server keeps, then a disconnect: the hang-up sits behind
// those bytes (a FIN is delivered after the data before it, which a full receive window holds back), so the
// server must read on to see it. Before, the watch stopped reading at 64 KiB and the request ran on.
TEST_F(Fixture, DisconnectBehindPipelinedBytesIsReported) {
  int fd = connect_to(server->port());
  send_all(fd, "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
  wait_for(handled, 1);
  ASSERT_EQ(handled.load(), 1);
  const std::string filler(64 << 10, 'x');
  size_t sent = 0;
  for (int i = 0; i < 256; ++i) {  // until the socket buffers are full: up to 16 MiB
    ssize_t n = ::send(fd, filler.data(), filler.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  EXPECT_GT(sent, size_t{200} << 10);
  close(fd);
  wait_for(disconnects, 1);
  EXPECT_EQ(disconnects.load(), 1);
}

// Idle connections (here every slot, none of them sending a request) do not lock out /health: a new
// connection closes the oldest idle one. Before, past max_connections every new connection got 503.
TEST_F(Fixture, IdleConnectionsNeverLockOutHealth) {
  HttpServerOptions o = options();
  o.max_connections = 4;
  o.read_timeout = std::chrono::milliseconds(30000);  // the idle ones would otherwise time out
  start(o);
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(connect_to(server->port()));
  for (int i = 0; i < 300 && server->open_connections() < 4; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(server->open_connections(), 4u);
  int fd = connect_to(server->port());
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string r = read_until(fd, "GET /health ");
  EXPECT_EQ(r.rfind("HTTP/1.1 200 ", 0), 0u) << r;
  close(fd);
  // The oldest idle connection was closed to make room.
  char byte;
  EXPECT_EQ(recv(idle[0], &byte, 1, 0), 0);
  // Connections with a request in hand are never closed for room: with all four held, a new one gets 503.
  // The idle ones close first and the server sees them go; otherwise a new connection whose request is still
  // unread counts as idle and may be the one closed for room.
  for (int c : idle) close(c);
  for (int i = 0; i < 300 && server->open_connections() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(server->open_connections(), 0u);
  for (int k = 0; k < 4; ++k) {
    idle[k] = connect_to(server->port());
    send_all(idle[k], "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n");
    wait_for(handled, 2 + k);
    ASSERT_EQ(handled.load(), 2 + k);
  }
  ASSERT_EQ(server->open_connections(), 4u);
  fd = connect_to(server->port());
  send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(read_until(fd, "}}").rfind("HTTP/1.1 503 ", 0), 0u);
  close(fd);
  for (int c : idle) close(c);
}

// A chunked body whose trailer is 64 KiB or more is answered (431 or 400) and closed, not left unanswered.
TEST_F(Fixture, LargeChunkedTrailerIsAnswered) {
  int fd = connect_to(server->port());
  send_all(fd, "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Trailer: " +
                   std::string(70000, 'a') + "\r\n\r\n");
  std::string r = read_until(fd, "}}");
  EXPECT_TRUE(r.rfind("HTTP/1.1 431 ", 0) == 0 || r.rfind("HTTP/1.1 400 ", 0) == 0) << r.substr(0, 200);
  close(fd);
  EXPECT_EQ(handled.load(), 0);
}

FinishedRequest finished(const char* reason, double e2e, double ttft, int tokens) {
  FinishedRequest r;
  r.finish_reason = reason;
  r.e2e = e2e;
  r.ttft = ttft > 0 ? ttft : -1;
  r.generation_tokens = tokens;
  r.prompt_tokens = 7;
  r.max_tokens = 16;
  r.queue = 0.01;
  return r;
}

// ---- HTTPS -----------------------------------------------------------------------------------------

// A self-signed EC P-256 certificate for localhost and 127.0.0.1, as PEM files DIR/NAME.crt and DIR/NAME.key
// (the key encrypted with "pw" when `encrypted`).
void write_certificate(const std::string& dir, const std::string& name, bool encrypted = false) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), static_cast<long>(std::hash<std::string>{}(name)&0xffffff));
  X509_gmtime_adj(X509_getm_notBefore(x), -60);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600);
  X509_set_pubkey(x, key);
  X509_NAME* subject = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1,
                             0);
  X509_set_issuer_name(x, subject);
  X509V3_CTX v3;
  X509V3_set_ctx_nodb(&v3);
  X509V3_set_ctx(&v3, x, x, nullptr, nullptr, 0);
  for (auto [nid, value] : {std::pair{NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1"},
                            std::pair{NID_basic_constraints, "critical,CA:TRUE"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &v3, nid, value);
    X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
  }
  X509_sign(x, key, EVP_sha256());
  FILE* f = std::fopen((dir + "/" + name + ".crt").c_str(), "w");
  PEM_write_X509(f, x);
  std::fclose(f);
  f = std::fopen((dir + "/" + name + ".key").c_str(), "w");
  unsigned char pw[] = "pw";
  PEM_write_PrivateKey(f, key, encrypted ? EVP_aes_128_cbc() : nullptr, encrypted ? pw : nullptr, encrypted ? 2 : 0,
                       nullptr, nullptr);
  std::fclose(f);
  X509_free(x);
  EVP_PKEY_free(key);
}

// A blocking TLS client over connect_to(): verifies the server against `ca`, presents NAME.crt/.key if given.
struct TlsClient {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL* ssl = nullptr;
  int fd = -1;
  bool closed_cleanly = false;  // the server's close_notify arrived

  ~TlsClient() {
    if (ssl) SSL_free(ssl);
    SSL_CTX_free(ctx);
    if (fd >= 0) close(fd);
  }
  bool connect(int port, const std::string& ca, const std::string& cert = "", const std::string& key = "") {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    if (SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr) != 1) return false;
    if (!cert.empty() && (SSL_CTX_use_certificate_file(ctx, cert.c_str(), SSL_FILETYPE_PEM) != 1 ||
                          SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1))
      return false;
    fd = connect_to(port);
    if (fd < 0) return false;
    ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    SSL_set_tlsext_host_name(ssl, "localhost");
    SSL_set1_host(ssl, "localhost");
    return SSL_connect(ssl) == 1;
  }
  void send(const std::string& s) { SSL_write(ssl, s.data(), static_cast<int>(s.size())); }
  std::string read_until(const std::string& until) {
    std::string out;
    char buf[4096];
    while (until.empty() || out.find(until) == std::string::npos) {
      const int n = SSL_read(ssl, buf, sizeof buf);
      if (n <= 0) {
        closed_cleanly = SSL_get_error(ssl, n) == SSL_ERROR_ZERO_RETURN;
        break;
      }
      out.append(buf, static_cast<size_t>(n));
    }
    ERR_clear_error();
    return out;
  }
};

struct Tls : Fixture {
  std::string dir;
  void SetUp() override {
    char tmpl[] = "/tmp/tessera-tls-test.XXXXXX";
    dir = mkdtemp(tmpl);
    write_certificate(dir, "server");
    write_certificate(dir, "other");
    write_certificate(dir, "client");
    write_certificate(dir, "locked", /*encrypted=*/true);
    start_tls(tls_options());
  }
  void TearDown() override {
    Fixture::TearDown();
    std::filesystem::remove_all(dir);
  }
  TlsOptions tls_options() const { return TlsOptions{dir + "/server.crt", dir + "/server.key", "", 0, ""}; }
  void start_tls(const TlsOptions& tls) {
    HttpServerOptions o = options();
    o.tls = tls;
    start(o);
  }
  // The message check_tls_options throws for `tls`, or "" when it accepts the files.
  static std::string tls_error(const TlsOptions& tls) {
    try {
      check_tls_options(tls);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(Tls, ServesKeepAliveStreamsAndClosesWithCloseNotify) {
  EXPECT_STREQ(server->scheme(), "https");
  TlsClient c;
  ASSERT_TRUE(c.connect(server->port(), dir + "/server.crt"));
  c.send("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_NE(c.read_until("POST /a abc").find("HTTP/1.1 200 OK"), std::string::npos);
  c.send("GET /stream?finish HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string stream = c.read_until("0\r\n\r\n");
  EXPECT_NE(stream.find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_NE(stream.find("data: [DONE]"), std::string::npos);
  // A refused request (the header check's 401) and Connection: close end with TLS's close_notify.
  c.send("GET /secret HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string last = c.read_until("");
  EXPECT_NE(last.find("HTTP/1.1 401"), std::string::npos) << last;
  EXPECT_TRUE(c.closed_cleanly);
  EXPECT_EQ(handled.load(), 2);
}

TEST_F(Tls, PlainHttpToTheTlsPortGetsNoAnswer) {
  int fd = connect_to(server->port());
  ASSERT_GE(fd, 0);
  send_all(fd, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(read_until(fd, "").find("HTTP/1.1"), std::string::npos);
  close(fd);
  EXPECT_EQ(handled.load(), 0);
  // The server goes on serving TLS clients.
  TlsClient c;
  ASSERT_TRUE(c.connect(server->port(), dir + "/server.crt"));
  c.send("GET /b HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(c.read_until("GET /b").find("200 OK"), std::string::npos);
}

TEST_F(Tls, RequiredClientCertificatesAreVerified) {
  TlsOptions tls = tls_options();
  tls.ca_certs = dir + "/client.crt";
  tls.cert_reqs = 2;
  start_tls(tls);
  {
    TlsClient with;
    ASSERT_TRUE(with.connect(server->port(), dir + "/server.crt", dir + "/client.crt", dir + "/client.key"));
    with.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_NE(with.read_until("GET /a").find("200 OK"), std::string::npos);
  }
  for (const char* cert : {"", "other"}) {  // none, and one no CA given signed
    TlsClient c;
    const std::string crt = *cert ? dir + "/" + cert + ".crt" : "", key = *cert ? dir + "/" + cert + ".key" : "";
    if (c.connect(server->port(), dir + "/server.crt", crt, key)) {  // TLS 1.3: refused after the client's Finished
      c.send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
      EXPECT_EQ(c.read_until("GET /a").find("200 OK"), std::string::npos) << cert;
    }
  }
  EXPECT_EQ(handled.load(), 1);
  // Optional: a client without a certificate is served.
  tls.cert_reqs = 1;
  start_tls(tls);
  TlsClient without;
  ASSERT_TRUE(without.connect(server->port(), dir + "/server.crt"));
  without.send("GET /b HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(without.read_until("GET /b").find("200 OK"), std::string::npos);
}

TEST_F(Tls, FilesThatCannotServeNameTheFlagAndFile) {
  EXPECT_EQ(tls_error(tls_options()), "");
  TlsOptions t = tls_options();
  t.keyfile.clear();  // the key in the certificate file
  std::ofstream(dir + "/both.pem") << std::ifstream(dir + "/server.crt").rdbuf()
                                   << std::ifstream(dir + "/server.key").rdbuf();
  t.certfile = dir + "/both.pem";
  EXPECT_EQ(tls_error(t), "");
  t.certfile = dir + "/server.crt";
  EXPECT_NE(tls_error(t).find("--ssl-certfile " + dir + "/server.crt: holds no private key"), std::string::npos)
      << tls_error(t);

  auto expect = [&](TlsOptions o, const std::string& text) {
    const std::string e = tls_error(o);
    EXPECT_NE(e.find(text), std::string::npos) << "want '" << text << "' in: " << e;
  };
  TlsOptions o = tls_options();
  o.certfile = dir + "/missing.crt";
  expect(o, "--ssl-certfile " + dir + "/missing.crt: cannot read the file (No such file or directory)");
  o = tls_options();
  o.certfile = dir + "/server.key";
  expect(o, "--ssl-certfile " + dir + "/server.key: not a PEM certificate");
  o = tls_options();
  o.keyfile = dir + "/missing.key";
  expect(o, "--ssl-keyfile " + dir + "/missing.key: cannot read the file");
  o.keyfile = dir + "/server.crt";
  expect(o, "--ssl-keyfile " + dir + "/server.crt: not a PEM private key");
  o.keyfile = dir + "/other.key";
  expect(o, "--ssl-keyfile " + dir + "/other.key: the key does not match the certificate of --ssl-certfile");
  o.keyfile = dir + "/locked.key";
  o.certfile = dir + "/locked.crt";
  expect(o, "--ssl-keyfile " + dir + "/locked.key: the private key is encrypted");
  o = tls_options();
  o.cert_reqs = 2;
  expect(o, "--ssl-cert-reqs 2 verifies client certificates: give the CA certificates");
  o.cert_reqs = 3;
  expect(o, "--ssl-cert-reqs 3: use 0");
  o = tls_options();
  o.ca_certs = dir + "/server.key";
  expect(o, "--ssl-ca-certs " + dir + "/server.key: no PEM CA certificate in it");
  o = tls_options();
  o.ciphers = "NO-SUCH-CIPHER";
  expect(o, "--ssl-ciphers NO-SUCH-CIPHER: no cipher OpenSSL knows matches it");
  // The server refuses them the same way when it starts.
  HttpServerOptions ho = options();
  ho.tls.certfile = dir + "/missing.crt";
  HttpServer s(
      ho, [](HttpRequest&&, std::shared_ptr<Exchange>) {}, &ApiServer::error_body);
  EXPECT_THROW(s.listen(), Error);
}

TEST(Metrics, RendersVllmNamesAndHistograms) {
  Metrics m("tiny", 4096);
  m.request_finished(finished("stop", 1.0, 0.2, 5));
  m.request_finished(finished("abort", 0.1, 0, 0));
  m.inter_token_latency(0.02);
  AsyncEngineStats s;
  s.engine.num_running = 3;
  s.engine.kv_cache_usage = 0.25;
  s.engine.prefix_cache_queries = 40;
  s.engine.prefix_cache_hit_tokens = 16;
  s.engine.iteration_tokens[0] = 2;  // two steps of one token
  s.engine.iteration_tokens[3] = 1;  // one of 17..32
  s.engine.iteration_tokens_sum = 32;
  const std::string t = m.render(s);
  EXPECT_NE(t.find("vllm:num_requests_running{model_name=\"tiny\"} 3\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:kv_cache_usage_perc{model_name=\"tiny\"} 0.25\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:gpu_cache_usage_perc{model_name=\"tiny\"} 0.25\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:prefix_cache_queries_total{model_name=\"tiny\"} 40\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:prefix_cache_hits_total{model_name=\"tiny\"} 16\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"stop\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("tessera:num_requests_aborted_total{model_name=\"tiny\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:e2e_request_latency_seconds_count{model_name=\"tiny\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.25\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:time_per_output_token_seconds_count{model_name=\"tiny\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:inter_token_latency_seconds_bucket{model_name=\"tiny\",le=\"0.025\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:request_queue_time_seconds_count{model_name=\"tiny\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:request_prompt_tokens_bucket{model_name=\"tiny\",le=\"10\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:request_params_max_tokens_sum{model_name=\"tiny\"} 32\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:iteration_tokens_total_bucket{model_name=\"tiny\",le=\"1\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:iteration_tokens_total_bucket{model_name=\"tiny\",le=\"32\"} 3\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:iteration_tokens_total_count{model_name=\"tiny\"} 3\n"), std::string::npos);
  EXPECT_NE(t.find("vllm:spec_decode_num_drafts_total{model_name=\"tiny\"} 0\n"), std::string::npos);
  EXPECT_EQ(t.find("accepted_tokens_per_pos"), std::string::npos) << "no per-position series when it is off";
  // Speculative decoding (k = 3): vLLM's spec_decode_* counters, one per-position series each.
  s.engine.num_speculative_tokens = 3;
  s.engine.spec.add(3, 2);
  s.engine.spec.add(2, 0);
  const std::string u = m.render(s);
  EXPECT_NE(u.find("vllm:spec_decode_num_drafts_total{model_name=\"tiny\"} 2\n"), std::string::npos) << u;
  EXPECT_NE(u.find("vllm:spec_decode_num_draft_tokens_total{model_name=\"tiny\"} 5\n"), std::string::npos);
  EXPECT_NE(u.find("vllm:spec_decode_num_accepted_tokens_total{model_name=\"tiny\"} 2\n"), std::string::npos);
  EXPECT_NE(u.find("vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"tiny\",position=\"1\"} 1\n"),
            std::string::npos);
  EXPECT_NE(u.find("vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"tiny\",position=\"2\"} 0\n"),
            std::string::npos);
}

// The series vLLM's Grafana dashboard (examples/online_serving/prometheus_grafana/grafana.json) and
// common scrapers query: every one is exported, and every exported vllm: series is one of vLLM's.
TEST(Metrics, ExportsTheSeriesVllmDashboardsQuery) {
  const std::set<std::string> vllm_names = {
      "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc",
      "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
      "vllm:time_to_first_token_seconds", "vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds",
      "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
      "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds", "vllm:request_prompt_tokens",
      "vllm:request_generation_tokens", "vllm:iteration_tokens_total", "vllm:prefix_cache_queries_total",
      "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total", "vllm:spec_decode_num_drafts_total",
      "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
      "vllm:request_params_max_tokens", "vllm:request_params_n",
      // The rest of vLLM's example Grafana dashboard (V0 names included).
      "vllm:num_requests_swapped", "vllm:cpu_cache_usage_perc", "vllm:request_max_num_generation_tokens"};
  Metrics m("tiny", 4096);
  AsyncEngineStats s;
  const std::string t = m.render(s);
  std::set<std::string> exported;
  std::istringstream lines(t);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("# TYPE ")) continue;
    const std::string name = line.substr(7, line.find(' ', 7) - 7);
    if (name.starts_with("vllm:"))
      exported.insert(name);
    else
      EXPECT_TRUE(name.starts_with("tessera:")) << name;
    // Every family has samples with the model_name label.
    EXPECT_TRUE(t.find("\n" + name + "{model_name=\"tiny\"") != std::string::npos ||
                t.find("\n" + name + "_bucket{model_name=\"tiny\"") != std::string::npos)
        << name;
  }
  std::vector<std::string> missing, extra;
  std::set_difference(vllm_names.begin(), vllm_names.end(), exported.begin(), exported.end(),
                      std::back_inserter(missing));
  std::set_difference(exported.begin(), exported.end(), vllm_names.begin(), vllm_names.end(),
                      std::back_inserter(extra));
  EXPECT_TRUE(missing.empty()) << "missing: " << ::testing::PrintToString(missing);
  EXPECT_TRUE(extra.empty()) << "not vLLM's: " << ::testing::PrintToString(extra);
}

}  // namespace
}  // namespace tessera::server
