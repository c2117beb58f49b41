// OpenAI (/v1/chat/completions, /v1/completions, /v1/models), Anthropic (/v1/messages) and vLLM
// (/tokenize, /detokenize, /health, /version, /metrics) endpoints. Everything a request touches runs
// inside one exception boundary per request; a bad request gets an error object, never a crash.
#include "server/api_server.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <malloc.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <string_view>

#include "core/json_depth.h"
#include "core/logging.h"
#include "core/version.h"
#include "server/parsers/chat_output_parser.h"
#include "server/responses_api.h"
#include "server/text_only.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tessera::server {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

enum class Api { kOpenAI, kAnthropic };
enum class Kind { kChat, kCompletion, kMessages, kResponses };

// A request-level failure: status, message, and the offending field when there is one.
struct ApiError {
  int status;
  std::string message;
  std::string param;
  HeaderList headers;
};

[[noreturn]] void bad(std::string message, std::string param = {}) {
  throw ApiError{400, std::move(message), std::move(param), {}};
}

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

const char* openai_error_type(int status) {
  switch (status) {
    case 400:
      return "BadRequestError";
    case 401:
      return "AuthenticationError";
    case 404:
      return "NotFoundError";
    case 405:
      return "MethodNotAllowedError";
    case 413:
      return "RequestTooLargeError";
    case 417:
    case 422:
      return "UnprocessableEntityError";
    case 429:
      return "RateLimitError";
    case 431:
      return "RequestHeaderFieldsTooLargeError";
    case 503:
      return "ServiceUnavailableError";
    default:
      return status >= 500 ? "InternalServerError" : "BadRequestError";
  }
}
const char* anthropic_error_type(int status) {
  switch (status) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

ojson openai_error(int status, const std::string& message, const std::string& param = {}) {
  ojson e{{"message", message}, {"type", openai_error_type(status)}, {"param", nullptr}, {"code", status}};
  if (!param.empty()) e["param"] = param;
  if (status == 401) {
    e["type"] = "invalid_request_error";
    e["code"] = "invalid_api_key";
  }
  return ojson{{"error", e}};
}
ojson anthropic_error(int status, const std::string& message) {
  return ojson{{"type", "error"}, {"error", {{"type", anthropic_error_type(status)}, {"message", message}}}};
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

// nlohmann's message without its "[json.exception.type_error.302] " prefix: errors are in our words.
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

}  // namespace

// ---------------------------------------------------------------------------------------------
struct ApiServer::Impl {
  ApiOptions opt;
  EngineClient& engine;
  const tokenizer::Tokenizer& tok;
  const tokenizer::ChatTemplate* tmpl;
  Metrics& metrics;
  ApiServer* owner;

  // One generation request (one or several engine requests), owned by the callbacks and the strand.
  struct Choice {
    std::string text;
    std::vector<int32_t> token_ids;
    std::vector<TokenLogprob> logprobs;
    std::string finish_reason;
    ojson stop_reason = nullptr;
    std::string stop_string;
    std::string error;
    bool done = false;
  };
  struct Gen {
    Impl* api = nullptr;
    std::shared_ptr<Exchange> ex;
    Kind kind = Kind::kChat;
    bool stream = false, include_usage = false, continuous_usage = false, echo = false;
    std::string id, model;
    int64_t created = 0;
    int n = 1;
    int logprobs = -1;
    std::vector<int32_t> stop_token_ids;
    std::vector<std::string> engine_ids;
    std::vector<int> prompt_tokens;
    std::vector<std::string> prompt_texts;
    int cached_tokens = 0;
    std::vector<Choice> choices;
    int remaining = 0;
    Clock::time_point start = Clock::now();
    double ttft = 0;
    bool complete = false;
    // Reasoning / tool-call parsers, one per choice (chat only; empty when none applies).
    std::vector<std::unique_ptr<ChatOutputParser>> parsers;
    std::vector<bool> tools_called;
    // Anthropic streams: the open content block (-1: none yet) and its type.
    int block_index = -1;
    std::string block_type;
    // Responses API: output items and events (kResponses only).
    std::unique_ptr<ResponseBuilder> responses;
    ~Gen() {
      if (--api->owner->active_ == 0) api->idle();
    }
  };

  Impl(ApiOptions o, EngineClient& e, const tokenizer::Tokenizer& t, const tokenizer::ChatTemplate* c, Metrics& m,
       ApiServer* own)
      : opt(std::move(o)), engine(e), tok(t), tmpl(c), metrics(m), owner(own) {}

  // When the last request finished, give freed heap back to the OS (glibc keeps it otherwise), at most
  // twice a second, so RSS returns to its baseline after a burst.
  std::atomic<int64_t> last_trim_ms{0};
  void idle() {
    const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
    int64_t last = last_trim_ms.load();
    if (now - last < 500 || !last_trim_ms.compare_exchange_strong(last, now)) return;
    malloc_trim(0);
  }

  // ---- helpers ------------------------------------------------------------------------------
  HttpResponse json_response(int status, const ojson& j, HeaderList headers = {}) {
    return HttpResponse{status, "application/json", std::move(headers), dump(j)};
  }
  HttpResponse error_response(Api api, const ApiError& e) {
    return json_response(
        e.status,
        api == Api::kAnthropic ? anthropic_error(e.status, e.message) : openai_error(e.status, e.message, e.param),
        e.headers);
  }

  bool authorized(const HttpRequest& r) const {
    if (opt.api_keys.empty()) return true;
    std::string presented;
    bool have = false;
    if (const std::string* a = r.header("authorization")) {
      std::string v = *a;
      // The auth scheme is case-insensitive (RFC 9110 11.1): Bearer, bearer, BEARER.
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
    for (const auto& key : opt.api_keys) ok |= same_secret(presented, key);  // no early exit
    return ok;
  }

  static ApiError unauthorized(Api api) {
    return ApiError{401,
                    api == Api::kAnthropic ? "invalid x-api-key"
                                           : "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.",
                    {},
                    {{"WWW-Authenticate", "Bearer"}}};
  }

  ojson parse_body(const HttpRequest& r) {
    if (r.body.empty()) bad("the request body is empty; send a JSON object");
    // Bounded before parsing: every later walk over the body (copies, conversions, dumps) recurses.
    if (json_nesting_depth(r.body) > kMaxJsonDepth)
      bad(
          fmt::format("the request body nests arrays and objects more than {} levels deep; this server accepts at "
                      "most {}",
                      kMaxJsonDepth, kMaxJsonDepth));
    ojson body;
    try {
      body = ojson::parse(r.body);
    } catch (const ojson::parse_error& e) {
      bad("the request body is not valid JSON: " + json_error_text(e));
    }
    if (!body.is_object()) bad("the request body must be a JSON object");
    return body;
  }

  void check_model(const ojson& body) {
    const ojson* m = field(body, "model");
    if (!m) return;
    if (!m->is_string()) bad("'model' must be a string", "model");
    const std::string name = m->get<std::string>();
    for (const auto& n : opt.served_model_names)
      if (n == name) return;
    throw ApiError{404, fmt::format("The model `{}` does not exist.", name), "model", {}};
  }

  std::string token_string(int32_t id) const {
    int32_t ids[1] = {id};
    return tok.decode(std::span<const int32_t>(ids, 1), false);
  }
  ojson token_bytes(int32_t id) const {
    std::string b;
    if (tok.decodes_by_byte_concatenation())
      tok.append_token_bytes(id, false, b);
    else
      b = token_string(id);
    ojson arr = ojson::array();
    for (unsigned char c : b) arr.push_back(static_cast<int>(c));
    return arr;
  }

  ojson chat_logprobs(const std::vector<TokenLogprob>& lps, int top) const {
    ojson content = ojson::array();
    for (const auto& lp : lps) {
      ojson tops = ojson::array();
      for (size_t i = 0; i < lp.top.size() && static_cast<int>(i) < top; ++i)
        tops.push_back({{"token", token_string(lp.top[i].first)},
                        {"logprob", finite_logprob(lp.top[i].second)},
                        {"bytes", token_bytes(lp.top[i].first)}});
      content.push_back({{"token", token_string(lp.token)},
                         {"logprob", finite_logprob(lp.logprob)},
                         {"bytes", token_bytes(lp.token)},
                         {"top_logprobs", tops}});
    }
    return ojson{{"content", content}};
  }
  ojson completion_logprobs(const std::vector<TokenLogprob>& lps, int top, size_t text_offset) const {
    ojson tokens = ojson::array(), token_lps = ojson::array(), tops = ojson::array(), offsets = ojson::array();
    for (const auto& lp : lps) {
      std::string s = token_string(lp.token);
      tokens.push_back(s);
      token_lps.push_back(finite_logprob(lp.logprob));
      ojson t = ojson::object();
      for (size_t i = 0; i < lp.top.size() && static_cast<int>(i) < top; ++i)
        t[token_string(lp.top[i].first)] = finite_logprob(lp.top[i].second);
      tops.push_back(t);
      offsets.push_back(text_offset);
      text_offset += s.size();
    }
    return ojson{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  ojson usage(const Gen& g) const {
    int prompt = 0, completion = 0;
    for (int p : g.prompt_tokens) prompt += p;
    for (const auto& c : g.choices) completion += static_cast<int>(c.token_ids.size());
    ojson u{{"prompt_tokens", prompt}, {"total_tokens", prompt + completion}, {"completion_tokens", completion}};
    u["prompt_tokens_details"] = {{"cached_tokens", g.cached_tokens}};
    return u;
  }

  // ---- generation ---------------------------------------------------------------------------
  struct Prepared {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::string> prompt_texts;
    SamplingParams params;
    bool max_tokens_given = false;
    int default_max_tokens = -1;  // -1: max_model_len - prompt
    // Anthropic Messages and Responses: a max_tokens above the room left in the context (Claude Code asks for
    // 32000) is lowered to that room and to the generation config's max_new_tokens, as vLLM's get_max_tokens
    // does, instead of refused.
    bool clamp_max_tokens = false;
  };

  SamplingParams base_params() const {
    SamplingParams p;
    const auto& d = opt.defaults;
    if (d.temperature) p.temperature = *d.temperature;
    if (d.top_p) p.top_p = *d.top_p;
    if (d.top_k) p.top_k = *d.top_k;
    if (d.min_p) p.min_p = *d.min_p;
    if (d.repetition_penalty) p.repetition_penalty = *d.repetition_penalty;
    return p;
  }

  static constexpr const char* kSamplingFields[] = {"max_tokens",
                                                    "max_completion_tokens",
                                                    "temperature",
                                                    "top_p",
                                                    "top_k",
                                                    "min_p",
                                                    "presence_penalty",
                                                    "frequency_penalty",
                                                    "repetition_penalty",
                                                    "n",
                                                    "min_tokens",
                                                    "seed",
                                                    "ignore_eos",
                                                    "stop",
                                                    "stop_token_ids",
                                                    "logprobs",
                                                    "top_logprobs",
                                                    "logit_bias"};

  void read_params(const ojson& body, Prepared& pr) {
    pr.params = base_params();
    // Only the sampling fields cross over (the whole body was copied before, recursively).
    json fields = json::object();
    for (const char* k : kSamplingFields)
      if (auto it = body.find(k); it != body.end()) fields[k] = json(*it);
    Status s = sampling_params_from_json(fields, pr.params);
    if (!s.ok()) bad(s.message());
    if (const ojson* bo = field(body, "best_of"); bo && !(bo->is_number_integer() && *bo == 1))
      bad("'best_of' is not supported; use 'n' for several completions", "best_of");
    pr.max_tokens_given = field(body, "max_tokens") || field(body, "max_completion_tokens");
    if (pr.params.n < 1 || pr.params.n > opt.max_n)
      bad(fmt::format("'n' must be between 1 and {}, got {}", opt.max_n, pr.params.n), "n");
  }

  // vLLM's context-length checks, with its wording.
  void fit_max_tokens(const Prepared& pr, size_t prompt_len, SamplingParams& p) {
    const int L = engine.max_model_len();
    const int P = static_cast<int>(prompt_len);
    if (P >= L)
      bad(fmt::format("This model's maximum context length is {} tokens. However, your request has {} input tokens. "
                      "Please reduce the length of the input messages.",
                      L, P),
          "messages");
    if (pr.max_tokens_given && pr.clamp_max_tokens) {
      p.max_tokens = std::max(1, std::min(pr.params.max_tokens, L - P));
      if (opt.defaults.max_tokens) p.max_tokens = std::max(1, std::min(p.max_tokens, *opt.defaults.max_tokens));
    } else if (pr.max_tokens_given) {
      if (P + pr.params.max_tokens > L)
        bad(fmt::format("'max_tokens' or 'max_completion_tokens' is too large: {}. This model's maximum context length "
                        "is {} tokens and your request has {} input tokens ({} > {} - {}).",
                        pr.params.max_tokens, L, P, pr.params.max_tokens, L, P),
            "max_tokens");
      p.max_tokens = pr.params.max_tokens;
    } else {
      int room = L - P;
      int def = pr.default_max_tokens > 0 ? pr.default_max_tokens : room;
      if (opt.defaults.max_tokens && pr.default_max_tokens <= 0) def = *opt.defaults.max_tokens;
      p.max_tokens = std::max(1, std::min(def, room));
    }
  }

  void start_generation(std::shared_ptr<Gen> g, Prepared& pr) {
    const size_t P = pr.prompts.size();
    g->n = pr.params.n;
    g->logprobs = pr.params.logprobs;
    g->stop_token_ids = pr.params.stop_token_ids;
    g->prompt_tokens.assign(P, 0);
    g->prompt_texts = pr.prompt_texts;
    g->choices.resize(P * static_cast<size_t>(g->n));
    g->remaining = static_cast<int>(g->choices.size());
    std::vector<SamplingParams> per_prompt;
    for (size_t p = 0; p < P; ++p) {
      SamplingParams sp = pr.params;
      fit_max_tokens(pr, pr.prompts[p].size(), sp);
      per_prompt.push_back(sp);
      g->prompt_tokens[p] = static_cast<int>(pr.prompts[p].size());
      g->engine_ids.push_back(P == 1 ? g->id : fmt::format("{}-{}", g->id, p));
    }
    // All prompts go in as one unit: queued together (one place in the waiting queue) or refused together.
    std::vector<GenerationRequest> reqs;
    std::vector<OutputCallback> callbacks;
    for (size_t p = 0; p < P; ++p) {
      reqs.push_back(GenerationRequest{g->engine_ids[p], std::move(pr.prompts[p]), per_prompt[p]});
      const int prompt_index = static_cast<int>(p);
      callbacks.emplace_back([g, prompt_index](const StreamDelta& d) {
        // Engine thread: copy and hand over to the connection's strand.
        g->ex->post([g, prompt_index, d] { g->api->on_delta(*g, prompt_index, d); });
      });
    }
    SubmitResult r = engine.submit(std::move(reqs), std::move(callbacks));
    if (!r.ok()) {
      g->complete = true;
      metrics.request_rejected();
      switch (r.error) {
        case SubmitError::kInvalid:
          bad(r.message);
        case SubmitError::kOverloaded:
          throw ApiError{429, r.message, {}, {{"Retry-After", std::to_string(opt.retry_after_seconds)}}};
        case SubmitError::kDraining:
        case SubmitError::kDead:
        default:
          throw ApiError{503, r.message, {}, {{"Retry-After", std::to_string(opt.retry_after_seconds)}}};
      }
    }
    // A client that goes away aborts its requests (the engine frees their blocks on its next loop turn).
    std::weak_ptr<Gen> wg = g;
    g->ex->on_disconnect([wg, this] {
      if (auto gg = wg.lock())
        for (const auto& id : gg->engine_ids) engine.abort(id);
    });
    if (g->stream) begin_stream(*g);
  }

  // ---- streaming ------------------------------------------------------------------------------
  static std::string sse(const ojson& j) { return "data: " + dump(j) + "\n\n"; }
  static std::string event(const char* name, const ojson& j) {
    return fmt::format("event: {}\ndata: {}\n\n", name, dump(j));
  }

  ojson chunk_head(const Gen& g) const {
    return ojson{{"id", g.id},
                 {"object", g.kind == Kind::kChat ? "chat.completion.chunk" : "text_completion"},
                 {"created", g.created},
                 {"model", g.model}};
  }

  void begin_stream(Gen& g) {
    g.ex->start_stream(200, "text/event-stream; charset=utf-8", {});
    std::string out;
    if (g.kind == Kind::kChat) {
      for (size_t c = 0; c < g.choices.size(); ++c) {
        ojson j = chunk_head(g);
        j["choices"] = ojson::array({ojson{{"index", c},
                                           {"delta", {{"role", "assistant"}, {"content", ""}}},
                                           {"logprobs", nullptr},
                                           {"finish_reason", nullptr}}});
        out += sse(j);
      }
    } else if (g.kind == Kind::kCompletion && g.echo) {
      for (size_t c = 0; c < g.choices.size(); ++c) {
        ojson j = chunk_head(g);
        j["choices"] = ojson::array({ojson{{"index", c},
                                           {"text", g.prompt_texts[c / static_cast<size_t>(g.n)]},
                                           {"logprobs", nullptr},
                                           {"finish_reason", nullptr}}});
        out += sse(j);
      }
    } else if (g.kind == Kind::kMessages) {
      ojson msg{{"id", g.id},
                {"type", "message"},
                {"role", "assistant"},
                {"model", g.model},
                {"content", ojson::array()},
                {"stop_reason", nullptr},
                {"stop_sequence", nullptr},
                {"usage", {{"input_tokens", g.prompt_tokens[0]}, {"output_tokens", 0}}}};
      out += event("message_start", {{"type", "message_start"}, {"message", msg}});
      if (g.parsers.empty()) out += open_block(g, "text", {{"type", "text"}, {"text", ""}});
      // else blocks open as the parsers find thinking, text and tool calls
    } else if (g.kind == Kind::kResponses) {
      out += g.responses->start();
    }
    if (!out.empty()) g.ex->write(std::move(out));
  }

  // Closes the open Anthropic content block (if any) and opens a new one.
  static std::string open_block(Gen& g, const char* type, const ojson& block) {
    std::string out;
    if (g.block_index >= 0)
      out += event("content_block_stop", {{"type", "content_block_stop"}, {"index", g.block_index}});
    ++g.block_index;
    g.block_type = type;
    out += event("content_block_start",
                 {{"type", "content_block_start"}, {"index", g.block_index}, {"content_block", block}});
    return out;
  }

  // Anthropic stream events for one parsed delta: thinking_delta, text_delta, tool_use + input_json_delta.
  std::string anthropic_parsed_events(Gen& g, const ChatDelta& cd) {
    std::string out;
    if (!cd.reasoning.empty()) {
      if (g.block_type != "thinking") out += open_block(g, "thinking", {{"type", "thinking"}, {"thinking", ""}});
      out += event("content_block_delta", {{"type", "content_block_delta"},
                                           {"index", g.block_index},
                                           {"delta", {{"type", "thinking_delta"}, {"thinking", cd.reasoning}}}});
    }
    if (!cd.content.empty()) {
      if (g.block_type != "text") out += open_block(g, "text", {{"type", "text"}, {"text", ""}});
      out += event("content_block_delta", {{"type", "content_block_delta"},
                                           {"index", g.block_index},
                                           {"delta", {{"type", "text_delta"}, {"text", cd.content}}}});
    }
    for (const auto& tc : cd.tool_calls) {
      if (tc.first())
        out += open_block(g, "tool_use",
                          {{"type", "tool_use"}, {"id", tc.id}, {"name", tc.name}, {"input", ojson::object()}});
      if (!tc.arguments.empty() && g.block_type == "tool_use")
        out +=
            event("content_block_delta", {{"type", "content_block_delta"},
                                          {"index", g.block_index},
                                          {"delta", {{"type", "input_json_delta"}, {"partial_json", tc.arguments}}}});
    }
    return out;
  }

  static std::string anthropic_stop_reason(const Choice& c) {
    if (c.finish_reason == "length") return "max_tokens";
    if (!c.stop_string.empty()) return "stop_sequence";
    return "end_turn";
  }

  // One detokenized delta through choice ci's reasoning / tool-call parsers (the parsers' tail on the last).
  static ChatDelta parse_delta(Gen& g, size_t ci, const StreamDelta& d, bool has_text) {
    ChatOutputParser& parser = *g.parsers[ci];
    ChatDelta cd = has_text ? parser.push(d.text) : ChatDelta{};
    if (d.finished) {
      ChatDelta tail = parser.finish();
      cd.reasoning += tail.reasoning;
      cd.content += tail.content;
      cd.tool_calls.insert(cd.tool_calls.end(), tail.tool_calls.begin(), tail.tool_calls.end());
    }
    if (parser.tools_called()) g.tools_called[ci] = true;
    return cd;
  }

  ResponsesUsage responses_usage(const Gen& g) const {
    ResponsesUsage u;
    u.input_tokens = g.prompt_tokens[0];
    u.cached_tokens = g.cached_tokens;
    u.output_tokens = static_cast<int>(g.choices[0].token_ids.size());
    const std::string& reasoning = g.responses->reasoning_text();
    // The reasoning part's tokens, counted by encoding its text (the parsers work on text, not token ids).
    if (!reasoning.empty())
      u.reasoning_tokens = std::min(u.output_tokens, static_cast<int>(tok.encode(reasoning, false).size()));
    return u;
  }

  void stream_delta(Gen& g, size_t ci, const StreamDelta& d, const std::vector<TokenLogprob>& lps) {
    Choice& c = g.choices[ci];
    std::string out;
    const bool has_text = !d.text.empty() && d.finish_reason != FinishReason::kError;
    if (g.kind == Kind::kResponses) {
      ChatDelta cd;
      if (!g.parsers.empty())
        cd = parse_delta(g, 0, d, has_text);
      else if (has_text)
        cd.content = d.text;
      out += g.responses->push(cd);
    } else if (g.kind == Kind::kMessages && !g.parsers.empty()) {
      out += anthropic_parsed_events(g, parse_delta(g, 0, d, has_text));
    } else if (g.kind == Kind::kMessages) {
      if (has_text)
        out += event(
            "content_block_delta",
            {{"type", "content_block_delta"}, {"index", 0}, {"delta", {{"type", "text_delta"}, {"text", d.text}}}});
    } else if (has_text || !lps.empty() || d.finished) {
      if (d.finished && d.finish_reason == FinishReason::kError) {
        out += sse(openai_error(500, "generation failed: " + c.error));
      } else {
        ojson j = chunk_head(g);
        ojson choice{{"index", ci}};
        if (g.kind == Kind::kChat && !g.parsers.empty()) {
          ChatDelta cd = parse_delta(g, ci, d, has_text);
          if (cd.empty() && lps.empty() && !d.finished) return;
          ojson delta = ojson::object();
          if (!cd.reasoning.empty()) delta["reasoning_content"] = cd.reasoning;
          if (!cd.content.empty()) delta["content"] = cd.content;
          if (!cd.tool_calls.empty()) delta["tool_calls"] = tool_call_deltas_json(cd.tool_calls);
          choice["delta"] = delta;
          choice["logprobs"] = g.logprobs >= 0 && !lps.empty() ? chat_logprobs(lps, g.logprobs) : ojson(nullptr);
          if (d.finished && g.tools_called[ci] && c.finish_reason == "stop") c.finish_reason = "tool_calls";
        } else if (g.kind == Kind::kChat) {
          choice["delta"] = has_text ? ojson{{"content", d.text}} : ojson::object();
          choice["logprobs"] = g.logprobs >= 0 && !lps.empty() ? chat_logprobs(lps, g.logprobs) : ojson(nullptr);
        } else {
          choice["text"] = has_text ? d.text : "";
          size_t offset = c.text.size() - (has_text ? d.text.size() : 0);
          choice["logprobs"] =
              g.logprobs >= 0 && !lps.empty() ? completion_logprobs(lps, g.logprobs, offset) : ojson(nullptr);
        }
        choice["finish_reason"] = d.finished ? ojson(c.finish_reason) : ojson(nullptr);
        if (d.finished) choice["stop_reason"] = c.stop_reason;
        j["choices"] = ojson::array({choice});
        if (g.include_usage && g.continuous_usage) j["usage"] = usage(g);
        out += sse(j);
      }
    }
    if (!out.empty()) g.ex->write(std::move(out));
  }

  void on_delta(Gen& g, int prompt_index, const StreamDelta& d) {
    if (g.complete) return;
    try {
      const size_t ci = static_cast<size_t>(prompt_index) * static_cast<size_t>(g.n) + static_cast<size_t>(d.index);
      if (ci >= g.choices.size()) return;
      Choice& c = g.choices[ci];
      if (c.done) return;
      if (d.prompt_tokens > 0) g.prompt_tokens[static_cast<size_t>(prompt_index)] = d.prompt_tokens;
      if (d.cached_tokens > 0 && d.index == 0) g.cached_tokens = std::max(g.cached_tokens, d.cached_tokens);
      if (d.first_token_latency > 0 && g.ttft == 0) g.ttft = d.first_token_latency;
      if (d.finish_reason != FinishReason::kError) c.text += d.text;
      c.token_ids.insert(c.token_ids.end(), d.token_ids.begin(), d.token_ids.end());
      if (g.logprobs >= 0) c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
      if (d.finished) {
        c.done = true;
        c.finish_reason = finish_reason_name(d.finish_reason);
        if (d.finish_reason == FinishReason::kError) c.error = d.text;
        if (!d.stop_string.empty()) {
          c.stop_reason = d.stop_string;
          c.stop_string = d.stop_string;
        } else if (d.stop_token && std::find(g.stop_token_ids.begin(), g.stop_token_ids.end(), *d.stop_token) !=
                                       g.stop_token_ids.end()) {
          c.stop_reason = *d.stop_token;
        }
        --g.remaining;
      }
      if (g.stream) stream_delta(g, ci, d, d.logprobs);
      if (g.remaining == 0) finalize(g);
    } catch (const std::exception& e) {
      TLOG_ERROR("request {}: failed while handling output: {}", g.id, e.what());
      for (const auto& id : g.engine_ids) engine.abort(id);
      g.complete = true;
      if (g.stream) {
        g.ex->write(sse(openai_error(500, std::string("internal error: ") + e.what())));
        g.ex->finish();
      } else {
        g.ex->respond(json_response(500, openai_error(500, std::string("internal error: ") + e.what())));
      }
    }
  }

  void finalize(Gen& g) {
    g.complete = true;
    const double e2e = std::chrono::duration<double>(Clock::now() - g.start).count();
    std::string reason = g.choices.empty() ? "stop" : g.choices[0].finish_reason;
    int completion = 0;
    for (const auto& c : g.choices) {
      completion += static_cast<int>(c.token_ids.size());
      if (c.finish_reason == "abort" || c.finish_reason == "error") reason = c.finish_reason;
    }
    metrics.request_finished(reason, e2e, g.ttft, completion);
    if (g.stream) {
      std::string out;
      if (g.kind == Kind::kMessages) {
        const Choice& c = g.choices[0];
        if (g.block_index < 0) out += open_block(g, "text", {{"type", "text"}, {"text", ""}});
        out += event("content_block_stop", {{"type", "content_block_stop"}, {"index", g.block_index}});
        std::string stop_reason = anthropic_stop_reason(c);
        if (!g.tools_called.empty() && g.tools_called[0] && stop_reason == "end_turn") stop_reason = "tool_use";
        out += event("message_delta",
                     {{"type", "message_delta"},
                      {"delta",
                       {{"stop_reason", stop_reason},
                        {"stop_sequence", c.stop_string.empty() ? ojson(nullptr) : ojson(c.stop_string)}}},
                      {"usage", {{"output_tokens", c.token_ids.size()}}}});
        out += event("message_stop", {{"type", "message_stop"}});
      } else if (g.kind == Kind::kResponses) {
        out += g.responses->finish(g.choices[0].finish_reason, responses_usage(g), g.choices[0].error);
      } else {
        if (g.include_usage) {
          ojson j = chunk_head(g);
          j["choices"] = ojson::array();
          j["usage"] = usage(g);
          out += sse(j);
        }
        out += "data: [DONE]\n\n";
      }
      g.ex->write(std::move(out));
      g.ex->finish();
      return;
    }
    for (const auto& c : g.choices)
      if (c.finish_reason == "error") {
        g.ex->respond(json_response(500, openai_error(500, "generation failed: " + c.error)));
        return;
      }
    ojson body;
    if (g.kind == Kind::kResponses) {
      const Choice& c = g.choices[0];
      if (!g.parsers.empty()) {
        g.responses->add(g.parsers[0]->parse(c.text));
      } else {
        ChatParseResult r;
        r.content = c.text;
        g.responses->add(r);
      }
      body = g.responses->response(c.finish_reason, responses_usage(g));
    } else if (g.kind == Kind::kMessages) {
      const Choice& c = g.choices[0];
      ojson content = ojson::array();
      std::string stop_reason = anthropic_stop_reason(c);
      if (!g.parsers.empty()) {
        // Reasoning -> a thinking block, tool calls -> tool_use blocks.
        ChatParseResult r = g.parsers[0]->parse(c.text);
        if (!r.reasoning.empty())
          content.push_back({{"type", "thinking"}, {"thinking", r.reasoning}, {"signature", ""}});
        if (!r.content.empty()) content.push_back({{"type", "text"}, {"text", r.content}});
        for (const auto& call : r.tool_calls) {
          ojson input = ojson::parse(call.arguments, nullptr, false);
          if (input.is_discarded() || !input.is_object()) input = ojson::object();
          content.push_back({{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", input}});
        }
        if (r.tools_called() && stop_reason == "end_turn") stop_reason = "tool_use";
      } else {
        content.push_back({{"type", "text"}, {"text", c.text}});
      }
      body = {{"id", g.id},
              {"type", "message"},
              {"role", "assistant"},
              {"model", g.model},
              {"content", content},
              {"stop_reason", stop_reason},
              {"stop_sequence", c.stop_string.empty() ? ojson(nullptr) : ojson(c.stop_string)},
              {"usage", {{"input_tokens", g.prompt_tokens[0]}, {"output_tokens", c.token_ids.size()}}}};
    } else {
      ojson choices = ojson::array();
      for (size_t i = 0; i < g.choices.size(); ++i) {
        const Choice& c = g.choices[i];
        if (g.kind == Kind::kChat && !g.parsers.empty()) {
          ChatParseResult r = g.parsers[i]->parse(c.text);
          ojson message{{"role", "assistant"},
                        {"content", r.content.empty() && r.tools_called() ? ojson(nullptr) : ojson(r.content)}};
          message["reasoning_content"] = r.reasoning.empty() ? ojson(nullptr) : ojson(r.reasoning);
          message["tool_calls"] = tool_calls_json(r.tool_calls);
          std::string finish = c.finish_reason;
          if (r.tools_called() && finish == "stop") finish = "tool_calls";
          choices.push_back({{"index", i},
                             {"message", message},
                             {"logprobs", g.logprobs >= 0 ? chat_logprobs(c.logprobs, g.logprobs) : ojson(nullptr)},
                             {"finish_reason", finish},
                             {"stop_reason", c.stop_reason}});
        } else if (g.kind == Kind::kChat) {
          choices.push_back({{"index", i},
                             {"message", {{"role", "assistant"}, {"content", c.text}, {"tool_calls", ojson::array()}}},
                             {"logprobs", g.logprobs >= 0 ? chat_logprobs(c.logprobs, g.logprobs) : ojson(nullptr)},
                             {"finish_reason", c.finish_reason},
                             {"stop_reason", c.stop_reason}});
        } else {
          std::string prefix = g.echo ? g.prompt_texts[i / static_cast<size_t>(g.n)] : std::string();
          choices.push_back({{"index", i},
                             {"text", prefix + c.text},
                             {"logprobs", g.logprobs >= 0 ? completion_logprobs(c.logprobs, g.logprobs, prefix.size())
                                                          : ojson(nullptr)},
                             {"finish_reason", c.finish_reason},
                             {"stop_reason", c.stop_reason}});
        }
      }
      body = {{"id", g.id},           {"object", g.kind == Kind::kChat ? "chat.completion" : "text_completion"},
              {"created", g.created}, {"model", g.model},
              {"choices", choices},   {"usage", usage(g)}};
    }
    g.ex->respond(json_response(200, body));
  }

  std::shared_ptr<Gen> new_gen(Kind kind, const std::shared_ptr<Exchange>& ex, const ojson& body) {
    auto g = std::make_shared<Gen>();
    owner->active_++;
    g->api = this;
    g->ex = ex;
    g->kind = kind;
    g->created = unix_now();
    const ojson* m = field(body, "model");
    g->model = m && m->is_string() ? m->get<std::string>() : opt.served_model_names.front();
    g->id = (kind == Kind::kChat         ? "chatcmpl-"
             : kind == Kind::kCompletion ? "cmpl-"
             : kind == Kind::kResponses  ? "resp_"
                                         : "msg_") +
            random_hex(32);
    g->stream = get_bool(body, "stream", false);
    if (const ojson* so = field(body, "stream_options")) {
      if (!so->is_object()) bad("'stream_options' must be an object", "stream_options");
      g->include_usage = get_bool(*so, "include_usage", false);
      g->continuous_usage = get_bool(*so, "continuous_usage_stats", false);
    }
    return g;
  }

  // ---- chat -------------------------------------------------------------------------------------
  static void check_messages(const ojson& msgs, int max_messages) {
    if (!msgs.is_array()) bad("'messages' must be a list of message objects", "messages");
    if (msgs.empty()) bad("'messages' must contain at least one message", "messages");
    if (static_cast<int>(msgs.size()) > max_messages)
      bad(fmt::format("'messages' has {} entries; this server accepts at most {}", msgs.size(), max_messages),
          "messages");
    for (size_t i = 0; i < msgs.size(); ++i) {
      const ojson& m = msgs[i];
      if (!m.is_object()) bad(fmt::format("messages[{}] must be an object", i), "messages");
      auto r = m.find("role");
      if (r == m.end() || !r->is_string()) bad(fmt::format("messages[{}].role must be a string", i), "messages");
      const std::string role = r->get<std::string>();
      if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer" &&
          role != "function")
        bad(fmt::format("messages[{}].role '{}' is not one of system, developer, user, assistant, tool", i, role),
            "messages");
      auto c = m.find("content");
      if (c != m.end() && !c->is_null() && !c->is_string() && !c->is_array())
        bad(fmt::format("messages[{}].content must be a string or a list of content parts", i), "messages");
      if (c != m.end() && c->is_array())
        for (size_t k = 0; k < c->size(); ++k) {
          const ojson& part = (*c)[k];
          auto type = part.is_object() ? part.find("type") : part.end();
          if (type != part.end() && type->is_string() && media_kind(type->get<std::string>()))
            bad(text_only_message(fmt::format("messages[{}].content[{}]", i, k), type->get<std::string>()), "messages");
          if (type != part.end() && type->is_string() && *type == "text") {
            auto text = part.find("text");
            if (text == part.end() || !text->is_string())
              bad(fmt::format("messages[{}].content[{}]: a text part needs 'text', a string", i, k), "messages");
          }
        }
      if (role == "tool") {
        auto id = m.find("tool_call_id");
        if (id == m.end() || !id->is_string())
          bad(fmt::format("messages[{}]: a tool message needs 'tool_call_id', a string", i), "messages");
      }
      if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null() && !tc->is_array())
        bad(fmt::format("messages[{}].tool_calls must be a list", i), "messages");
    }
  }

  void check_tools(const ojson& body, ToolChoicePlan* plan) {
    const ojson* tools = field(body, "tools");
    const ojson* choice = field(body, "tool_choice");
    if (tools) {
      if (!tools->is_array()) bad("'tools' must be a list of tool objects", "tools");
      if (tools->size() > 512) bad("'tools' has more than 512 entries", "tools");
      for (size_t i = 0; i < tools->size(); ++i) {
        const ojson& t = (*tools)[i];
        if (!t.is_object()) bad(fmt::format("tools[{}] must be an object", i), "tools");
        auto ty = t.find("type");
        if (ty != t.end() && !(ty->is_string() && *ty == "function"))
          bad(fmt::format("tools[{}].type must be \"function\"", i), "tools");
        auto f = t.find("function");
        if (f == t.end() || !f->is_object()) bad(fmt::format("tools[{}].function must be an object", i), "tools");
        auto name = f->find("name");
        if (name == f->end() || !name->is_string() || name->get<std::string>().empty())
          bad(fmt::format("tools[{}].function.name must be a non-empty string", i), "tools");
        auto params = f->find("parameters");
        if (params != f->end() && !params->is_null() && !params->is_object())
          bad(fmt::format("tools[{}].function.parameters must be a JSON Schema object", i), "tools");
      }
    }
    if (choice && !choice->is_string() && !choice->is_object())
      bad("'tool_choice' must be a string or an object", "tool_choice");
    Status st = plan_tool_choice(choice ? json(*choice) : json(nullptr), tools ? json(*tools) : json::array(),
                                 opt.enable_auto_tool_choice, !opt.tool_call_parser.empty(), plan);
    if (!st.ok()) bad(st.message(), "tool_choice");
  }

  std::string render_chat(const ojson& body) {
    if (!tmpl) bad("this model has no chat template; pass one with --chat-template, or use /v1/completions");
    check_messages(body.at("messages"), opt.max_messages);
    ojson request = tmpl->vllm_request(body);
    bool cont = get_bool(body, "continue_final_message", false);
    if (cont) {
      if (get_bool(body, "add_generation_prompt", false) && field(body, "add_generation_prompt"))
        bad("continue_final_message and add_generation_prompt cannot both be true");
      request["add_generation_prompt"] = false;
    }
    if (const ojson* k = field(body, "chat_template_kwargs"); k && !k->is_object())
      bad("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    tokenizer::jinja::RenderLimits limits;
    limits.max_output_bytes = opt.max_prompt_bytes;
    std::string prompt;
    Status s = tmpl->try_render(request, &prompt, limits);
    if (!s.ok()) bad("the chat template failed on this request: " + s.message(), "messages");
    if (cont) {
      // vLLM: the prompt ends right after the final (assistant) message's text.
      const ojson& last = body["messages"].back();
      if (last.contains("content") && last["content"].is_string()) {
        const std::string content = last["content"].get<std::string>();
        auto pos = prompt.rfind(content);
        if (!content.empty() && pos != std::string::npos) prompt.resize(pos + content.size());
      }
    }
    return prompt;
  }

  void chat(const ojson& body, Kind kind, const std::shared_ptr<Exchange>& ex, const ResponsesRequest* rq = nullptr) {
    const ojson* msgs = field(body, "messages");
    if (!msgs) bad("'messages' is required", "messages");
    ToolChoicePlan plan;
    check_tools(body, &plan);
    if (const ojson* rf = field(body, "response_format")) {
      if (!rf->is_object()) bad("'response_format' must be an object", "response_format");
      auto t = rf->find("type");
      if (t == rf->end() || !(t->is_string() && *t == "text"))
        bad("'response_format' (structured output / JSON mode) is not supported by tessera yet", "response_format");
    }
    Prepared pr;
    read_params(body, pr);
    pr.clamp_max_tokens = kind != Kind::kChat;
    std::string prompt = render_chat(body);
    const bool add_special = get_bool(body, "add_special_tokens", false);
    pr.prompts.push_back(tok.encode(prompt, add_special));
    pr.prompt_texts.push_back(std::move(prompt));
    auto g = new_gen(kind, ex, body);
    if (rq) g->responses = std::make_unique<ResponseBuilder>(g->id, g->model, g->created, *rq);
    if (!opt.reasoning_parser.empty() || plan.parse_tools) {
      ReasoningParserOptions ro;
      if (const ojson* k = field(body, "chat_template_kwargs"))
        if (auto it = k->find("enable_thinking"); it != k->end() && it->is_boolean())
          ro.enable_thinking = it->get<bool>();
      for (int i = 0; i < pr.params.n; ++i) {
        std::unique_ptr<ToolParser> tp;
        if (plan.parse_tools) {
          ToolParserOptions to;
          if (const ojson* t = field(body, "tools")) to.tools = json(*t);
          to.only_function = plan.only_function;
          tp = make_tool_parser(opt.tool_call_parser, std::move(to));
        }
        g->parsers.push_back(std::make_unique<ChatOutputParser>(
            opt.reasoning_parser.empty() ? nullptr : make_reasoning_parser(opt.reasoning_parser, ro), std::move(tp)));
      }
      g->tools_called.assign(static_cast<size_t>(pr.params.n), false);
    }
    start_generation(g, pr);
  }

  // ---- completions --------------------------------------------------------------------------------
  void completions(const ojson& body, const std::shared_ptr<Exchange>& ex) {
    const ojson* prompt = field(body, "prompt");
    if (!prompt) bad("'prompt' is required", "prompt");
    if (field(body, "suffix")) bad("'suffix' is not supported", "suffix");
    Prepared pr;
    read_params(body, pr);
    pr.default_max_tokens = 16;  // vLLM's and OpenAI's default for /v1/completions
    const bool add_special = get_bool(body, "add_special_tokens", true);
    const bool echo = get_bool(body, "echo", false);
    auto add_text = [&](const ojson& s) {
      if (s.get_ref<const std::string&>().size() > opt.max_prompt_bytes)
        bad(fmt::format("a prompt is longer than {} bytes", opt.max_prompt_bytes), "prompt");
      pr.prompts.push_back(tok.encode(s.get<std::string>(), add_special));
      pr.prompt_texts.push_back(s.get<std::string>());
    };
    auto add_ids = [&](const ojson& arr) {
      std::vector<int32_t> ids;
      for (const auto& t : arr) {
        if (!t.is_number_integer()) bad("'prompt' token ids must be integers", "prompt");
        int64_t v = t.get<int64_t>();
        if (v < 0 || v >= engine.vocab_size())
          bad(fmt::format("token id {} is outside the vocabulary (0..{})", v, engine.vocab_size() - 1), "prompt");
        ids.push_back(static_cast<int32_t>(v));
      }
      if (ids.empty()) bad("a prompt must not be empty", "prompt");
      if (echo)
        pr.prompt_texts.push_back(tok.decode(ids, false));
      else
        pr.prompt_texts.emplace_back();
      pr.prompts.push_back(std::move(ids));
    };
    if (prompt->is_string()) {
      add_text(*prompt);
    } else if (prompt->is_array()) {
      if (prompt->empty()) bad("'prompt' must not be an empty list", "prompt");
      if (static_cast<int>(prompt->size()) > opt.max_prompts && !(*prompt)[0].is_number_integer())
        bad(fmt::format("'prompt' has {} prompts; this server accepts at most {}", prompt->size(), opt.max_prompts),
            "prompt");
      const ojson& first = (*prompt)[0];
      if (first.is_number_integer())
        add_ids(*prompt);
      else {
        for (const auto& e : *prompt) {
          if (e.is_string())
            add_text(e);
          else if (e.is_array())
            add_ids(e);
          else
            bad("'prompt' must be a string, a list of strings, a list of token ids or a list of such lists", "prompt");
        }
      }
    } else {
      bad("'prompt' must be a string, a list of strings, a list of token ids or a list of such lists", "prompt");
    }
    for (const auto& p : pr.prompts)
      if (p.empty()) bad("a prompt encodes to no tokens; send some text", "prompt");
    if (pr.params.n * static_cast<int>(pr.prompts.size()) > opt.max_prompts)
      bad(fmt::format("n x prompts must be at most {}", opt.max_prompts), "n");
    auto g = new_gen(Kind::kCompletion, ex, body);
    g->echo = echo;
    start_generation(g, pr);
  }

  // ---- Anthropic Messages ---------------------------------------------------------------------------
  static std::string blocks_text(const ojson& content, const char* where) {
    if (content.is_null()) return {};
    if (content.is_string()) return content.get<std::string>();
    if (!content.is_array()) bad(fmt::format("{} must be a string or a list of content blocks", where));
    std::string s;
    for (const auto& b : content) {
      if (!b.is_object() || !b.contains("type")) bad(fmt::format("{}: each content block needs a type", where));
      if (b["type"] == "text") {
        if (!b.contains("text") || !b["text"].is_string()) bad(fmt::format("{}: a text block needs 'text'", where));
        if (!s.empty()) s += "\n";
        s += b["text"].get<std::string>();
      } else if (b["type"].is_string() && media_kind(b["type"].get<std::string>())) {
        bad(text_only_message(where, b["type"].get<std::string>()), "messages");
      } else {
        bad(fmt::format("{}: content blocks of type {} are not supported here", where, b["type"].dump()));
      }
    }
    return s;
  }

  // Anthropic tool_choice -> OpenAI tool_choice: auto, any (-> required), tool (-> the named function), none.
  static ojson anthropic_tool_choice(const ojson* c) {
    if (!c) return "auto";
    const ojson* type = c->is_object() ? field(*c, "type") : nullptr;
    if (!type || !type->is_string()) bad("tool_choice: must be an object with a type", "tool_choice");
    const std::string t = type->get<std::string>();
    if (t == "auto" || t == "none") return t;
    if (t == "any") return "required";
    if (t == "tool") {
      const ojson* name = field(*c, "name");
      if (!name || !name->is_string()) bad("tool_choice: a choice of type 'tool' needs the tool's name", "tool_choice");
      return ojson{{"type", "function"}, {"function", {{"name", *name}}}};
    }
    bad(fmt::format("tool_choice.type: '{}' is not one of auto, any, tool, none", t), "tool_choice");
  }

  // Anthropic Messages request -> OpenAI chat request (system, tool_use/tool_result as tool calls).
  ojson messages_to_chat(const ojson& body) {
    const ojson* mt = field(body, "max_tokens");
    if (!mt) bad("max_tokens: Field required", "max_tokens");
    if (!mt->is_number_integer() || mt->get<int64_t>() < 1) bad("max_tokens: must be a positive integer", "max_tokens");
    if (body.contains("n")) bad("n: Extra inputs are not permitted (the Messages API has no 'n')", "n");
    if (const ojson* t = field(body, "temperature");
        t && t->is_number() && !(t->get<double>() >= 0 && t->get<double>() <= 1))
      bad("temperature: must be between 0 and 1", "temperature");
    const ojson* msgs = field(body, "messages");
    if (!msgs) bad("messages: Field required", "messages");
    if (!msgs->is_array() || msgs->empty()) bad("messages: must be a non-empty list", "messages");
    if (static_cast<int>(msgs->size()) > opt.max_messages)
      bad(fmt::format("messages: at most {} are accepted", opt.max_messages), "messages");
    ojson out = ojson::array();
    std::vector<std::string> tool_use_ids;  // a tool_result must answer one of these
    if (const ojson* sys = field(body, "system"))
      out.push_back({{"role", "system"}, {"content", blocks_text(*sys, "system")}});
    for (size_t i = 0; i < msgs->size(); ++i) {
      const ojson& m = (*msgs)[i];
      const std::string where = fmt::format("messages.{}", i);
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        bad(where + ": each message needs a role", "messages");
      const std::string role = m["role"].get<std::string>();
      if (role != "user" && role != "assistant" && role != "system")
        bad(fmt::format("{}.role: '{}' is not one of user, assistant, system", where, role), "messages");
      if (!m.contains("content")) bad(where + ".content: Field required", "messages");
      const ojson& content = m["content"];
      if (role == "system") {  // Claude Code's mid-conversation system messages, kept in their place
        out.push_back({{"role", "system"}, {"content", blocks_text(content, where.c_str())}});
        continue;
      }
      if (content.is_string()) {
        out.push_back({{"role", role}, {"content", content}});
        continue;
      }
      if (!content.is_array()) bad(where + ".content must be a string or a list of blocks", "messages");
      std::string text, reasoning;
      ojson tool_calls = ojson::array();
      for (const auto& b : content) {
        if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
          bad(where + ": each content block needs a type", "messages");
        const std::string type = b["type"].get<std::string>();
        if (type == "text") {
          if (!b.contains("text") || !b["text"].is_string()) bad(where + ": a text block needs 'text'", "messages");
          if (!text.empty()) text += "\n";
          text += b["text"].get<std::string>();
        } else if (type == "tool_use" && role == "assistant") {
          if (!b.contains("name") || !b["name"].is_string()) bad(where + ": a tool_use block needs a name", "messages");
          if (b.contains("id") && !b["id"].is_string())
            bad(where + ": a tool_use block's id must be a string", "messages");
          ojson input = b.contains("input") ? b["input"] : ojson::object();
          if (!input.is_object()) bad(where + ": a tool_use block's input must be an object", "messages");
          std::string id = b.contains("id") ? b["id"].get<std::string>() : "toolu_" + random_hex(24);
          tool_use_ids.push_back(id);
          tool_calls.push_back(
              {{"id", id}, {"type", "function"}, {"function", {{"name", b["name"]}, {"arguments", dump(input)}}}});
        } else if (type == "tool_result" && role == "user") {
          if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
            bad(where + ": a tool_result block needs tool_use_id", "messages");
          if (std::find(tool_use_ids.begin(), tool_use_ids.end(), b["tool_use_id"].get<std::string>()) ==
              tool_use_ids.end())
            bad(fmt::format("{}: tool_result block's tool_use_id '{}' matches no earlier tool_use block", where,
                            b["tool_use_id"].get<std::string>()),
                "messages");
          out.push_back({{"role", "tool"},
                         {"tool_call_id", b["tool_use_id"]},
                         {"content", blocks_text(b.contains("content") ? b["content"] : ojson(""), where.c_str())}});
        } else if (type == "thinking" && role == "assistant") {
          reasoning += b.value("thinking", "");
        } else if (type == "redacted_thinking") {
          // nothing to render
        } else if (media_kind(type)) {
          bad(text_only_message(where + ".content", type), "messages");
        } else {
          bad(fmt::format("{}: content blocks of type '{}' are not supported", where, type), "messages");
        }
      }
      if (role == "assistant") {
        ojson a{{"role", "assistant"}, {"content", text}};
        if (!tool_calls.empty()) a["tool_calls"] = tool_calls;
        if (!reasoning.empty()) a["reasoning_content"] = reasoning;
        out.push_back(a);
      } else if (!text.empty()) {
        out.push_back({{"role", "user"}, {"content", text}});
      }
    }
    ojson chat{{"messages", out}, {"max_tokens", *mt}};
    for (const char* k : {"model", "temperature", "top_p", "top_k", "stream"})
      if (const ojson* v = field(body, k)) chat[k] = *v;
    if (const ojson* ss = field(body, "stop_sequences")) {
      if (!ss->is_array()) bad("stop_sequences: must be a list of strings", "stop_sequences");
      chat["stop"] = *ss;
    }
    if (const ojson* tools = field(body, "tools")) {
      if (!tools->is_array()) bad("tools: must be a list", "tools");
      ojson ts = ojson::array();
      for (const auto& t : *tools) {
        if (!t.is_object() || !t.contains("name") || !t["name"].is_string())
          bad("tools: each tool needs a name", "tools");
        if (t.contains("input_schema") && !t["input_schema"].is_object())
          bad("tools: input_schema must be a JSON Schema object", "tools");
        ojson f{{"name", t["name"]}};
        if (t.contains("description")) f["description"] = t["description"];
        f["parameters"] = t.contains("input_schema") ? t["input_schema"] : ojson::object();
        ts.push_back({{"type", "function"}, {"function", f}});
      }
      if (!ts.empty()) {
        chat["tools"] = ts;
        chat["tool_choice"] = anthropic_tool_choice(field(body, "tool_choice"));
      }
    }
    // thinking {"type": "enabled", "budget_tokens": N} / {"type": "adaptive"} / {"type": "disabled"} -> the
    // chat template's enable_thinking switch (the budget is not enforced: the model decides when to stop).
    if (const ojson* th = field(body, "thinking")) {
      const ojson* type = th->is_object() ? field(*th, "type") : nullptr;
      if (!type || !type->is_string() || (*type != "enabled" && *type != "adaptive" && *type != "disabled"))
        bad("thinking.type: must be one of enabled, adaptive, disabled", "thinking");
      chat["chat_template_kwargs"] = {{"enable_thinking", *type != "disabled"}};
    }
    // Fields Claude Code sends that have no meaning for a self-hosted model are ignored (listed in
    // docs/server.md): metadata, context_management, output_config, service_tier, container, mcp_servers.
    return chat;
  }

  void messages(const ojson& body, const std::shared_ptr<Exchange>& ex) {
    ojson chat_body = messages_to_chat(body);
    chat(chat_body, Kind::kMessages, ex);
  }

  // OpenAI Responses API: translated to a chat request (responses_api.cpp), generated as chat is.
  void responses(const ojson& body, const std::shared_ptr<Exchange>& ex) {
    ResponsesRequest rq = responses_to_chat(body);
    if (!rq.ignored_tools.empty())
      TLOG_DEBUG("/v1/responses: ignoring tools this server cannot run: {}", fmt::join(rq.ignored_tools, ", "));
    chat(rq.chat, Kind::kResponses, ex, &rq);
  }

  void count_tokens(const ojson& body, const std::shared_ptr<Exchange>& ex) {
    ojson b = body;
    if (!b.contains("max_tokens")) b["max_tokens"] = 1;
    ojson chat_body = messages_to_chat(b);
    std::string prompt = render_chat(chat_body);
    ex->respond(json_response(200, {{"input_tokens", tok.encode(prompt, false).size()}}));
  }

  // ---- vLLM extras --------------------------------------------------------------------------------
  void tokenize(const ojson& body, const std::shared_ptr<Exchange>& ex) {
    std::vector<int32_t> ids;
    if (field(body, "messages")) {
      std::string prompt = render_chat(body);
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
    ex->respond(json_response(200, r));
  }

  void detokenize(const ojson& body, const std::shared_ptr<Exchange>& ex) {
    const ojson* t = field(body, "tokens");
    if (!t || !t->is_array()) bad("'tokens' must be a list of token ids", "tokens");
    std::vector<int32_t> ids;
    for (const auto& v : *t) {
      if (!v.is_number_integer()) bad("'tokens' must be a list of token ids", "tokens");
      int64_t id = v.get<int64_t>();
      if (id < 0 || id >= static_cast<int64_t>(std::max<size_t>(tok.vocab_size(), engine.vocab_size())))
        bad(fmt::format("token id {} is outside the vocabulary", id), "tokens");
      ids.push_back(static_cast<int32_t>(id));
    }
    ex->respond(json_response(200, {{"prompt", tok.decode(ids, false)}}));
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

  // ---- routing ----------------------------------------------------------------------------------
  void handle(HttpRequest&& r, const std::shared_ptr<Exchange>& ex) {
    const std::string& path = r.path;
    const Api api = path.rfind("/v1/messages", 0) == 0 ? Api::kAnthropic : Api::kOpenAI;
    try {
      struct Route {
        const char* path;
        const char* method;
      };
      static const Route routes[] = {{"/health", "GET"},
                                     {"/ping", "GET"},
                                     {"/version", "GET"},
                                     {"/metrics", "GET"},
                                     {"/v1/models", "GET"},
                                     {"/v1/chat/completions", "POST"},
                                     {"/v1/completions", "POST"},
                                     {"/v1/messages", "POST"},
                                     {"/v1/messages/count_tokens", "POST"},
                                     {"/tokenize", "POST"},
                                     {"/detokenize", "POST"},
                                     {"/v1/responses", "POST"},
                                     {"/", "GET"}};
      // With a key set, everything under /v1 needs it before anything else is said, so that the routes
      // cannot be listed without one (vLLM's middleware does the same).
      const bool open = path == "/health" || path == "/ping" || path == "/version" || path == "/metrics" || path == "/";
      if ((path == "/v1" || path.rfind("/v1/", 0) == 0) && !authorized(r)) throw unauthorized(api);
      const Route* route = nullptr;
      for (const auto& rt : routes)
        if (path == rt.path) route = &rt;
      if (!route && path.rfind("/v1/models/", 0) == 0) {
        static const Route model_route{"/v1/models/", "GET"};
        route = &model_route;
      }
      if (!route) throw ApiError{404, fmt::format("{} {} is not an endpoint of this server", r.method, path), {}, {}};
      if (r.method != route->method && !(r.method == "HEAD" && std::string(route->method) == "GET"))
        throw ApiError{405,
                       fmt::format("{} is not allowed on {}; use {}", r.method, path, route->method),
                       {},
                       {{"Allow", route->method}}};
      if (!open && !authorized(r)) throw unauthorized(api);

      if (path == "/health" || path == "/ping") {
        auto st = engine.stats();
        if (!st.alive) throw ApiError{503, "the engine stopped after an error: " + st.fatal_error, {}, {}};
        if (owner->draining_) throw ApiError{503, "the server is shutting down", {}, {{"Retry-After", "1"}}};
        ex->respond(HttpResponse{200, "application/json", {}, ""});
        return;
      }
      // Claude Code probes the base URL with HEAD / before its first request.
      if (path == "/") {
        if (r.method == "HEAD") return ex->respond(HttpResponse{200, "application/json", {}, ""});
        return ex->respond(json_response(200, {{"status", "ok"}, {"server", "tessera"}}));
      }
      if (path == "/version") return ex->respond(json_response(200, {{"version", TESSERA_VERSION_STRING}}));
      if (path == "/metrics")
        return ex->respond(
            HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", {}, metrics.render(engine.stats())});
      if (path == "/v1/models") return ex->respond(json_response(200, models()));
      if (path.rfind("/v1/models/", 0) == 0) {
        const std::string id = path.substr(11);
        // The list must outlive the loop: models()["data"] would refer into a destroyed temporary (the
        // request fuzzer's first finding, a heap-use-after-free on every GET /v1/models/{id}).
        const ojson all = models();
        for (const auto& m : all["data"])
          if (m["id"] == id) return ex->respond(json_response(200, m));
        throw ApiError{404, fmt::format("The model `{}` does not exist.", id), "model", {}};
      }

      ojson body = parse_body(r);
      check_model(body);
      const bool generates = path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/messages" ||
                             path == "/v1/responses";
      if (generates && owner->draining_) throw ApiError{503, "the server is shutting down", {}, {{"Retry-After", "1"}}};
      if (path == "/v1/chat/completions")
        chat(body, Kind::kChat, ex);
      else if (path == "/v1/completions")
        completions(body, ex);
      else if (path == "/v1/messages")
        messages(body, ex);
      else if (path == "/v1/responses")
        responses(body, ex);
      else if (path == "/v1/messages/count_tokens")
        count_tokens(body, ex);
      else if (path == "/tokenize")
        tokenize(body, ex);
      else if (path == "/detokenize")
        detokenize(body, ex);
    } catch (const ApiError& e) {
      ex->respond(error_response(api, e));
    } catch (const tessera::Error& e) {  // malformed messages found by the template layer
      ex->respond(error_response(api, ApiError{400, e.what(), {}, {}}));
    } catch (const nlohmann::json::exception& e) {  // a field of an unexpected type deep inside
      ex->respond(error_response(
          api, ApiError{400, "a field of the request has the wrong type or value: " + json_error_text(e), {}, {}}));
    } catch (const std::bad_alloc&) {
      ex->respond(error_response(api, ApiError{400, "the request needs more memory than the server allows", {}, {}}));
    } catch (const std::exception& e) {
      TLOG_ERROR("{} {}: internal error: {}", r.method, path, e.what());
      ex->respond(error_response(api, ApiError{500, std::string("internal error: ") + e.what(), {}, {}}));
    }
  }
};

ApiServer::ApiServer(ApiOptions options, EngineClient& engine, const tokenizer::Tokenizer& tok,
                     const tokenizer::ChatTemplate* chat_template, Metrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(options), engine, tok, chat_template, metrics, this)) {}

ApiServer::~ApiServer() = default;

void ApiServer::handle(HttpRequest&& request, std::shared_ptr<Exchange> exchange) {
  impl_->handle(std::move(request), exchange);
}

std::string ApiServer::error_body(int status, const std::string& message) {
  return dump(openai_error(status, message));
}

}  // namespace tessera::server
