// The API server through the EngineClient seam, without a model: the real ApiServer (route table, key check,
// draining, request readers, generation bookkeeping, protocol writers) with the Qwen3 tokenizer and chat
// template, in front of the stub engine (stub_engine.h). Requests go to the handler layer the way the HTTP
// layer calls it (check_headers, then handle), answered through a recording Exchange; the stub answers every
// submitted request at once.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "server/api_server.h"
#include "server/http_types.h"
#include "server/metrics.h"
#include "server/request_reader.h"
#include "server/sampling_params_json.h"
#include "stub_engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tessera::server {
namespace {

using nlohmann::json;
using server_test::StubEngine;

const std::string kQwen3 = std::string(TESSERA_SOURCE_DIR) + "/.npm-pkgs/tokenizer-qwen3/package/models";
constexpr const char* kKey = "test-key";

// An Exchange that records what the server answers; post() runs at once (the test is the strand).
class Recorder : public Exchange {
 public:
  std::optional<HttpResponse> response;
  bool streamed = false, finished = false;
  int stream_status = 0;
  std::string stream_type, stream_body;
  HeaderList stream_headers;

  void respond(HttpResponse r) override { response = std::move(r); }
  void start_stream(int status, std::string content_type, HeaderList headers) override {
    streamed = true;
    stream_status = status;
    stream_type = std::move(content_type);
    stream_headers = std::move(headers);
  }
  void write(std::string data) override { stream_body += data; }
  void finish() override { finished = true; }
  void post(std::function<void()> fn) override { fn(); }
  void on_disconnect(std::function<void()>) override {}
};

// What came back: the status, content type, headers and body of a response, or of a stream.
struct Reply {
  int status = 0;
  std::string content_type;
  HeaderList headers;
  std::string body;
  bool streamed = false;

  json parsed() const { return json::parse(body); }
  std::string error_message() const {
    const json j = parsed();
    return j.at("error").at("message").get<std::string>();
  }
  const std::string* header(const std::string& name) const {
    for (const auto& [k, v] : headers)
      if (k == name) return &v;
    return nullptr;
  }
};

class ApiServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(kQwen3 + "/tokenizer.json")) return;
    tok_ = tokenizer::Tokenizer::from_dir(kQwen3).release();
    tmpl_ = new tokenizer::ChatTemplate(tokenizer::ChatTemplate::from_model_dir(kQwen3));
  }

  void SetUp() override {
    if (!tok_) GTEST_SKIP() << "run scripts/fetch_test_data.sh (the Qwen3 tokenizer)";
    restart([](ApiOptions&) {});
  }

  // (Re)creates the server with the test's options, changed by `change`.
  void restart(const std::function<void(ApiOptions&)>& change) {
    ApiOptions o;
    o.served_model_names = {"qwen3-tiny", "tiny-alias"};
    o.model_path = "/models/qwen3-tiny";
    o.api_keys = {kKey};
    o.enable_auto_tool_choice = true;
    o.tool_call_parser = "hermes";
    o.reasoning_parser = "qwen3";
    change(o);
    api_.reset();
    metrics_ = std::make_unique<Metrics>("qwen3-tiny");
    api_ = std::make_unique<ApiServer>(o, engine_, *tok_, tmpl_, *metrics_);
  }

  // One request as the HTTP layer hands it over: the header check, then the handler; the engine then
  // answers whatever was submitted. `headers`: more request headers.
  Reply call(const std::string& method, const std::string& path, const std::string& body = "", bool with_key = true,
             const HeaderList& headers = {}) {
    HttpRequest r;
    r.method = method;
    r.path = path;
    r.body = body;
    if (with_key) r.headers.emplace_back("authorization", std::string("Bearer ") + kKey);
    r.headers.insert(r.headers.end(), headers.begin(), headers.end());
    if (std::optional<HttpResponse> refusal = api_->check_headers(r)) {
      EXPECT_EQ(refusal->status, 401) << method << " " << path;
      return Reply{refusal->status, refusal->content_type, refusal->headers, refusal->body, false};
    }
    auto ex = std::make_shared<Recorder>();
    api_->handle(std::move(r), ex);
    engine_.finish_all();
    if (ex->streamed) {
      EXPECT_TRUE(ex->finished) << method << " " << path;
      return Reply{ex->stream_status, ex->stream_type, ex->stream_headers, ex->stream_body, true};
    }
    if (!ex->response) {
      ADD_FAILURE() << method << " " << path << ": no answer";
      return {};
    }
    return Reply{ex->response->status, ex->response->content_type, ex->response->headers, ex->response->body, false};
  }
  Reply post(const std::string& path, const json& body, bool with_key = true) {
    return call("POST", path, body.dump(), with_key);
  }

  static inline tokenizer::Tokenizer* tok_ = nullptr;
  static inline tokenizer::ChatTemplate* tmpl_ = nullptr;
  StubEngine engine_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<ApiServer> api_;
};

const json kChat = {{"model", "qwen3-tiny"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 8}};
const json kCompletion = {{"model", "qwen3-tiny"}, {"prompt", "Hello"}, {"max_tokens", 8}};
const json kMessages = {
    {"model", "qwen3-tiny"}, {"max_tokens", 8}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
const json kResponses = {{"model", "qwen3-tiny"}, {"input", "Hi"}, {"max_output_tokens", 8}};

// One row per route of the server: how to call it and what it answers.
struct RouteCase {
  std::string route;  // as ApiServer::route_list() names it
  std::string method, path;
  json body;  // null: no body
  bool needs_key;
  int draining_status;  // while the server drains
  std::string content_type;
  std::function<void(const Reply&)> shape;
};

std::vector<RouteCase> route_cases() {
  const std::string js = "application/json";
  return {
      {"GET /v1/models", "GET", "/v1/models", nullptr, true, 200, js,
       [](const Reply& r) {
         const json j = r.parsed();
         EXPECT_EQ(j["object"], "list");
         ASSERT_EQ(j["data"].size(), 2u);
         EXPECT_EQ(j["data"][0]["id"], "qwen3-tiny");
         EXPECT_EQ(j["data"][1]["id"], "tiny-alias");
         EXPECT_EQ(j["data"][0]["max_model_len"], 4096);
         EXPECT_EQ(j["data"][0]["root"], "/models/qwen3-tiny");
       }},
      {"GET /v1/models/{id}", "GET", "/v1/models/tiny-alias", nullptr, true, 200, js,
       [](const Reply& r) {
         const json j = r.parsed();
         EXPECT_EQ(j["id"], "tiny-alias");
         EXPECT_EQ(j["object"], "model");
       }},
      {"POST /v1/chat/completions", "POST", "/v1/chat/completions", kChat, true, 503, js,
       [](const Reply& r) {
         const json j = r.parsed();
         EXPECT_EQ(j["object"], "chat.completion");
         EXPECT_EQ(j["model"], "qwen3-tiny");
         ASSERT_EQ(j["choices"].size(), 1u);
         // The qwen3 reasoning parser split the stub's answer; the hermes tool call is text here (no tools).
         EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
         EXPECT_EQ(j["choices"][0]["message"]["reasoning_content"], "why");
         EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
         EXPECT_EQ(j["usage"]["completion_tokens"], 3);
       }},
      {"POST /v1/completions", "POST", "/v1/completions", kCompletion, true, 503, js,
       [](const Reply& r) {
         const json j = r.parsed();
         EXPECT_EQ(j["object"], "text_completion");
         ASSERT_EQ(j["choices"].size(), 1u);
         EXPECT_EQ(j["choices"][0]["text"], StubEngine::kAnswer);
       }},
      {"POST /v1/messages", "POST", "/v1/messages", kMessages, true, 503, js,
       [](const Reply& r) {
         const json j = r.parsed();
         EXPECT_EQ(j["type"], "message");
         EXPECT_EQ(j["role"], "assistant");
         ASSERT_TRUE(j["content"].is_array());
         EXPECT_EQ(j["content"][0]["type"], "thinking");
         EXPECT_EQ(j["stop_reason"], "end_turn");
       }},
      {"POST /v1/messages/count_tokens", "POST", "/v1/messages/count_tokens",
       json{{"model", "qwen3-tiny"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}}, true, 200, js,
       [](const Reply& r) { EXPECT_GT(r.parsed()["input_tokens"].get<int>(), 0); }},
      {"POST /v1/responses", "POST", "/v1/responses", kResponses, true, 503, js,
       [](const Reply& r) {
         const json j = r.parsed();
         EXPECT_EQ(j["object"], "response");
         EXPECT_EQ(j["status"], "completed");
         ASSERT_TRUE(j["output"].is_array());
         EXPECT_FALSE(j["output"].empty());
       }},
      {"POST /tokenize", "POST", "/tokenize", json{{"prompt", "Hello"}}, true, 200, js,
       [](const Reply& r) {
         const json j = r.parsed();
         EXPECT_EQ(j["tokens"], json::array({9707}));
         EXPECT_EQ(j["count"], 1);
         EXPECT_EQ(j["max_model_len"], 4096);
         EXPECT_TRUE(j["token_strs"].is_null());
       }},
      {"POST /detokenize", "POST", "/detokenize", json{{"tokens", {9707, 11}}}, true, 200, js,
       [](const Reply& r) { EXPECT_EQ(r.parsed()["prompt"], "Hello,"); }},
      {"GET /health", "GET", "/health", nullptr, false, 503, js, [](const Reply& r) { EXPECT_EQ(r.body, ""); }},
      {"GET /ping", "GET", "/ping", nullptr, false, 503, js, [](const Reply& r) { EXPECT_EQ(r.body, ""); }},
      {"GET /version", "GET", "/version", nullptr, false, 200, js,
       [](const Reply& r) { EXPECT_TRUE(r.parsed()["version"].is_string()); }},
      {"GET /metrics", "GET", "/metrics", nullptr, false, 200, "text/plain; version=0.0.4; charset=utf-8",
       [](const Reply& r) { EXPECT_NE(r.body.find("vllm:num_requests_running"), std::string::npos); }},
      {"GET /", "GET", "/", nullptr, false, 200, js,
       [](const Reply& r) {
         EXPECT_EQ(r.parsed(), (json{{"status", "ok"}, {"server", "tessera"}}));
       }},
  };
}

TEST_F(ApiServerTest, EveryRouteHasACase) {
  std::set<std::string> cased;
  for (const RouteCase& c : route_cases()) cased.insert(c.route);
  const std::vector<std::string> routes = ApiServer::route_list();
  EXPECT_EQ(std::set<std::string>(routes.begin(), routes.end()), cased);
  EXPECT_EQ(routes.size(), cased.size()) << "a route is listed twice";
}

TEST_F(ApiServerTest, EveryRouteAnswersWithItsStatusContentTypeAndShape) {
  for (const RouteCase& c : route_cases()) {
    SCOPED_TRACE(c.route);
    const Reply r = call(c.method, c.path, c.body.is_null() ? "" : c.body.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.content_type, c.content_type);
    c.shape(r);
  }
}

TEST_F(ApiServerTest, KeyRoutesAnswer401WithoutAKeyOpenRoutesDoNot) {
  for (const RouteCase& c : route_cases()) {
    SCOPED_TRACE(c.route);
    const Reply r = call(c.method, c.path, c.body.is_null() ? "" : c.body.dump(), /*with_key=*/false);
    if (!c.needs_key) {
      EXPECT_EQ(r.status, 200) << r.body;
      continue;
    }
    EXPECT_EQ(r.status, 401);
    ASSERT_NE(r.header("WWW-Authenticate"), nullptr);
    const json j = r.parsed();
    if (c.path.starts_with("/v1/messages"))
      EXPECT_EQ(j["error"]["type"], "authentication_error") << r.body;  // Anthropic's shape
    else
      EXPECT_EQ(j["error"]["code"], "invalid_api_key") << r.body;
  }
  EXPECT_TRUE(engine_.submitted().empty());
}

TEST_F(ApiServerTest, WrongKeyIs401AndXApiKeyIsAccepted) {
  HttpRequest r;
  r.method = "GET";
  r.path = "/v1/models";
  r.headers.emplace_back("authorization", "Bearer wrong");
  ASSERT_TRUE(api_->check_headers(r).has_value());
  r.headers = {{"x-api-key", kKey}};
  EXPECT_FALSE(api_->check_headers(r).has_value());
}

TEST_F(ApiServerTest, DrainingRefusesGenerationAndHealthReportsIt) {
  api_->set_draining();
  for (const RouteCase& c : route_cases()) {
    SCOPED_TRACE(c.route);
    const Reply r = call(c.method, c.path, c.body.is_null() ? "" : c.body.dump());
    EXPECT_EQ(r.status, c.draining_status) << r.body;
    if (c.draining_status != 503) continue;
    ASSERT_NE(r.header("Retry-After"), nullptr);
    const json j = r.parsed();
    const std::string message =
        c.path.starts_with("/v1/messages") ? j["error"]["message"].get<std::string>() : r.error_message();
    EXPECT_EQ(message, "the server is shutting down");
  }
  EXPECT_TRUE(engine_.submitted().empty());
}

TEST_F(ApiServerTest, HealthAndPingAre503OnceTheEngineDied) {
  engine_.fail("step 7: out of memory");
  for (const char* path : {"/health", "/ping"}) {
    const Reply r = call("GET", path);
    EXPECT_EQ(r.status, 503);
    EXPECT_EQ(r.error_message(), "the engine stopped after an error: step 7: out of memory");
  }
}

TEST_F(ApiServerTest, UnknownPathsAre404AndUnderV1NeedAKeyFirst) {
  Reply r = call("GET", "/nope", "", false);
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.error_message(), "GET /nope is not an endpoint of this server");
  EXPECT_EQ(call("GET", "/v1/nope", "", false).status, 401);
  r = call("GET", "/v1/nope");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.error_message(), "GET /v1/nope is not an endpoint of this server");
  // Below /v1/messages the error is in Anthropic's shape.
  r = call("POST", "/v1/messages/batches", "{}");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.parsed()["type"], "error") << r.body;
}

TEST_F(ApiServerTest, WrongMethodIs405WithAllow) {
  Reply r = call("POST", "/v1/models", "{}");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.error_message(), "POST is not allowed on /v1/models; use GET");
  ASSERT_NE(r.header("Allow"), nullptr);
  EXPECT_EQ(*r.header("Allow"), "GET");
  r = call("GET", "/v1/chat/completions");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(*r.header("Allow"), "POST");
}

TEST_F(ApiServerTest, HeadIsAnsweredOnGetRoutesAndEmptyOnRoot) {
  Reply r = call("HEAD", "/");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "");
  EXPECT_EQ(call("HEAD", "/health").status, 200);
}

TEST_F(ApiServerTest, UnknownModelIs404) {
  Reply r = call("GET", "/v1/models/other");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.error_message(), "The model `other` does not exist.");
  json body = kChat;
  body["model"] = "other";
  r = post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.error_message(), "The model `other` does not exist.");
  EXPECT_EQ(r.parsed()["error"]["param"], "model");
}

TEST_F(ApiServerTest, BodiesThatAreNotAJsonObjectAre400) {
  const std::map<std::string, std::string> cases = {
      {"", "the request body is empty; send a JSON object"},
      {"{", "the request body is not valid JSON: "},
      {"[1]", "the request body must be a JSON object"},
      {std::string(200, '[') + std::string(200, ']'),
       "the request body nests arrays and objects more than 128 levels deep; this server accepts at most 128"},
  };
  for (const auto& [body, message] : cases) {
    const Reply r = call("POST", "/v1/completions", body);
    EXPECT_EQ(r.status, 400);
    EXPECT_EQ(r.error_message().substr(0, message.size()), message) << r.body;
  }
}

TEST_F(ApiServerTest, StreamedChatIsServerSentEvents) {
  json body = kChat;
  body["stream"] = true;
  const Reply r = post("/v1/chat/completions", body);
  EXPECT_TRUE(r.streamed);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "text/event-stream; charset=utf-8");
  EXPECT_EQ(r.body.rfind("data: ", 0), 0u) << r.body;
  EXPECT_NE(r.body.find("\"chat.completion.chunk\""), std::string::npos);
  EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n")) << r.body;
}

TEST_F(ApiServerTest, WhatReachesTheEngine) {
  json body = kCompletion;
  body["prompt"] = json::array({"Hello", "Hi"});
  body["n"] = 2;
  body["temperature"] = 0.5;
  body["stop"] = "x";
  ASSERT_EQ(post("/v1/completions", body).status, 200);
  const std::vector<GenerationRequest> sent = engine_.submitted();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].prompt_ids, std::vector<int32_t>{9707});
  EXPECT_EQ(sent[0].params.n, 2);
  EXPECT_FLOAT_EQ(sent[0].params.temperature, 0.5f);
  EXPECT_EQ(sent[0].params.max_tokens, 8);
  EXPECT_EQ(sent[0].params.stop, std::vector<std::string>{"x"});
  EXPECT_NE(sent[0].id, sent[1].id);
  EXPECT_EQ(engine_.open_requests(), 0u);
}

// vLLM's --default-chat-template-kwargs (under the request's own, which win) and
// --exclude-tools-when-tool-choice-none, as the prompt that reaches the engine shows them.
TEST_F(ApiServerTest, ServerChatDefaultsReachTheTemplate) {
  ApiOptions o;
  o.served_model_names = {"qwen3-tiny"};
  o.default_chat_template_kwargs = {{"enable_thinking", false}};
  o.exclude_tools_when_tool_choice_none = true;
  o.enable_auto_tool_choice = true;
  o.tool_call_parser = "hermes";
  ApiServer api(o, engine_, *tok_, tmpl_, *metrics_);
  auto prompt_of = [&](const json& body) {
    HttpRequest r;
    r.method = "POST";
    r.path = "/v1/chat/completions";
    r.body = body.dump();
    auto ex = std::make_shared<Recorder>();
    api.handle(std::move(r), ex);
    engine_.finish_all();
    const std::vector<GenerationRequest> sent = engine_.submitted();
    EXPECT_FALSE(sent.empty());
    return sent.empty() ? std::string() : tok_->decode(sent.back().prompt_ids, false);
  };
  const std::string empty_think = "<think>\n\n</think>";
  EXPECT_NE(prompt_of(kChat).find(empty_think), std::string::npos) << "the server default turns thinking off";
  json thinking = kChat;
  thinking["chat_template_kwargs"] = {{"enable_thinking", true}};
  EXPECT_EQ(prompt_of(thinking).find(empty_think), std::string::npos) << "the request's own kwargs win";
  json tools = kChat;
  tools["tools"] = json::array(
      {{{"type", "function"},
        {"function",
         {{"name", "get_weather"}, {"parameters", {{"type", "object"}, {"properties", json::object()}}}}}}});
  EXPECT_NE(prompt_of(tools).find("get_weather"), std::string::npos);
  tools["tool_choice"] = "none";
  EXPECT_EQ(prompt_of(tools).find("get_weather"), std::string::npos) << "tool_choice none leaves the tools out";
}

TEST_F(ApiServerTest, EngineRefusalsBecome400And429And503) {
  engine_.refuse_with({SubmitError::kInvalid, "The decoder prompt cannot be empty", "prompt"});
  Reply r = post("/v1/chat/completions", kChat);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.error_message(), "The decoder prompt cannot be empty");
  EXPECT_EQ(r.parsed()["error"]["param"], "messages");  // the chat prompt's field
  engine_.refuse_with({SubmitError::kOverloaded, "too many requests are waiting", ""});
  r = post("/v1/completions", kCompletion);
  EXPECT_EQ(r.status, 429);
  ASSERT_NE(r.header("Retry-After"), nullptr);
  engine_.refuse_with({SubmitError::kDead, "the engine stopped after an error: boom", ""});
  r = post("/v1/completions", kCompletion);
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.error_message(), "the engine stopped after an error: boom");
  EXPECT_EQ(api_->active_requests(), 0u);
}

// ---- validation tables: one bad value per row, with the 400's message --------------------------------
struct FieldCase {
  std::string field;
  json value;
  std::string message;
};

// One case per row of sampling_params_json.cpp's table, of request_reader.cpp's refused fields, and of the
// reader's own checks of sampling fields.
std::vector<FieldCase> field_cases() {
  return {
      {"max_tokens", -1, "'max_tokens' must be a non-negative integer"},
      {"max_completion_tokens", "8", "'max_completion_tokens' must be a number"},
      {"temperature", "hot", "'temperature' must be a number"},
      {"top_p", "x", "'top_p' must be a number"},
      {"top_k", 1.5, "'top_k' must be an integer"},
      {"min_p", true, "'min_p' must be a number"},
      {"presence_penalty", "x", "'presence_penalty' must be a number"},
      {"frequency_penalty", json::array(), "'frequency_penalty' must be a number"},
      {"repetition_penalty", "x", "'repetition_penalty' must be a number"},
      {"n", 4294967296LL, "'n' must be an integer between -2147483648 and 2147483647, got 4294967296"},
      {"min_tokens", 0.5, "'min_tokens' must be an integer"},
      {"seed", "x", "'seed' must be an integer between -2^63 and 2^63-1"},
      {"ignore_eos", 1, "'ignore_eos' must be a boolean"},
      {"include_stop_str_in_output", "yes", "'include_stop_str_in_output' must be a boolean"},
      {"skip_special_tokens", 0, "'skip_special_tokens' must be a boolean"},
      {"stop", 5, "'stop' must be a string or a list of strings"},
      {"stop_token_ids", "x", "'stop_token_ids' must be a list of integers"},
      {"logprobs", "x", "'logprobs' must be a boolean or an integer"},
      {"top_logprobs", -1, "'top_logprobs' must be a non-negative integer, got -1"},
      {"prompt_logprobs", -1, "'prompt_logprobs' must be a non-negative integer, got -1"},
      {"logit_bias", json::array(), "'logit_bias' must be an object mapping token ids to biases"},
      {"allowed_token_ids", json::array(), "'allowed_token_ids' must not be empty (leave it out to allow every token)"},
      {"thinking_token_budget", 100,
       "'thinking_token_budget': a thinking budget is not enforced by this server; bound the whole output with "
       "max_tokens, or turn thinking off with chat_template_kwargs.enable_thinking"},
      {"chat_template", "{{ x }}",
       "'chat_template': a chat template in the request is not accepted (vLLM refuses it too unless "
       "--trust-request-chat-template); start the server with --chat-template"},
      {"return_tokens_as_token_ids", true,
       "'return_tokens_as_token_ids': tokens as 'token_id:<id>' strings are not supported; ask for logprobs, or "
       "/tokenize and /detokenize"},
      {"guided_decoding_backend", "xgrammar",
       "'guided_decoding_backend': there is one grammar engine; leave 'guided_decoding_backend' out"},
      {"logits_processors", json::array({"x"}), "'logits_processors': custom logits processors are not supported"},
      {"vllm_xargs", json::object(),
       "'vllm_xargs': 'vllm_xargs' (extra arguments for custom logits processors) is not supported"},
      {"best_of", 2, "'best_of' is not supported; use 'n' for several completions"},
      {"truncate_prompt_tokens", 0,
       "'truncate_prompt_tokens' must be a positive integer, or -1 (the model's context length)"},
      {"bad_words", json::array({""}), "'bad_words' must be a list of non-empty strings"},
  };
}

TEST_F(ApiServerTest, EveryValidationRowHasACase) {
  std::set<std::string> cased;
  for (const FieldCase& c : field_cases()) cased.insert(c.field);
  for (std::string_view name : sampling_field_names()) EXPECT_TRUE(cased.count(std::string(name))) << name;
  for (const api::RefusedField& f : api::kRefusedFields) EXPECT_TRUE(cased.count(f.name)) << f.name;
}

TEST_F(ApiServerTest, EveryValidationRowAnswers400WithItsMessage) {
  for (const FieldCase& c : field_cases()) {
    SCOPED_TRACE(c.field);
    json body = kCompletion;
    body[c.field] = c.value;
    const Reply r = post("/v1/completions", body);
    EXPECT_EQ(r.status, 400);
    EXPECT_EQ(r.error_message(), c.message);
  }
  EXPECT_TRUE(engine_.submitted().empty());
}

TEST_F(ApiServerTest, ServerBoundsOnSamplingFields) {
  json body = kCompletion;
  body["n"] = 17;
  Reply r = post("/v1/completions", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.error_message(), "'n' must be between 1 and 16, got 17");
  EXPECT_EQ(r.parsed()["error"]["param"], "n");
  body = kCompletion;
  body["prompt_logprobs"] = 1;
  body["stream"] = true;
  r = post("/v1/completions", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.error_message(), "'prompt_logprobs' are not available when 'stream' is true");
  // A refused field whose value asks for nothing is accepted.
  body = kCompletion;
  body["return_tokens_as_token_ids"] = false;
  body["logits_processors"] = json::array();
  EXPECT_EQ(post("/v1/completions", body).status, 200);
}

TEST_F(ApiServerTest, ResponsesNameMaxOutputTokensInErrors) {
  json body = kResponses;
  body["max_output_tokens"] = -1;
  const Reply r = post("/v1/responses", body);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.error_message(), "'max_output_tokens' must be a non-negative integer");
}

// --max-logprobs: vLLM's check and words, on chat's top_logprobs, completions' logprobs and prompt_logprobs.
TEST_F(ApiServerTest, MaxLogprobsBoundsEveryLogprobsField) {
  json chat = kChat;
  chat["logprobs"] = true;
  chat["top_logprobs"] = 21;
  Reply r = post("/v1/chat/completions", chat);  // vLLM's default, 20
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.error_message(), "Requested sample logprobs of 21, which is greater than max allowed: 20");

  restart([](ApiOptions& o) { o.max_logprobs = 5; });
  chat["top_logprobs"] = 6;
  r = post("/v1/chat/completions", chat);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.error_message(), "Requested sample logprobs of 6, which is greater than max allowed: 5");
  EXPECT_EQ(r.parsed()["error"]["param"], "logprobs");
  chat["top_logprobs"] = 5;
  EXPECT_EQ(post("/v1/chat/completions", chat).status, 200);
  json completion = kCompletion;
  completion["logprobs"] = 6;
  r = post("/v1/completions", completion);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.error_message(), "Requested sample logprobs of 6, which is greater than max allowed: 5");
  completion = kCompletion;
  completion["prompt_logprobs"] = 6;
  r = post("/v1/completions", completion);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.error_message(), "Requested prompt logprobs of 6, which is greater than max allowed: 5");
  EXPECT_EQ(r.parsed()["error"]["param"], "prompt_logprobs");

  // -1: up to the vocabulary; the per-request logprob budget still applies.
  restart([](ApiOptions& o) { o.max_logprobs = -1; });
  const size_t before = engine_.submitted().size();
  chat["top_logprobs"] = 100;
  EXPECT_EQ(post("/v1/chat/completions", chat).status, 200);
  ASSERT_EQ(engine_.submitted().size(), before + 1);
  EXPECT_EQ(engine_.submitted().back().params.logprobs, 100);
  chat["top_logprobs"] = 151937;
  r = post("/v1/chat/completions", chat);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.error_message(), "Requested sample logprobs of 151937, which is greater than max allowed: 151936");
  chat["top_logprobs"] = 100000;
  chat["max_tokens"] = 100;
  r = post("/v1/chat/completions", chat);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.error_message().find("logprob entries"), std::string::npos) << r.error_message();
}

// vLLM's CORS middleware: preflights need no key; every answer to a request with an Origin carries the headers.
TEST_F(ApiServerTest, CorsPreflightsAndResponses) {
  restart([](ApiOptions& o) { o.cors = CorsOptions{}; });
  const HeaderList origin = {{"origin", "https://app.example"}};
  HeaderList preflight = origin;
  preflight.emplace_back("access-control-request-method", "POST");
  preflight.emplace_back("access-control-request-headers", "authorization, content-type");
  Reply r = call("OPTIONS", "/v1/chat/completions", "", /*with_key=*/false, preflight);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "OK");
  ASSERT_NE(r.header("Access-Control-Allow-Origin"), nullptr);
  EXPECT_EQ(*r.header("Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(*r.header("Access-Control-Allow-Headers"), "authorization, content-type");
  EXPECT_EQ(*r.header("Access-Control-Max-Age"), "600");
  EXPECT_TRUE(engine_.submitted().empty());

  r = call("POST", "/v1/chat/completions", kChat.dump(), true, origin);
  EXPECT_EQ(r.status, 200);
  ASSERT_NE(r.header("Access-Control-Allow-Origin"), nullptr);
  EXPECT_EQ(*r.header("Access-Control-Allow-Origin"), "*");
  json stream = kChat;
  stream["stream"] = true;
  r = call("POST", "/v1/chat/completions", stream.dump(), true, origin);
  EXPECT_TRUE(r.streamed);
  ASSERT_NE(r.header("Access-Control-Allow-Origin"), nullptr);
  // A refusal (401 before the body, 404) carries them too; a request without an Origin does not.
  r = call("GET", "/v1/models", "", /*with_key=*/false, origin);
  EXPECT_EQ(r.status, 401);
  EXPECT_NE(r.header("Access-Control-Allow-Origin"), nullptr);
  r = call("GET", "/v1/nothing-here", "", true, origin);
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.header("Access-Control-Allow-Origin"), nullptr);
  EXPECT_EQ(call("GET", "/v1/models").header("Access-Control-Allow-Origin"), nullptr);
  // OPTIONS that is no preflight goes to the routes (405 on a POST route).
  EXPECT_EQ(call("OPTIONS", "/v1/chat/completions", "", true, origin).status, 405);

  restart([](ApiOptions& o) {
    o.cors = CorsOptions{};
    o.cors->allowed_origins = {"https://app.example"};
  });
  preflight[0].second = "https://evil.example";
  r = call("OPTIONS", "/v1/chat/completions", "", false, preflight);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body, "Disallowed CORS origin");
  r = call("GET", "/v1/models", "", true, origin);
  EXPECT_EQ(*r.header("Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(*r.header("Vary"), "Origin");
}

}  // namespace
}  // namespace tessera::server
