// One-off requests made before a run: which model the server serves, and whether it answers.
#pragma once
#include <string>

#include "bench/http_client.h"

namespace tessera::bench {

// GET /v1/models and return the first model id. Throws tessera::Error with what to do when
// the server is unreachable, rejects the API key, or lists no model.
std::string discover_model(boost::asio::io_context& io, HttpClient& client, std::chrono::milliseconds timeout);

}  // namespace tessera::bench
