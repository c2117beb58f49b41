// The CORS policy alone (server/cors.h): Starlette's CORSMiddleware rules, as vLLM serves them with
// --allowed-origins, --allowed-methods, --allowed-headers and --allow-credentials.
#include "server/cors.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace tessera::server {
namespace {

HttpRequest request(const std::string& method, HeaderList headers) {
  HttpRequest r;
  r.method = method;
  r.path = "/v1/chat/completions";
  r.headers = std::move(headers);
  return r;
}

const std::string* find(const HeaderList& headers, const std::string& name) {
  for (const auto& [k, v] : headers)
    if (k == name) return &v;
  return nullptr;
}

std::string value(const HeaderList& headers, const std::string& name) {
  const std::string* v = find(headers, name);
  return v ? *v : "<none>";
}

HttpRequest preflight_request(const std::string& origin, const std::string& method, const char* headers = nullptr) {
  HeaderList h{{"origin", origin}, {"access-control-request-method", method}};
  if (headers) h.emplace_back("access-control-request-headers", headers);
  return request("OPTIONS", h);
}

TEST(Cors, PreflightIsOptionsWithOriginAndRequestMethod) {
  EXPECT_TRUE(CorsPolicy::is_preflight(preflight_request("https://a.example", "POST")));
  EXPECT_FALSE(CorsPolicy::is_preflight(request("OPTIONS", {{"origin", "https://a.example"}})));
  EXPECT_FALSE(CorsPolicy::is_preflight(request("OPTIONS", {{"access-control-request-method", "POST"}})));
  EXPECT_FALSE(CorsPolicy::is_preflight(request("POST", {{"origin", "x"}, {"access-control-request-method", "POST"}})));
}

TEST(Cors, DefaultsAllowEveryOriginMethodAndHeader) {
  const CorsPolicy p{CorsOptions{}};
  const HttpResponse r = p.preflight(preflight_request("https://a.example", "POST", "Authorization, Content-Type"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "OK");
  EXPECT_EQ(r.content_type, "text/plain; charset=utf-8");
  EXPECT_EQ(value(r.headers, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(value(r.headers, "Access-Control-Allow-Methods"), "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT");
  EXPECT_EQ(value(r.headers, "Access-Control-Max-Age"), "600");
  // "*" mirrors the requested headers back.
  EXPECT_EQ(value(r.headers, "Access-Control-Allow-Headers"), "Authorization, Content-Type");
  EXPECT_EQ(find(r.headers, "Vary"), nullptr);
  EXPECT_EQ(find(r.headers, "Access-Control-Allow-Credentials"), nullptr);
  // No requested headers: none named.
  EXPECT_EQ(find(p.preflight(preflight_request("https://a.example", "GET")).headers, "Access-Control-Allow-Headers"),
            nullptr);

  HeaderList h;
  p.add_response_headers(request("POST", {{"origin", "https://a.example"}}), h);
  EXPECT_EQ(value(h, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(find(h, "Vary"), nullptr);
  // Without an Origin header nothing is added.
  HeaderList none;
  p.add_response_headers(request("POST", {}), none);
  EXPECT_TRUE(none.empty());
}

TEST(Cors, ListedOriginsAreEchoedWithVaryAndOthersRefused) {
  CorsOptions o;
  o.allowed_origins = {"https://a.example"};
  const CorsPolicy p{o};
  HttpResponse r = p.preflight(preflight_request("https://a.example", "POST"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(value(r.headers, "Access-Control-Allow-Origin"), "https://a.example");
  EXPECT_EQ(value(r.headers, "Vary"), "Origin");

  r = p.preflight(preflight_request("https://evil.example", "POST"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body, "Disallowed CORS origin");
  EXPECT_EQ(find(r.headers, "Access-Control-Allow-Origin"), nullptr);

  HeaderList h{{"Vary", "Accept-Encoding"}};
  p.add_response_headers(request("GET", {{"origin", "https://a.example"}}), h);
  EXPECT_EQ(value(h, "Access-Control-Allow-Origin"), "https://a.example");
  EXPECT_EQ(value(h, "Vary"), "Accept-Encoding, Origin");
  HeaderList other;
  p.add_response_headers(request("GET", {{"origin", "https://evil.example"}}), other);
  EXPECT_EQ(find(other, "Access-Control-Allow-Origin"), nullptr);
}

TEST(Cors, MethodsAndHeadersOutsideTheListsFailThePreflight) {
  CorsOptions o;
  o.allowed_origins = {"https://a.example"};
  o.allowed_methods = {"GET", "POST"};
  o.allowed_headers = {"X-Api-Key"};
  const CorsPolicy p{o};
  HttpResponse r = p.preflight(preflight_request("https://a.example", "POST", "content-type, x-api-key"));
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(value(r.headers, "Access-Control-Allow-Methods"), "GET, POST");
  // The safelisted headers are always allowed; the list is Python's sort of the names as given.
  EXPECT_EQ(value(r.headers, "Access-Control-Allow-Headers"),
            "Accept, Accept-Language, Content-Language, Content-Type, X-Api-Key");
  r = p.preflight(preflight_request("https://a.example", "DELETE", "Authorization"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body, "Disallowed CORS method, headers");
  r = p.preflight(preflight_request("https://b.example", "PUT"));
  EXPECT_EQ(r.body, "Disallowed CORS origin, method");
}

TEST(Cors, CredentialsWithEveryOriginEchoTheOrigin) {
  CorsOptions o;
  o.allow_credentials = true;
  const CorsPolicy p{o};
  const HttpResponse r = p.preflight(preflight_request("https://a.example", "POST"));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(value(r.headers, "Access-Control-Allow-Origin"), "https://a.example");
  EXPECT_EQ(value(r.headers, "Vary"), "Origin");
  EXPECT_EQ(value(r.headers, "Access-Control-Allow-Credentials"), "true");

  // A request with an Authorization header (credentials allowed) or a cookie gets its origin back.
  HeaderList h;
  p.add_response_headers(request("POST", {{"origin", "https://a.example"}, {"authorization", "Bearer k"}}), h);
  EXPECT_EQ(value(h, "Access-Control-Allow-Origin"), "https://a.example");
  EXPECT_EQ(value(h, "Vary"), "Origin");
  EXPECT_EQ(value(h, "Access-Control-Allow-Credentials"), "true");
  HeaderList plain;
  p.add_response_headers(request("POST", {{"origin", "https://a.example"}}), plain);
  EXPECT_EQ(value(plain, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(find(plain, "Vary"), nullptr);
}

TEST(Cors, ACookieGetsTheOriginEvenWithoutCredentials) {
  const CorsPolicy p{CorsOptions{}};
  HeaderList h;
  p.add_response_headers(request("GET", {{"origin", "https://a.example"}, {"cookie", "a=1"}}), h);
  EXPECT_EQ(value(h, "Access-Control-Allow-Origin"), "https://a.example");
  EXPECT_EQ(value(h, "Vary"), "Origin");
  EXPECT_EQ(find(h, "Access-Control-Allow-Credentials"), nullptr);
}

// Records what reaches the connection.
struct Sink : Exchange {
  HttpResponse response;
  HeaderList stream_headers;
  void respond(HttpResponse r) override { response = std::move(r); }
  void start_stream(int, std::string, HeaderList h) override { stream_headers = std::move(h); }
  void write(std::string) override {}
  void finish() override {}
  void post(std::function<void()> fn) override { fn(); }
  void on_disconnect(std::function<void()>) override {}
};

TEST(Cors, TheExchangeAddsTheHeadersToAnswersAndStreams) {
  CorsOptions o;
  o.allowed_origins = {"https://a.example"};
  const CorsPolicy p{o};
  auto sink = std::make_shared<Sink>();
  auto ex = with_cors(p, request("POST", {{"origin", "https://a.example"}}), sink);
  ex->respond(HttpResponse{404, "application/json", {{"X-Other", "1"}}, "{}"});
  EXPECT_EQ(value(sink->response.headers, "Access-Control-Allow-Origin"), "https://a.example");
  EXPECT_EQ(value(sink->response.headers, "X-Other"), "1");
  ex = with_cors(p, request("POST", {{"origin", "https://a.example"}}), sink);
  ex->start_stream(200, "text/event-stream", {});
  EXPECT_EQ(value(sink->stream_headers, "Access-Control-Allow-Origin"), "https://a.example");
}

}  // namespace
}  // namespace tessera::server
