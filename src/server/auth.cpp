#include "server/auth.h"

#include <algorithm>
#include <cctype>
#include <string_view>

namespace tessera::server::api {

namespace {

// Constant-time comparison: the time depends on the lengths only, not on where the bytes differ.
bool same_secret(const std::string& a, const std::string& b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

bool ascii_iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

}  // namespace

bool authorized(const HttpRequest& r, const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  std::string presented;
  bool have = false;
  if (const std::string* a = r.header("authorization")) {
    std::string v = *a;
    if (v.size() > 7 && ascii_iequals(std::string_view(v).substr(0, 7), "bearer ")) {
      presented = v.substr(7);
      while (!presented.empty() && presented.front() == ' ') presented.erase(0, 1);
      have = true;
    }
  }
  if (!have) {
    if (const std::string* k = r.header("x-api-key")) {
      presented = *k;
      have = true;
    }
  }
  if (!have) return false;
  bool ok = false;
  for (const auto& key : keys) ok |= same_secret(presented, key);  // no early exit
  return ok;
}

ApiError unauthorized(bool anthropic) {
  return ApiError{
      401,
      anthropic ? "invalid x-api-key" : "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.",
      {},
      {{"WWW-Authenticate", "Bearer"}}};
}

}  // namespace tessera::server::api
