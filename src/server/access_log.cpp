#include "server/access_log.h"

#include <fmt/format.h>

#include "core/logging.h"

namespace tessera::server {

namespace {

class LoggedExchange : public Exchange {
 public:
  LoggedExchange(std::string line, std::shared_ptr<Exchange> inner)
      : line_(std::move(line)), inner_(std::move(inner)) {}
  void respond(HttpResponse response) override {
    log(response.status);
    inner_->respond(std::move(response));
  }
  void start_stream(int status, std::string content_type, HeaderList headers) override {
    log(status);
    inner_->start_stream(status, std::move(content_type), std::move(headers));
  }
  void write(std::string data) override { inner_->write(std::move(data)); }
  void finish() override { inner_->finish(); }
  void post(std::function<void()> fn) override { inner_->post(std::move(fn)); }
  void on_disconnect(std::function<void()> fn) override { inner_->on_disconnect(std::move(fn)); }

 private:
  void log(int status) const { TLOG_INFO("{} {}", line_, status); }
  std::string line_;
  std::shared_ptr<Exchange> inner_;
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
