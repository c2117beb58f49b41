#include "server/access_log.h"

#include <fmt/format.h>

#include "core/logging.h"

namespace tessera::server {

namespace {

class LoggedExchange : public ForwardingExchange {
 public:
  LoggedExchange(std::string line, std::shared_ptr<Exchange> inner)
      : ForwardingExchange(std::move(inner)), line_(std::move(line)) {}

 private:
  void before_headers(int status, HeaderList&) override { TLOG_INFO("{} {}", line_, status); }
  std::string line_;
};

std::string request_line(const HttpRequest& r) {
  return fmt::format("{} - \"{} {}{}{} HTTP/1.1\"", r.remote, r.method, r.path, r.query.empty() ? "" : "?", r.query);
}

}  // namespace

std::shared_ptr<Exchange> with_access_log(const HttpRequest& r, std::shared_ptr<Exchange> inner) {
  return std::make_shared<LoggedExchange>(request_line(r), std::move(inner));
}

void log_access(const HttpRequest& r, int status) { TLOG_INFO("{} {}", request_line(r), status); }

}  // namespace tessera::server
