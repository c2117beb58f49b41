// CORS, as vLLM serves it: Starlette's CORSMiddleware with --allowed-origins, --allowed-methods,
// --allowed-headers and --allow-credentials (each list defaults to ["*"]). The HTTP layer asks this policy
// for the answer to a preflight (OPTIONS with Origin and Access-Control-Request-Method: answered here, before
// any key check, as browsers send no key with it) and for the headers every other response to a request with
// an Origin carries. Boost-free, so its rules are tested alone (tests/server/cors_test.cpp).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "server/http_types.h"

namespace tessera::server {

struct CorsOptions {
  std::vector<std::string> allowed_origins{"*"};
  std::vector<std::string> allowed_methods{"*"};  // "*": DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT
  std::vector<std::string> allowed_headers{"*"};
  bool allow_credentials = false;
  int max_age = 600;  // Access-Control-Max-Age of a preflight's answer (Starlette's default)
};

class CorsPolicy {
 public:
  explicit CorsPolicy(CorsOptions options);

  // True for a CORS preflight: OPTIONS with an Origin and an Access-Control-Request-Method header.
  static bool is_preflight(const HttpRequest& request);
  // The answer to a preflight: 200 "OK" with Access-Control-Allow-Methods, -Headers, -Max-Age (and the
  // origin), or 400 "Disallowed CORS origin" (", method", ", headers": what failed). Plain text.
  HttpResponse preflight(const HttpRequest& request) const;
  // Adds to `response_headers` what a response to `request` carries (nothing without an Origin header):
  // Access-Control-Allow-Origin ("*", or the origin itself, with Vary: Origin, when only some origins are
  // allowed, or for a request with a cookie, or with credentials allowed and an Authorization header), and
  // Access-Control-Allow-Credentials: true with --allow-credentials.
  void add_response_headers(const HttpRequest& request, HeaderList& response_headers) const;

  bool allowed_origin(const std::string& origin) const;

 private:
  CorsOptions opt_;
  bool all_origins_ = false, all_headers_ = false, explicit_origin_ = false;
  std::vector<std::string> methods_;        // after "*" is expanded
  std::vector<std::string> headers_lower_;  // the safelisted headers and the allowed ones, lower case, sorted
  HeaderList preflight_headers_;            // what every preflight answer carries
};

// An Exchange whose responses (complete or streamed) carry the CORS headers for `request`
// (CorsPolicy::add_response_headers); `policy` must outlive it.
std::shared_ptr<Exchange> with_cors(const CorsPolicy& policy, const HttpRequest& request,
                                    std::shared_ptr<Exchange> inner);

}  // namespace tessera::server
