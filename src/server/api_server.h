// The OpenAI- and Anthropic-compatible API on top of the HTTP layer. All JSON and chat-template
// work happens here, on the connection's strand; requests reach the engine as GenerationRequest
// structs, and the engine's callbacks are posted back to the strand (never processed on the
// engine thread).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/async_engine.h"
#include "loader/model_config.h"
#include "server/cors.h"
#include "server/http_types.h"
#include "server/metrics.h"
#include "server/sampling_params_json.h"

namespace tessera::tokenizer {
class Tokenizer;
class ChatTemplate;
}  // namespace tessera::tokenizer

namespace tessera::server {

struct ApiOptions {
  std::vector<std::string> served_model_names;  // the first is reported; any is accepted as "model"
  std::string model_path;
  std::vector<std::string> api_keys;  // empty: no auth
  // Sampling defaults from generation_config.json (vLLM's --generation-config; load_generation_config).
  GenerationDefaults defaults;
  bool enable_auto_tool_choice = false;
  std::string tool_call_parser, reasoning_parser;
  // Bounds that keep one request from harming the others.
  int max_n = 16;
  int max_prompts = 256;               // /v1/completions prompt list length
  int max_messages = 4096;             // chat messages per request
  size_t max_prompt_bytes = 8u << 20;  // rendered chat prompt / prompt text
  int max_tokens_cap = 1 << 20;
  int64_t max_logprob_entries = kMaxLogprobEntries;  // logprobs and prompt_logprobs of one request's answer
  // vLLM's --max-logprobs: the most top logprobs per token a request may ask for (logprobs, top_logprobs,
  // prompt_logprobs); -1: the vocabulary (no cap).
  int max_logprobs = 20;
  // vLLM's CORS middleware (--allowed-origins, ...): preflights answered, every response to a request with an
  // Origin header carries the CORS headers. nullopt: none (tessera serve always sets it, as vLLM does).
  std::optional<CorsOptions> cors;
  int retry_after_seconds = 1;
  // vLLM's --enable-log-requests: one log line per generation request with its prompt (the first
  // max_log_len characters and token ids; 0: all) and sampling parameters.
  bool log_requests = false;
  int max_log_len = 0;
  // vLLM's --default-chat-template-kwargs: under each chat request's own chat_template_kwargs (which win).
  nlohmann::ordered_json default_chat_template_kwargs;
  // vLLM's --exclude-tools-when-tool-choice-none: tool_choice "none" leaves the tools out of the prompt.
  bool exclude_tools_when_tool_choice_none = false;
};

class ApiServer {
 public:
  ApiServer(ApiOptions options, EngineClient& engine, const tokenizer::Tokenizer& tok,
            const tokenizer::ChatTemplate* chat_template, Metrics& metrics);
  ~ApiServer();

  // The HTTP layer's request handler (runs on the connection's strand).
  void handle(HttpRequest&& request, std::shared_ptr<Exchange> exchange);
  // The HTTP layer's header check (HttpServer::set_header_check): a 401 for a request that needs a key and
  // presents none that is valid, answered before its body is read.
  std::optional<HttpResponse> check_headers(const HttpRequest& request) const;
  // Every route as "METHOD /path" ("/v1/models/{id}" for the model route), from the route table (the startup
  // log lists them).
  static std::vector<std::string> route_list();
  // OpenAI error body for errors the HTTP layer answers itself.
  static std::string error_body(int status, const std::string& message);

  void set_draining() { draining_ = true; }
  size_t active_requests() const { return active_.load(); }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> draining_{false};
  std::atomic<size_t> active_{0};
};

}  // namespace tessera::server
