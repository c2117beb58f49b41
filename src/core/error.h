// Errors that reach a user. Every message says what happened and what to do.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace tessera {

enum class ErrorKind {
  kInvalidArgument,  // bad flag, bad request field
  kNotFound,         // missing file, tensor, model
  kCorrupt,          // truncated file, header that lies
  kUnsupported,      // dtype, architecture, feature not implemented
  kOutOfMemory,      // KV cache or weights do not fit
  kNetwork,          // peers, sockets, timeouts
  kInternal,
};

// Messages are printed as one "error: ..." line; text quoted from a bad file (a JSON
// parser's "last read" bytes) must not break that, so control bytes become spaces.
inline std::string one_line(std::string s) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  return s;
}

// Thrown at startup (config, loader, planner) and caught at the CLI boundary,
// which prints the one-line message and exits non-zero. Inside the step loop
// and at request boundaries code returns Status instead.
class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message) : std::runtime_error(one_line(std::move(message))), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(kind, fmt::format(f, std::forward<Args>(args)...));
}

#define TESSERA_CHECK(cond, ...)                                                \
  do {                                                                          \
    if (!(cond)) ::tessera::fail(::tessera::ErrorKind::kInternal, __VA_ARGS__); \
  } while (0)

// A value or an error, for paths that must not throw (request handling, step loop).
class Status {
 public:
  Status() = default;
  Status(ErrorKind kind, std::string message) : ok_(false), kind_(kind), message_(std::move(message)) {}
  static Status Ok() { return {}; }
  bool ok() const { return ok_; }
  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }

 private:
  bool ok_ = true;
  ErrorKind kind_ = ErrorKind::kInternal;
  std::string message_;
};

}  // namespace tessera
