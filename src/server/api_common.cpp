#include "server/api_common.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <random>

namespace tessera::server::api {

[[noreturn]] void bad(std::string message, std::string param) {
  throw ApiError{400, std::move(message), std::move(param), {}};
}

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

HttpResponse json_response(int status, const ojson& j, HeaderList headers) {
  return HttpResponse{status, "application/json", std::move(headers), dump(j)};
}

namespace {

// An HTTP status's error type in OpenAI's terms (its Python SDK's exception names) and in
// Anthropic's.
struct ErrorTypes {
  int status;
  const char* openai;
  const char* anthropic;
};
constexpr ErrorTypes kErrorTypes[] = {
    {400, "BadRequestError", "invalid_request_error"},
    {401, "AuthenticationError", "authentication_error"},
    {403, "BadRequestError", "permission_error"},
    {404, "NotFoundError", "not_found_error"},
    {405, "MethodNotAllowedError", "invalid_request_error"},
    {413, "RequestTooLargeError", "request_too_large"},
    {417, "UnprocessableEntityError", "invalid_request_error"},
    {422, "UnprocessableEntityError", "invalid_request_error"},
    {429, "RateLimitError", "rate_limit_error"},
    {431, "RequestHeaderFieldsTooLargeError", "invalid_request_error"},
    {503, "ServiceUnavailableError", "overloaded_error"},
};

ErrorTypes error_types(int status) {
  for (const ErrorTypes& t : kErrorTypes)
    if (t.status == status) return t;
  if (status >= 500) return {status, "InternalServerError", "api_error"};
  return {status, "BadRequestError", "invalid_request_error"};
}

}  // namespace

ojson openai_error(int status, const std::string& message, const std::string& param) {
  ojson e{{"message", message}, {"type", error_types(status).openai}, {"param", nullptr}, {"code", status}};
  if (!param.empty()) e["param"] = param;
  if (status == 401) {
    e["type"] = "invalid_request_error";
    e["code"] = "invalid_api_key";
  }
  return ojson{{"error", e}};
}

ojson anthropic_error(int status, const std::string& message) {
  return ojson{{"type", "error"}, {"error", {{"type", error_types(status).anthropic}, {"message", message}}}};
}

std::string random_hex(int n) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* digits = "0123456789abcdef";
  std::string s(static_cast<size_t>(n), '0');
  for (auto& c : s) c = digits[rng() & 15];
  return s;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string json_error_text(const std::exception& e) {
  std::string m = e.what();
  if (m.rfind("[json.exception.", 0) == 0)
    if (auto close = m.find("] "); close != std::string::npos) m.erase(0, close + 2);
  return m;
}

double finite_logprob(float v) { return std::isfinite(v) ? static_cast<double>(v) : -9999.0; }

const ojson* field(const ojson& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

bool get_bool(const ojson& body, const char* name, bool def) {
  const ojson* v = field(body, name);
  if (!v) return def;
  if (!v->is_boolean()) bad(fmt::format("'{}' must be a boolean", name), name);
  return v->get<bool>();
}

std::string sse(const ojson& j) { return "data: " + dump(j) + "\n\n"; }

std::string event(const char* name, const ojson& j) { return fmt::format("event: {}\ndata: {}\n\n", name, dump(j)); }

}  // namespace tessera::server::api
