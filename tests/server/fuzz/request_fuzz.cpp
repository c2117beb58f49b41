// libFuzzer target over the whole request path of `tessera serve`: each input is raw bytes sent on
// a fresh loopback connection to the real HttpServer (Beast's parser, limits, Expect, keep-alive,
// pipelining) in front of the real ApiServer (routing, auth, JSON, validation, chat-template
// rendering and tokenisation with the Qwen3 tokenizer and template), as `tessera serve` wires them.
// The engine is the stub at the EngineClient seam (tests/server/stub_engine.h, shared with the API
// server's unit tests): it records what is submitted and, when the server aborts a request (the
// client went away), answers it with a short output, so the response formatting (reasoning and
// tool-call parsing, logprobs, SSE) runs too. After each input the
// server must still answer /health. A crash, an ASan/UBSan report, a hang or a dead server is a
// finding.
//
// The mutator knows the input is HTTP: it mutates the head or the body of the first request (now
// and then the raw bytes), keeps Content-Length equal to the body's length (a mutated body would
// otherwise mostly be cut or run into the next request), and sometimes nests a JSON value of the
// body in up to a few thousand more arrays (deep nesting is a known attack on JSON servers and
// has no coverage gradient of its own).
//   scripts/fuzz.sh 60      (builds build-fuzz/ with clang-14 and runs every fuzz target)
// TESSERA_FUZZ_TOKENIZER names the tokenizer directory (default: the repo's .npm-pkgs Qwen3 one).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../stub_engine.h"
#include "core/json_depth.h"
#include "core/logging.h"
#include "engine/async_engine.h"
#include "server/api_server.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tessera {
namespace {

using server_test::StubEngine;

struct Harness {
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::optional<tokenizer::ChatTemplate> tmpl;
  StubEngine engine;
  std::unique_ptr<server::Metrics> metrics;
  std::unique_ptr<server::ApiServer> api;
  std::unique_ptr<server::HttpServer> http;
  int port = 0;

  Harness() {
    init_logging("error");
    const char* env = std::getenv("TESSERA_FUZZ_TOKENIZER");
    const std::string dir = env ? env : TESSERA_SOURCE_DIR "/.npm-pkgs/tokenizer-qwen3/package/models";
    tok = tokenizer::Tokenizer::from_dir(dir);
    tmpl.emplace(tokenizer::ChatTemplate::from_model_dir(dir));
    metrics = std::make_unique<server::Metrics>("qwen3-tiny");
    server::ApiOptions ao;
    ao.served_model_names = {"qwen3-tiny", "tiny-alias"};
    ao.model_path = "/fuzz/qwen3-tiny";
    ao.api_keys = {"fuzz-key"};
    ao.enable_auto_tool_choice = true;
    ao.tool_call_parser = "hermes";
    ao.reasoning_parser = "qwen3";
    ao.cors = server::CorsOptions{};  // as tessera serve runs: vLLM's CORS defaults
    ao.cors->allow_credentials = true;
    api = std::make_unique<server::ApiServer>(ao, engine, *tok, &*tmpl, *metrics);
    server::HttpServerOptions ho;
    ho.host = "127.0.0.1";
    ho.port = 0;
    ho.threads = 1;
    ho.max_body_bytes = 1u << 20;
    ho.read_timeout = std::chrono::milliseconds(3000);
    http = std::make_unique<server::HttpServer>(
        ho, [this](server::HttpRequest&& r, std::shared_ptr<server::Exchange> ex) { api->handle(std::move(r), ex); },
        &server::ApiServer::error_body);
    http->set_header_check([this](const server::HttpRequest& r) { return api->check_headers(r); });
    http->start();
    port = http->port();
  }

  // libFuzzer's timeout timer (SIGALRM, every few seconds) interrupts blocking socket calls; the harness's
  // exchanges block it (each socket has its own 10 s timeout) and it is delivered when they end.
  class AlarmBlocked {
   public:
    AlarmBlocked() {
      sigset_t alarm;
      sigemptyset(&alarm);
      sigaddset(&alarm, SIGALRM);
      pthread_sigmask(SIG_BLOCK, &alarm, &saved_);
    }
    ~AlarmBlocked() { pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }
    AlarmBlocked(const AlarmBlocked&) = delete;
    AlarmBlocked& operator=(const AlarmBlocked&) = delete;

   private:
    sigset_t saved_;
  };

  int connect_to() const {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    timeval tv{10, 0};  // a server that neither answers nor closes within 10 s is a finding
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      die((std::string("connect: ") + std::strerror(errno)).c_str());
    return fd;
  }

  // Sends `data`, half-closes, and reads until the server closes; returns what it sent back.
  std::string exchange(const uint8_t* data, size_t size) const {
    AlarmBlocked quiet;
    int fd = connect_to();
    for (size_t off = 0; off < size;) {
      ssize_t n = ::send(fd, data + off, size - off, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;  // libFuzzer's timeout timer (SIGALRM) interrupts blocking calls
      if (n <= 0) break;                      // the server answered early and closed (413, 400, ...)
      off += static_cast<size_t>(n);
    }
    ::shutdown(fd, SHUT_WR);
    std::string out;
    char buf[16384];
    for (;;) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) die("the server neither answered nor closed within 10 s");
        break;  // reset
      }
      out.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return out;
  }

  void check_health() const {
    AlarmBlocked quiet;
    static const std::string req = "GET /health HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n";
    const auto t0 = std::chrono::steady_clock::now();
    int fd = connect_to();
    ssize_t sent;
    do {
      sent = ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    if (sent != static_cast<ssize_t>(req.size())) die("health send");
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0 || (n < 0 && errno == EINTR))
      if (n > 0) out.append(buf, static_cast<size_t>(n));
    const int err = n < 0 ? errno : 0;
    ::close(fd);
    if (out.rfind("HTTP/1.1 200 ", 0) != 0) {
      const auto ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
      die(("/health after the input: '" + out.substr(0, 200) + "' (recv " +
           (n == 0 ? std::string("end of stream") : std::string(std::strerror(err))) + " after " + std::to_string(ms) +
           " ms)")
              .c_str());
    }
  }

  [[noreturn]] static void die(const char* what) {
    std::fprintf(stderr, "request_fuzz: %s\n", what);
    std::abort();
  }
};

}  // namespace
}  // namespace tessera

namespace {

// Wraps a random array or object of `body` (when it has one) in 1..8191 more arrays.
void nest_deeper(std::string& body, std::minstd_rand& rng) {
  std::vector<size_t> opens;
  tessera::JsonStringTracker strings;
  for (size_t i = 0; i < body.size(); ++i)
    if (strings.structural(body[i]) && (body[i] == '[' || body[i] == '{')) opens.push_back(i);
  if (opens.empty()) return;
  const size_t start = opens[rng() % opens.size()];
  size_t end = std::string::npos;
  int depth = 0;
  tessera::JsonStringTracker from_start;
  for (size_t i = start; i < body.size(); ++i) {
    const char c = body[i];
    if (!from_start.structural(c)) continue;
    if (c == '[' || c == '{') {
      ++depth;
    } else if ((c == ']' || c == '}') && --depth == 0) {
      end = i;
      break;
    }
  }
  if (end == std::string::npos) return;
  const size_t k = (size_t{1} << (rng() % 13)) + rng() % 64;
  body.insert(end + 1, std::string(k, ']'));
  body.insert(start, std::string(k, '['));
}

// Sets the head's Content-Length (if it has one) to `length`.
void fix_content_length(std::string& head, size_t length) {
  std::string lower = head;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const size_t at = lower.find("\r\ncontent-length:");
  if (at == std::string::npos) return;
  const size_t value = at + std::strlen("\r\ncontent-length:");
  const size_t eol = head.find("\r\n", value);
  if (eol == std::string::npos) return;
  head.replace(value, eol - value, " " + std::to_string(length));
}

}  // namespace

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::minstd_rand rng(seed);
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t sep = in.find("\r\n\r\n");
  if (sep == std::string::npos || rng() % 8 == 0) return LLVMFuzzerMutate(data, size, max_size);
  std::string head = in.substr(0, sep + 4), body = in.substr(sep + 4);
  const unsigned choice = rng() % 8;
  if (choice == 0 || choice == 1) {  // the head
    std::vector<uint8_t> h(head.begin(), head.end());
    h.resize(std::max(h.size(), max_size > body.size() ? max_size - body.size() : h.size()));
    const size_t n = LLVMFuzzerMutate(h.data(), head.size(), h.size());
    head.assign(reinterpret_cast<const char*>(h.data()), n);
  } else if (choice == 2) {
    nest_deeper(body, rng);
  } else {  // the body
    std::vector<uint8_t> b(body.begin(), body.end());
    b.resize(std::max(b.size(), max_size > head.size() ? max_size - head.size() : b.size()));
    const size_t n = LLVMFuzzerMutate(b.data(), body.size(), b.size());
    body.assign(reinterpret_cast<const char*>(b.data()), n);
  }
  fix_content_length(head, body.size());
  const std::string out = head + body;
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

namespace {
tessera::Harness* harness = nullptr;  // lives for the process (the server's threads use it)
}  // namespace

// The server and the tokenizer start here, before the first input: their start (seconds under ASan on a busy
// machine) must not count against the first input's -timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  harness = new tessera::Harness();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::Harness* h = harness;
  h->exchange(data, size);
  h->engine.finish_all();  // requests still open (none should be) release their state
  h->check_health();
  return 0;
}
