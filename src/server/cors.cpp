// CORS (see cors.h): Starlette's CORSMiddleware rules, which vLLM's server applies to every request.
#include "server/cors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <string_view>
#include <utility>

namespace tessera::server {

// Helpers in a named namespace, called by their qualified names: a unity build (the fuzz target's) puts other
// files' helpers beside them.
namespace cors_detail {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string_view strip(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool contains(const std::vector<std::string>& list, std::string_view item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

// Sets a header (names compare case-insensitively), replacing an earlier value.
void set_header(HeaderList& headers, const std::string& name, std::string value) {
  const std::string key = lower(name);
  for (auto& [k, v] : headers)
    if (lower(k) == key) {
      v = std::move(value);
      return;
    }
  headers.emplace_back(name, std::move(value));
}

// Starlette's add_vary_header: appended to an existing Vary value.
void add_vary(HeaderList& headers, const std::string& value) {
  for (auto& [k, v] : headers)
    if (lower(k) == "vary") {
      v += ", " + value;
      return;
    }
  headers.emplace_back("Vary", value);
}

class CorsExchange : public ForwardingExchange {
 public:
  CorsExchange(const CorsPolicy& policy, HttpRequest request, std::shared_ptr<Exchange> inner)
      : ForwardingExchange(std::move(inner)), policy_(policy), request_(std::move(request)) {}

 private:
  void before_headers(int, HeaderList& headers) override { policy_.add_response_headers(request_, headers); }
  const CorsPolicy& policy_;
  HttpRequest request_;  // only the headers the policy reads
};

}  // namespace cors_detail

CorsPolicy::CorsPolicy(CorsOptions options) : opt_(std::move(options)) {
  all_origins_ = cors_detail::contains(opt_.allowed_origins, "*");
  all_headers_ = cors_detail::contains(opt_.allowed_headers, "*");
  explicit_origin_ = !all_origins_ || opt_.allow_credentials;
  methods_ = cors_detail::contains(opt_.allowed_methods, "*")
                 ? std::vector<std::string>{"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"}
                 : opt_.allowed_methods;
  // The CORS-safelisted headers are always allowed; sorted as Python sorts strings (by code point).
  std::set<std::string> allowed = {"Accept", "Accept-Language", "Content-Language", "Content-Type"};
  allowed.insert(opt_.allowed_headers.begin(), opt_.allowed_headers.end());
  const std::vector<std::string> sorted(allowed.begin(), allowed.end());
  for (const std::string& h : sorted) headers_lower_.push_back(cors_detail::lower(h));

  if (explicit_origin_)
    preflight_headers_.emplace_back("Vary", "Origin");  // the origin itself is added when it is allowed
  else
    preflight_headers_.emplace_back("Access-Control-Allow-Origin", "*");
  preflight_headers_.emplace_back("Access-Control-Allow-Methods", fmt::format("{}", fmt::join(methods_, ", ")));
  preflight_headers_.emplace_back("Access-Control-Max-Age", std::to_string(opt_.max_age));
  if (!all_headers_)
    preflight_headers_.emplace_back("Access-Control-Allow-Headers", fmt::format("{}", fmt::join(sorted, ", ")));
  if (opt_.allow_credentials) preflight_headers_.emplace_back("Access-Control-Allow-Credentials", "true");
}

bool CorsPolicy::is_preflight(const HttpRequest& request) {
  return request.method == "OPTIONS" && request.header("origin") && request.header("access-control-request-method");
}

bool CorsPolicy::allowed_origin(const std::string& origin) const {
  return all_origins_ || cors_detail::contains(opt_.allowed_origins, origin);
}

HttpResponse CorsPolicy::preflight(const HttpRequest& request) const {
  const std::string& origin = *request.header("origin");
  const std::string& method = *request.header("access-control-request-method");
  const std::string* requested_headers = request.header("access-control-request-headers");
  HttpResponse r{200, "text/plain; charset=utf-8", preflight_headers_, "OK"};
  std::vector<std::string> failures;
  if (!allowed_origin(origin))
    failures.push_back("origin");
  else if (explicit_origin_)
    cors_detail::set_header(r.headers, "Access-Control-Allow-Origin", origin);
  if (!cors_detail::contains(methods_, method)) failures.push_back("method");
  if (all_headers_ && requested_headers) {
    cors_detail::set_header(r.headers, "Access-Control-Allow-Headers", *requested_headers);  // mirrored back
  } else if (requested_headers) {
    std::string_view rest = *requested_headers;
    for (;;) {
      const size_t comma = rest.find(',');
      const std::string name = cors_detail::lower(std::string(cors_detail::strip(rest.substr(0, comma))));
      if (!cors_detail::contains(headers_lower_, name)) {
        failures.push_back("headers");
        break;
      }
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  if (!failures.empty()) {
    r.status = 400;
    r.body = fmt::format("Disallowed CORS {}", fmt::join(failures, ", "));
  }
  return r;
}

void CorsPolicy::add_response_headers(const HttpRequest& request, HeaderList& response_headers) const {
  const std::string* origin = request.header("origin");
  if (!origin) return;
  if (all_origins_) cors_detail::set_header(response_headers, "Access-Control-Allow-Origin", "*");
  if (opt_.allow_credentials) cors_detail::set_header(response_headers, "Access-Control-Allow-Credentials", "true");
  const bool cookie = request.header("cookie") != nullptr;
  const bool authorization = request.header("authorization") != nullptr;
  // With every origin allowed, "*" is not enough where the browser sends credentials: the origin itself.
  const bool echo = all_origins_ ? (opt_.allow_credentials && authorization) || cookie : allowed_origin(*origin);
  if (echo) {
    cors_detail::set_header(response_headers, "Access-Control-Allow-Origin", *origin);
    cors_detail::add_vary(response_headers, "Origin");
  }
}

std::shared_ptr<Exchange> with_cors(const CorsPolicy& policy, const HttpRequest& request,
                                    std::shared_ptr<Exchange> inner) {
  HttpRequest kept;
  for (const char* name : {"origin", "cookie", "authorization"})
    if (const std::string* v = request.header(name)) kept.headers.emplace_back(name, *v);
  return std::make_shared<cors_detail::CorsExchange>(policy, std::move(kept), std::move(inner));
}

}  // namespace tessera::server
