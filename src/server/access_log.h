// uvicorn-style access log: one line per request with its status, written when the response (or a
// stream's headers) goes out:  127.0.0.1:51234 - "POST /v1/messages?beta=true HTTP/1.1" 200
#pragma once

#include <memory>

#include "server/http_types.h"

namespace tessera::server {

// An Exchange that logs the request line and status at respond()/start_stream(), then forwards.
std::shared_ptr<Exchange> with_access_log(const HttpRequest& request, std::shared_ptr<Exchange> inner);
// The same line for a request answered without an Exchange (refused by the header check).
void log_access(const HttpRequest& request, int status);

}  // namespace tessera::server
