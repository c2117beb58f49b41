// What every endpoint of the API shares (server-internal): the request-level error, JSON field access,
// OpenAI and Anthropic error bodies, server-sent-event framing.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <exception>
#include <string>

#include "server/http_types.h"

namespace tessera::server::api {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

// A request-level failure: status, message, and the offending field when there is one.
struct ApiError {
  int status;
  std::string message;
  std::string param;
  HeaderList headers;
};

// A 400 for the request.
[[noreturn]] void bad(std::string message, std::string param = {});

std::string dump(const ojson& j);
// A JSON response: `j` dumped, content type application/json.
HttpResponse json_response(int status, const ojson& j, HeaderList headers = {});

// {"error": {"message", "type", "param", "code"}} (401: type invalid_request_error, code invalid_api_key).
ojson openai_error(int status, const std::string& message, const std::string& param = {});
// {"type": "error", "error": {"type", "message"}}
ojson anthropic_error(int status, const std::string& message);

std::string random_hex(int n);
int64_t unix_now();
// nlohmann's message without its "[json.exception.type_error.302] " prefix: errors are in our words.
std::string json_error_text(const std::exception& e);
double finite_logprob(float v);

// The member `name` of `body`, or nullptr when absent or null.
const ojson* field(const ojson& body, const char* name);
// A boolean member (default when absent or null); any other type is a 400.
bool get_bool(const ojson& body, const char* name, bool def);

// "data: <json>\n\n" and "event: <name>\ndata: <json>\n\n".
std::string sse(const ojson& j);
std::string event(const char* name, const ojson& j);

}  // namespace tessera::server::api
