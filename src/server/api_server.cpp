// OpenAI (/v1/chat/completions, /v1/completions, /v1/models, /v1/responses), Anthropic (/v1/messages) and
// vLLM (/tokenize, /detokenize, /health, /version, /metrics) endpoints: one route table (routing, the key
// check, draining, the startup log) and the handlers. Reading a request is request_reader.cpp's, the generation
// bookkeeping every protocol shares generation_runner.cpp's; each protocol's output is its ProtocolWriter
// (openai_writers.cpp, anthropic_messages.cpp, responses_writer.cpp). Everything a request touches runs inside one
// exception boundary per request; a bad request gets an error object, never a crash.
#include "server/api_server.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string_view>

#include "core/logging.h"
#include "core/version.h"
#include "server/anthropic_messages.h"
#include "server/api_common.h"
#include "server/auth.h"
#include "server/generation.h"
#include "server/generation_runner.h"
#include "server/parsers/chat_output_parser.h"
#include "server/protocol_writers.h"
#include "server/request_reader.h"
#include "server/responses_api.h"
#include "server/sampling_params_json.h"
#include "tokenizer/tokenizer.h"

namespace tessera::server {

using namespace api;

// ---------------------------------------------------------------------------------------------
struct ApiServer::Impl {
  ApiOptions opt;
  EngineClient& engine;
  const tokenizer::Tokenizer& tok;
  Metrics& metrics;
  ApiServer* owner;
  TokenText text;
  RequestReader reader;
  GenerationRunner runner;
  std::optional<CorsPolicy> cors;

  Impl(ApiOptions o, EngineClient& e, const tokenizer::Tokenizer& t, const tokenizer::ChatTemplate* c, Metrics& m,
       ApiServer* own)
      : opt(std::move(o)),
        engine(e),
        tok(t),
        metrics(m),
        owner(own),
        text(t),
        reader(opt, e, t, c),
        runner(opt, e, m, own->active_) {
    if (opt.cors) cors.emplace(*opt.cors);
  }

  // ---- helpers ------------------------------------------------------------------------------
  HttpResponse error_response(bool anthropic, const ApiError& e) {
    return json_response(e.status,
                         anthropic ? anthropic_error(e.status, e.message) : openai_error(e.status, e.message, e.param),
                         e.headers);
  }

  // ---- handlers -----------------------------------------------------------------------------------------
  // What a handler gets: the request, its body (POST routes: a JSON object, its model checked; GET: null),
  // the exchange, and the part of the path a "{id}" route matched.
  struct Call {
    const HttpRequest& request;
    const ojson& body;
    const std::shared_ptr<Exchange>& ex;
    std::string_view id;
  };

  static ApiError shutting_down() { return ApiError{503, "the server is shutting down", {}, {{"Retry-After", "1"}}}; }

  // A chat request (OpenAI chat, or Anthropic Messages and Responses translated to one), written by `writer`.
  // The server's chat defaults (--default-chat-template-kwargs, --exclude-tools-when-tool-choice-none) on a
  // chat request; nullopt when none applies.
  std::optional<ojson> with_chat_defaults(const ojson& body) const {
    const bool kwargs = opt.default_chat_template_kwargs.is_object() && !opt.default_chat_template_kwargs.empty();
    const ojson* choice = field(body, "tool_choice");
    const bool drop_tools = opt.exclude_tools_when_tool_choice_none && choice && choice->is_string() &&
                            choice->get_ref<const std::string&>() == "none" && field(body, "tools");
    if (!kwargs && !drop_tools) return std::nullopt;
    ojson b = body;
    if (kwargs) {
      ojson merged = opt.default_chat_template_kwargs;
      if (const ojson* k = field(body, "chat_template_kwargs"); k && k->is_object())
        for (const auto& item : k->items()) merged[item.key()] = item.value();
      else if (k)
        return std::nullopt;  // not an object: the reader refuses it with its own message
      b["chat_template_kwargs"] = std::move(merged);
    }
    if (drop_tools) b.erase("tools");
    return b;
  }

  void chat(const ojson& given, const std::shared_ptr<Exchange>& ex, std::unique_ptr<ProtocolWriter> writer) {
    const std::optional<ojson> defaulted = with_chat_defaults(given);
    const ojson& body = defaulted ? *defaulted : given;
    PreparedRequest pr = reader.read_chat(body, writer->clamps_max_tokens());
    auto g = runner.new_gen(std::move(writer), ex, body);
    g->prompt_logprobs = pr.params.prompt_logprobs;
    runner.add_parsers(*g, body, pr.tools, pr.params.n);
    runner.start_generation(g, pr);
  }

  void chat_completions(const Call& c) { chat(c.body, c.ex, chat_writer(text)); }

  void completions(const Call& c) {
    PreparedRequest pr = reader.read_completions(c.body);
    auto g = runner.new_gen(completion_writer(text), c.ex, c.body);
    g->echo = pr.echo;
    // vLLM: with echo, logprobs covers the prompt too (the prompt_logprobs the engine computes), and
    // max_tokens 0 returns the prompt alone (lm-evaluation-harness scores text this way).
    g->prompt_logprobs = pr.params.prompt_logprobs;
    if (pr.echo && pr.params.logprobs >= 0 && pr.params.prompt_logprobs < 0)
      g->prompt_logprobs = pr.params.prompt_logprobs = pr.params.logprobs;
    if (pr.echo && pr.max_tokens_given && pr.params.max_tokens == 0 && pr.params.prompt_logprobs < 0)
      pr.params.prompt_logprobs = 0;  // the engine scores the prompt (not reported) and generates nothing
    runner.start_generation(g, pr);
  }

  // Anthropic Messages, as chat.
  void messages(const Call& c) { chat(messages_to_chat(c.body, opt.max_messages), c.ex, messages_writer()); }

  // OpenAI Responses API: translated to a chat request (responses_api.cpp), generated as chat is.
  void responses(const Call& c) {
    ResponsesRequest rq = responses_to_chat(c.body);
    if (!rq.ignored_tools.empty())
      TLOG_DEBUG("{}: ignoring tools this server cannot run: {}", c.request.path, fmt::join(rq.ignored_tools, ", "));
    const ojson chat_body = std::move(rq.chat);
    try {
      chat(chat_body, c.ex, responses_writer(text, std::move(rq)));
    } catch (ApiError& e) {
      // The request is read as a chat request whose max_tokens is the client's max_output_tokens: errors
      // about it name the field the client sent.
      rename_field(e, "max_output_tokens");
      throw;
    }
  }

  static void rename_field(ApiError& e, const std::string& name) {
    auto replace_all = [](std::string& text, const std::string& from, const std::string& to) {
      for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
        text.replace(at, from.size(), to);
    };
    replace_all(e.message, "'max_tokens' or 'max_completion_tokens'", "'" + name + "'");
    replace_all(e.message, "max_tokens", name);
    if (e.param == "max_tokens") e.param = name;
  }

  void count_tokens(const Call& c) {
    ojson b = c.body;
    if (!b.contains("max_tokens")) b["max_tokens"] = 1;
    ojson chat_body = messages_to_chat(b, opt.max_messages);
    std::string prompt = reader.render_chat(chat_body);
    c.ex->respond(json_response(200, {{"input_tokens", tok.encode(prompt, false).size()}}));
  }

  // vLLM's /tokenize.
  void tokenize(const Call& c) {
    const ojson& body = c.body;
    std::vector<int32_t> ids;
    if (field(body, "messages")) {
      std::string prompt = reader.render_chat(body);
      ids = tok.encode(prompt, get_bool(body, "add_special_tokens", false));
    } else if (const ojson* p = field(body, "prompt")) {
      if (!p->is_string()) bad("'prompt' must be a string", "prompt");
      if (p->get_ref<const std::string&>().size() > opt.max_prompt_bytes) bad("'prompt' is too long", "prompt");
      ids = tok.encode(p->get<std::string>(), get_bool(body, "add_special_tokens", true));
    } else {
      bad("send 'prompt' (a string) or 'messages' (a chat)", "prompt");
    }
    ojson r{{"count", ids.size()}, {"max_model_len", engine.max_model_len()}, {"tokens", ids}, {"token_strs", nullptr}};
    if (get_bool(body, "return_token_strs", false)) {
      ojson strs = ojson::array();
      for (int32_t id : ids) strs.push_back(tok.id_to_token(id).value_or(""));
      r["token_strs"] = strs;
    }
    c.ex->respond(json_response(200, r));
  }

  // vLLM's /detokenize.
  void detokenize(const Call& c) {
    const ojson* t = field(c.body, "tokens");
    if (!t || !t->is_array()) bad("'tokens' must be a list of token ids", "tokens");
    std::vector<int32_t> ids;
    for (const auto& v : *t) {
      if (!v.is_number_integer()) bad("'tokens' must be a list of token ids", "tokens");
      // Above 2^63 - 1 the id is read unsigned (as int64 it would print as a negative number).
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        bad(fmt::format("token id {} is outside the vocabulary", v.get<uint64_t>()), "tokens");
      int64_t id = v.get<int64_t>();
      if (id < 0 || id >= static_cast<int64_t>(std::max<size_t>(tok.vocab_size(), engine.vocab_size())))
        bad(fmt::format("token id {} is outside the vocabulary", id), "tokens");
      ids.push_back(static_cast<int32_t>(id));
    }
    c.ex->respond(json_response(200, {{"prompt", tok.decode(ids, false)}}));
  }

  ojson models() const {
    ojson data = ojson::array();
    for (const auto& n : opt.served_model_names)
      data.push_back({{"id", n},
                      {"object", "model"},
                      {"created", unix_now()},
                      {"owned_by", "tessera"},
                      {"root", opt.model_path},
                      {"parent", nullptr},
                      {"max_model_len", engine.max_model_len()},
                      {"permission", ojson::array()}});
    return {{"object", "list"}, {"data", data}};
  }

  void list_models(const Call& c) { c.ex->respond(json_response(200, models())); }

  void model(const Call& c) {
    // The list must outlive the loop: models()["data"] would refer into a destroyed temporary (the
    // request fuzzer's first finding, a heap-use-after-free on every GET /v1/models/{id}).
    const ojson all = models();
    for (const auto& m : all["data"])
      if (m["id"] == std::string(c.id)) return c.ex->respond(json_response(200, m));
    throw ApiError{404, fmt::format("The model `{}` does not exist.", c.id), "model", {}};
  }

  // /health and /ping: 200 with an empty body; 503 once the engine died or while the server drains (what a
  // load balancer watches).
  void health(const Call& c) {
    auto st = engine.stats();
    if (!st.alive) throw ApiError{503, "the engine stopped after an error: " + st.fatal_error, {}, {}};
    if (owner->draining_) throw shutting_down();
    c.ex->respond(HttpResponse{200, "application/json", {}, ""});
  }

  // Claude Code probes the base URL with HEAD / before its first request.
  void root(const Call& c) {
    if (c.request.method == "HEAD") return c.ex->respond(HttpResponse{200, "application/json", {}, ""});
    c.ex->respond(json_response(200, {{"status", "ok"}, {"server", "tessera"}}));
  }

  void version(const Call& c) { c.ex->respond(json_response(200, {{"version", TESSERA_VERSION_STRING}})); }

  void prometheus(const Call& c) {
    c.ex->respond(HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", {}, metrics.render(engine.stats())});
  }

  // ---- routes -------------------------------------------------------------------------------------------
  enum class Auth { kOpen, kKey };  // kKey: answered only with a valid key when --api-key is set
  // While the server drains: kServed as ever; kRefused: 503 with Retry-After (generation); kReported: the
  // handler answers 503 itself, after its own checks (/health and /ping, what load balancers watch).
  enum class Draining { kServed, kRefused, kReported };
  enum class Errors { kOpenAI, kAnthropic };  // the error body's shape, on this path and those below it
  struct Route {
    std::string_view path;    // a last segment "{id}" matches any rest of the path (Call::id)
    std::string_view method;  // "GET" (HEAD too) or "POST" (a JSON object body)
    Auth auth;
    Draining draining;
    Errors errors;
    void (Impl::*handler)(const Call&);
  };

  // Every endpoint, once: routing, the key check (also before the body is read), the error shape, draining and
  // the startup log read this table. Unknown paths under /v1 need a key too, so that routes cannot be listed
  // without one (vLLM's middleware does the same).
  static std::span<const Route> routes() {
    using enum Auth;
    using enum Draining;
    using enum Errors;
    static constexpr Route kRoutes[] = {
        {"/v1/models", "GET", kKey, kServed, kOpenAI, &Impl::list_models},
        {"/v1/models/{id}", "GET", kKey, kServed, kOpenAI, &Impl::model},
        {"/v1/chat/completions", "POST", kKey, kRefused, kOpenAI, &Impl::chat_completions},
        {"/v1/completions", "POST", kKey, kRefused, kOpenAI, &Impl::completions},
        {"/v1/messages", "POST", kKey, kRefused, kAnthropic, &Impl::messages},
        {"/v1/messages/count_tokens", "POST", kKey, kServed, kAnthropic, &Impl::count_tokens},
        {"/v1/responses", "POST", kKey, kRefused, kOpenAI, &Impl::responses},
        {"/tokenize", "POST", kKey, kServed, kOpenAI, &Impl::tokenize},
        {"/detokenize", "POST", kKey, kServed, kOpenAI, &Impl::detokenize},
        {"/health", "GET", kOpen, kReported, kOpenAI, &Impl::health},
        {"/ping", "GET", kOpen, kReported, kOpenAI, &Impl::health},
        {"/version", "GET", kOpen, kServed, kOpenAI, &Impl::version},
        {"/metrics", "GET", kOpen, kServed, kOpenAI, &Impl::prometheus},
        {"/", "GET", kOpen, kServed, kOpenAI, &Impl::root},
    };
    return kRoutes;
  }

  // The route of `path` (exact, or below a "{id}" row, whose rest goes to *id); null for none.
  static const Route* find_route(std::string_view path, std::string_view* id = nullptr) {
    for (const Route& r : routes()) {
      if (path == r.path) return &r;
      const size_t brace = r.path.find('{');
      if (brace != std::string_view::npos && path.starts_with(r.path.substr(0, brace))) {
        if (id) *id = path.substr(brace);
        return &r;
      }
    }
    return nullptr;
  }

  static bool needs_key(std::string_view path) {
    if (const Route* r = find_route(path)) return r->auth == Auth::kKey;
    return path == "/v1" || path.starts_with("/v1/");
  }

  static bool anthropic_errors(std::string_view path) {
    for (const Route& r : routes())
      if (r.errors == Errors::kAnthropic && path.starts_with(r.path)) return true;
    return false;
  }

  // The 401 for a request whose headers lack a valid key, before its body is read; nullopt otherwise. A CORS
  // preflight needs no key (browsers send none with it).
  std::optional<HttpResponse> check_headers(const HttpRequest& r) {
    if (cors && CorsPolicy::is_preflight(r)) return std::nullopt;
    if (!needs_key(r.path) || authorized(r, opt.api_keys)) return std::nullopt;
    const bool anthropic = anthropic_errors(r.path);
    HttpResponse refusal = error_response(anthropic, unauthorized(anthropic));
    if (cors) cors->add_response_headers(r, refusal.headers);
    return refusal;
  }

  // The key check, the route (404; 405 with Allow), the body of a POST route (parsed, its model checked),
  // the draining refusal, then the route's handler.
  void serve(const HttpRequest& r, const std::shared_ptr<Exchange>& ex, bool anthropic) {
    if (needs_key(r.path) && !authorized(r, opt.api_keys)) throw unauthorized(anthropic);
    std::string_view id;
    const Route* route = find_route(r.path, &id);
    if (!route) throw ApiError{404, fmt::format("{} {} is not an endpoint of this server", r.method, r.path), {}, {}};
    if (r.method != route->method && !(r.method == "HEAD" && route->method == "GET"))
      throw ApiError{405,
                     fmt::format("{} is not allowed on {}; use {}", r.method, r.path, route->method),
                     {},
                     {{"Allow", std::string(route->method)}}};
    ojson body;
    if (route->method == "POST") {
      body = RequestReader::parse_body(r);
      reader.check_model(body);
    }
    if (route->draining == Draining::kRefused && owner->draining_) throw shutting_down();
    (this->*route->handler)(Call{r, body, ex, id});
  }

  void handle(HttpRequest&& r, std::shared_ptr<Exchange> ex) {
    // CORS first, as vLLM's middleware: a preflight is answered here, on any path; other responses to a
    // request with an Origin carry the CORS headers.
    if (cors && r.header("origin")) {
      if (CorsPolicy::is_preflight(r)) return ex->respond(cors->preflight(r));
      ex = with_cors(*cors, r, std::move(ex));
    }
    const bool anthropic = anthropic_errors(r.path);
    try {
      serve(r, ex, anthropic);
    } catch (const ApiError& e) {
      ex->respond(error_response(anthropic, e));
    } catch (const tessera::Error& e) {  // malformed messages found by the template layer
      ex->respond(error_response(anthropic, ApiError{400, e.what(), {}, {}}));
    } catch (const nlohmann::json::exception& e) {  // a field of an unexpected type deep inside
      ex->respond(error_response(
          anthropic,
          ApiError{400, "a field of the request has the wrong type or value: " + json_error_text(e), {}, {}}));
    } catch (const std::bad_alloc&) {
      ex->respond(
          error_response(anthropic, ApiError{400, "the request needs more memory than the server allows", {}, {}}));
    } catch (const std::exception& e) {
      TLOG_ERROR("{} {}: internal error: {}", r.method, r.path, e.what());
      ex->respond(error_response(anthropic, ApiError{500, std::string("internal error: ") + e.what(), {}, {}}));
    }
  }
};

ApiServer::ApiServer(ApiOptions options, EngineClient& engine, const tokenizer::Tokenizer& tok,
                     const tokenizer::ChatTemplate* chat_template, Metrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(options), engine, tok, chat_template, metrics, this)) {}

ApiServer::~ApiServer() = default;

void ApiServer::handle(HttpRequest&& request, std::shared_ptr<Exchange> exchange) {
  impl_->handle(std::move(request), std::move(exchange));
}

std::optional<HttpResponse> ApiServer::check_headers(const HttpRequest& request) const {
  return impl_->check_headers(request);
}

std::vector<std::string> ApiServer::route_list() {
  std::vector<std::string> out;
  for (const auto& r : Impl::routes()) out.push_back(fmt::format("{} {}", r.method, r.path));
  return out;
}

std::string ApiServer::error_body(int status, const std::string& message) {
  return dump(openai_error(status, message));
}

}  // namespace tessera::server
