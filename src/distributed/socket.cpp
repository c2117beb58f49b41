#include "distributed/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace tessera::dist {

namespace {

int remaining_ms(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

// Waits for `events` on fd; false on timeout.
bool wait_for(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) fail(ErrorKind::kNetwork, "poll failed: {}", std::strerror(errno));
    if (Clock::now() >= deadline) return false;
  }
}

std::string sockaddr_string(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    return fmt::format("{}:{}", buf, ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    return fmt::format("[{}]:{}", buf, ntohs(a->sin6_port));
  }
  return "?";
}

bool parse_numeric(const std::string& ip, uint16_t port, sockaddr_storage* ss, socklen_t* len) {
  *ss = {};
  auto* v4 = reinterpret_cast<sockaddr_in*>(ss);
  if (inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    *len = sizeof(sockaddr_in);
    return true;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(ss);
  if (inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    *len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

void set_common_options(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // control frames are small and latency-bound
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Socket::shutdown() const {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

Socket listen_tcp(const std::string& ip, uint16_t port, int backlog) {
  sockaddr_storage ss;
  socklen_t len;
  if (!parse_numeric(ip, port, &ss, &len))
    fail(ErrorKind::kInvalidArgument, "cannot listen on '{}': not a numeric IP address", ip);
  Socket s(socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) fail(ErrorKind::kNetwork, "socket() failed: {}", std::strerror(errno));
  int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(s.fd(), reinterpret_cast<sockaddr*>(&ss), len) != 0)
    fail(ErrorKind::kNetwork, "cannot listen on {}:{}: {}{}", ip, port, std::strerror(errno),
         errno == EADDRINUSE ? " (another process holds the port; pick another --master-port)" : "");
  if (listen(s.fd(), backlog) != 0)
    fail(ErrorKind::kNetwork, "listen on {}:{} failed: {}", ip, port, std::strerror(errno));
  fcntl(s.fd(), F_SETFL, fcntl(s.fd(), F_GETFL) | O_NONBLOCK);
  return s;
}

uint16_t local_port(const Socket& s) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(s.fd(), reinterpret_cast<sockaddr*>(&ss), &len);
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

std::string peer_address(const Socket& s) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(s.fd(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return sockaddr_string(ss);
}

Socket connect_tcp(const std::string& host, uint16_t port, Deadline deadline, const std::string& source_ip) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || !res) fail(ErrorKind::kNetwork, "cannot resolve '{}': {}", host, gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* r = res; r; r = r->ai_next) {
    Socket s(socket(r->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) continue;
    if (!source_ip.empty()) {
      sockaddr_storage src;
      socklen_t src_len;
      if (!parse_numeric(source_ip, 0, &src, &src_len) || src.ss_family != r->ai_family) continue;
      if (bind(s.fd(), reinterpret_cast<sockaddr*>(&src), src_len) != 0) {
        last_error = fmt::format("bind to {} failed: {}", source_ip, std::strerror(errno));
        continue;
      }
    }
    set_common_options(s.fd());
    if (connect(s.fd(), r->ai_addr, r->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last_error = std::strerror(errno);
      continue;
    }
    if (!wait_for(s.fd(), POLLOUT, deadline)) {
      last_error = "timed out";
      continue;
    }
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      last_error = std::strerror(err);
      continue;
    }
    freeaddrinfo(res);
    return s;
  }
  freeaddrinfo(res);
  fail(ErrorKind::kNetwork, "cannot connect to {}:{}: {}", host, port, last_error);
}

Socket accept_tcp(const Socket& listener, Deadline deadline) {
  if (!wait_for(listener.fd(), POLLIN, deadline)) return Socket();
  int fd = accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return Socket();
  set_common_options(fd);
  return Socket(fd);
}

bool wait_readable(const Socket& s, std::chrono::milliseconds wait) {
  return wait_for(s.fd(), POLLIN, deadline_after(wait));
}

void write_all(const Socket& s, const void* data, size_t n, Deadline deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(s.fd(), p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_for(s.fd(), POLLOUT, deadline)) fail(ErrorKind::kNetwork, "timed out sending to {}", peer_address(s));
      continue;
    }
    fail(ErrorKind::kNetwork, "send to {} failed: {}", peer_address(s), std::strerror(errno));
  }
}

bool read_exact(const Socket& s, void* data, size_t n, Deadline deadline) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(s.fd(), p + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      if (got == 0) return false;
      fail(ErrorKind::kNetwork, "{} closed the connection in the middle of a message", peer_address(s));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_for(s.fd(), POLLIN, deadline)) fail(ErrorKind::kNetwork, "timed out waiting for {}", peer_address(s));
      continue;
    }
    if (errno == ECONNRESET && got == 0) return false;
    fail(ErrorKind::kNetwork, "receive from {} failed: {}", peer_address(s), std::strerror(errno));
  }
  return true;
}

}  // namespace tessera::dist
