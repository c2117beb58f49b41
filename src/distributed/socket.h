// Plain POSIX TCP with deadlines: every blocking call is a poll() bounded by a
// steady-clock deadline, so no read, write or connect can hang the caller.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::dist {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;
inline Deadline deadline_after(std::chrono::milliseconds d) { return Clock::now() + d; }

// An owned file descriptor (move-only, closed on destruction).
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();
  // Wakes any thread blocked in poll on this socket (shutdown(2)); the fd stays open.
  void shutdown() const;

 private:
  int fd_ = -1;
};

// Listens on a numeric IP (never a wildcard unless `ip` is literally "0.0.0.0" or "::").
Socket listen_tcp(const std::string& ip, uint16_t port, int backlog = 64);
uint16_t local_port(const Socket& s);
// "ip:port" of the other end ("?" if unknown).
std::string peer_address(const Socket& s);

// One connection attempt to host:port (host may be a name). When `source_ip` is set the
// socket is bound to it first, so traffic leaves by the chosen NIC. Throws Error(kNetwork).
Socket connect_tcp(const std::string& host, uint16_t port, Deadline deadline, const std::string& source_ip = "");

// Accepts one connection; returns an invalid Socket when the deadline passes first.
Socket accept_tcp(const Socket& listener, Deadline deadline);

// True when `s` has bytes (or an end-of-stream) to read within `wait`; false on timeout.
bool wait_readable(const Socket& s, std::chrono::milliseconds wait);

void write_all(const Socket& s, const void* data, size_t n, Deadline deadline);
// Reads exactly n bytes. Returns false on a clean end-of-stream before the first byte;
// throws Error(kNetwork) on timeout, reset or a stream cut mid-message.
bool read_exact(const Socket& s, void* data, size_t n, Deadline deadline);

}  // namespace tessera::dist
