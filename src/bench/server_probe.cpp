#include "bench/server_probe.h"

#include <nlohmann/json.hpp>

#include "bench/openai_protocol.h"
#include "core/error.h"

namespace tessera::bench {
namespace {

class CollectingObserver : public HttpObserver {
 public:
  void on_body(std::string_view bytes, Clock::time_point) override { body.append(bytes); }
  void on_finish(const HttpOutcome& result, Clock::time_point) override { outcome = result; }
  std::string body;
  HttpOutcome outcome;
};

}  // namespace

std::string discover_model(boost::asio::io_context& io, HttpClient& client, std::chrono::milliseconds timeout) {
  auto observer = std::make_shared<CollectingObserver>();
  client.send(HttpExchange{"GET", "/v1/models", "", timeout, {}}, observer);
  io.restart();
  io.run();
  const BaseUrl& base = client.base_url();
  const std::string url = "http://" + base.host + ":" + base.port + base.path_prefix;
  const HttpOutcome& outcome = observer->outcome;
  if (outcome.error == TransportError::kConnect)
    fail(ErrorKind::kNetwork, "cannot connect to {} ({}): is the server running? check --base-url", url,
         outcome.message);
  if (outcome.error != TransportError::kNone)
    fail(ErrorKind::kNetwork, "GET {}/v1/models failed ({}): check --base-url and the server's log", url,
         outcome.message);
  if (outcome.status == 401 || outcome.status == 403)
    fail(ErrorKind::kInvalidArgument, "{} refused the API key (HTTP {}): check --api-key", url, outcome.status);
  if (outcome.status != 200)
    fail(ErrorKind::kNetwork, "GET {}/v1/models answered HTTP {} ({}): pass --model NAME to skip model discovery", url,
         outcome.status, error_body_summary(observer->body));
  nlohmann::json models = nlohmann::json::parse(observer->body, nullptr, false);
  if (!models.is_discarded() && models.contains("data") && models["data"].is_array() && !models["data"].empty() &&
      models["data"][0].contains("id") && models["data"][0]["id"].is_string())
    return models["data"][0]["id"].get<std::string>();
  fail(ErrorKind::kNetwork, "GET {}/v1/models listed no model: pass --model NAME", url);
}

}  // namespace tessera::bench
