// API keys (--api-key): where a request presents its key and how it is compared.
#pragma once

#include <string>
#include <vector>

#include "server/api_common.h"
#include "server/http_types.h"

namespace tessera::server::api {

// True when `keys` is empty or the request presents one of them, as `Authorization: Bearer KEY` (the scheme
// case-insensitive, RFC 9110 11.1) or `x-api-key: KEY`; compared in constant time, without an early exit.
bool authorized(const HttpRequest& r, const std::vector<std::string>& keys);

// The 401 (with `WWW-Authenticate: Bearer`), worded for the OpenAI or the Anthropic API.
ApiError unauthorized(bool anthropic);

}  // namespace tessera::server::api
