// OpenAI (/v1/chat/completions, /v1/completions, /v1/models, /v1/responses), Anthropic (/v1/messages) and
// vLLM (/tokenize, /detokenize, /health, /version, /metrics) endpoints: one route table (routing, the key
// check, draining, the startup log), the handlers, and the generation bookkeeping every protocol shares.
// Reading a request is request_reader.cpp's; each protocol's output is its ProtocolWriter (openai_writers.cpp,
// anthropic_messages.cpp, responses_writer.cpp). Everything a request touches runs inside one exception
// boundary per request; a bad request gets an error object, never a crash.
#include "server/api_server.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>
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
#include "server/parsers/chat_output_parser.h"
#include "server/protocol_writers.h"
#include "server/request_reader.h"
#include "server/responses_api.h"
#include "server/sampling_params_json.h"
#include "tokenizer/tokenizer.h"

namespace tessera::server {

using namespace api;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
struct ApiServer::Impl {
  ApiOptions opt;
  EngineClient& engine;
  const tokenizer::Tokenizer& tok;
  Metrics& metrics;
  ApiServer* owner;
  TokenText text;
  RequestReader reader;

  Impl(ApiOptions o, EngineClient& e, const tokenizer::Tokenizer& t, const tokenizer::ChatTemplate* c, Metrics& m,
       ApiServer* own)
      : opt(std::move(o)), engine(e), tok(t), metrics(m), owner(own), text(t), reader(opt, e, t, c) {}

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
  HttpResponse error_response(bool anthropic, const ApiError& e) {
    return json_response(e.status,
                         anthropic ? anthropic_error(e.status, e.message) : openai_error(e.status, e.message, e.param),
                         e.headers);
  }

  // ---- generation ---------------------------------------------------------------------------
  // The max_tokens a prompt of prompt_len tokens runs with: the one asked for, lowered to the room left in
  // the context when the protocol clamps (Anthropic, Responses), or the default (the room left, or the
  // endpoint's or the generation config's). Whether it fits is the engine's to say (validate_request:
  // vLLM's context-length errors, 400).
  void fit_max_tokens(const PreparedRequest& pr, size_t prompt_len, SamplingParams& p) {
    const int room = engine.max_model_len() - static_cast<int>(prompt_len);
    if (pr.max_tokens_given && pr.clamp_max_tokens) {
      p.max_tokens = std::max(1, std::min(pr.params.max_tokens, room));
      if (opt.defaults.max_new_tokens) p.max_tokens = std::max(1, std::min(p.max_tokens, *opt.defaults.max_new_tokens));
    } else if (pr.max_tokens_given) {
      p.max_tokens = pr.params.max_tokens;
    } else {
      int def = pr.default_max_tokens > 0 ? pr.default_max_tokens : room;
      if (opt.defaults.max_new_tokens && pr.default_max_tokens <= 0) def = *opt.defaults.max_new_tokens;
      p.max_tokens = std::max(1, std::min(def, room));
    }
  }

  // vLLM's "Received request" line (--enable-log-requests), the prompt cut at --max-log-len.
  void log_request(const std::string& id, const std::string& text, const std::vector<int32_t>& ids,
                   const SamplingParams& p) const {
    const size_t cap = opt.max_log_len > 0 ? static_cast<size_t>(opt.max_log_len) : std::string::npos;
    std::string shown = text.substr(0, std::min(cap, text.size()));
    while (!shown.empty() && (static_cast<unsigned char>(shown.back()) & 0xC0) == 0x80) shown.pop_back();
    const std::span<const int32_t> shown_ids = std::span(ids).first(std::min(cap, ids.size()));
    TLOG_INFO(
        "Received request {}: prompt: {}, params: n={}, temperature={}, top_p={}, top_k={}, min_p={}, seed={}, "
        "max_tokens={}, min_tokens={}, stop={}, stop_token_ids={}, prompt_token_ids: [{}], prompt tokens: {}",
        id, json(shown).dump(-1, ' ', false, json::error_handler_t::replace), p.n, p.temperature, p.top_p, p.top_k,
        p.min_p, p.seed ? std::to_string(*p.seed) : "None", p.max_tokens, p.min_tokens, json(p.stop).dump(),
        json(p.stop_token_ids).dump(), fmt::join(shown_ids, ", "), ids.size());
  }

  void start_generation(std::shared_ptr<Gen> g, PreparedRequest& pr) {
    const size_t P = pr.prompts.size();
    g->n = pr.params.n;
    g->logprobs = pr.params.logprobs;
    if (g->echo && g->logprobs >= 0) g->prompt_ids = pr.prompts;
    g->stop_token_ids = pr.params.stop_token_ids;
    g->prompt_tokens.assign(P, 0);
    g->prompt_texts = pr.prompt_texts;
    g->choices.resize(P * static_cast<size_t>(g->n));
    g->remaining = static_cast<int>(g->choices.size());
    std::vector<SamplingParams> per_prompt;
    if (pr.truncate_prompt_tokens > 0)
      for (auto& prompt : pr.prompts)
        if (prompt.size() > static_cast<size_t>(pr.truncate_prompt_tokens))
          prompt.erase(prompt.begin(), prompt.end() - pr.truncate_prompt_tokens);
    for (size_t p = 0; p < P; ++p) {
      SamplingParams sp = pr.params;
      fit_max_tokens(pr, pr.prompts[p].size(), sp);
      if (p == 0) g->max_tokens = sp.max_tokens;
      per_prompt.push_back(sp);
      g->prompt_tokens[p] = static_cast<int>(pr.prompts[p].size());
      g->engine_ids.push_back(P == 1 ? g->id : fmt::format("{}-{}", g->id, p));
    }
    // The answer's size: tokens x top logprobs over every prompt and choice, bounded before anything runs.
    std::vector<size_t> prompt_lengths;
    for (const auto& prompt : pr.prompts) prompt_lengths.push_back(prompt.size());
    std::string budget_param;
    if (Status s = check_logprob_budget(prompt_lengths, per_prompt, opt.max_logprob_entries, &budget_param); !s.ok()) {
      g->complete = true;
      metrics.request_rejected();
      bad(s.message(), budget_param);
    }
    if (opt.log_requests)
      for (size_t p = 0; p < P; ++p)
        log_request(g->engine_ids[p], p < pr.prompt_texts.size() ? pr.prompt_texts[p] : std::string(), pr.prompts[p],
                    per_prompt[p]);
    // All prompts go in as one unit: queued together (one place in the waiting queue) or refused together.
    std::vector<GenerationRequest> reqs;
    std::vector<OutputCallback> callbacks;
    for (size_t p = 0; p < P; ++p) {
      reqs.push_back(GenerationRequest{g->engine_ids[p], std::move(pr.prompts[p]), per_prompt[p]});
      const int prompt_index = static_cast<int>(p);
      callbacks.emplace_back([this, g, prompt_index](const StreamDelta& d) {
        // Engine thread: copy and hand over to the connection's strand.
        g->ex->post([this, g, prompt_index, d] { on_delta(*g, prompt_index, d); });
      });
    }
    SubmitResult r = engine.submit(std::move(reqs), std::move(callbacks));
    if (!r.ok()) {
      g->complete = true;
      metrics.request_rejected();
      switch (r.error) {
        case SubmitError::kInvalid:
          bad(r.message, r.param == "prompt" ? pr.prompt_param : r.param);
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
    if (g->stream) {
      g->ex->start_stream(200, "text/event-stream; charset=utf-8", {});
      std::string out = g->writer->begin_stream(*g);
      if (!out.empty()) g->ex->write(std::move(out));
    }
  }

  // ---- the engine's output, for every protocol ----------------------------------------------------
  // Records one engine delta in its choice; streams it through the protocol's writer; finishes the
  // request when its last choice is done.
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
      record_timings(g, d);
      if (d.finish_reason != FinishReason::kError) c.text += d.text;
      c.token_ids.insert(c.token_ids.end(), d.token_ids.begin(), d.token_ids.end());
      if (g.logprobs >= 0) c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
      if (!d.prompt_logprobs.empty()) c.prompt_logprobs = d.prompt_logprobs;
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
      if (g.stream) {
        std::string out = g.writer->stream_delta(g, ci, d, d.logprobs);
        if (!out.empty()) g.ex->write(std::move(out));
      }
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

  // The delta's vLLM timings into the request's (the first sequence to report each) and /metrics.
  void record_timings(Gen& g, const StreamDelta& d) {
    if (d.inter_token_latency >= 0) metrics.inter_token_latency(d.inter_token_latency);
    if (d.queue_time >= 0 && g.queue_time < 0) g.queue_time = d.queue_time;
    if (d.prefill_time >= 0 && g.prefill_time < 0) g.prefill_time = d.prefill_time;
    if (d.decode_time >= 0 && g.decode_time < 0) g.decode_time = d.decode_time;
    if (d.inference_time >= 0 && g.inference_time < 0) g.inference_time = d.inference_time;
  }

  void finalize(Gen& g) {
    g.complete = true;
    FinishedRequest fr;
    fr.e2e = std::chrono::duration<double>(Clock::now() - g.start).count();
    fr.finish_reason = g.choices.empty() ? "stop" : g.choices[0].finish_reason;
    for (const auto& c : g.choices) {
      fr.generation_tokens += static_cast<int>(c.token_ids.size());
      if (c.finish_reason == "abort" || c.finish_reason == "error") fr.finish_reason = c.finish_reason;
    }
    for (int p : g.prompt_tokens) fr.prompt_tokens += p;
    fr.ttft = g.ttft > 0 ? g.ttft : -1;
    fr.queue = g.queue_time;
    fr.prefill = g.prefill_time;
    fr.decode = g.decode_time;
    fr.inference = g.inference_time;
    fr.max_tokens = g.max_tokens;
    fr.n = g.n;
    metrics.request_finished(fr);
    if (g.stream) {
      g.ex->write(g.writer->end_stream(g));
      g.ex->finish();
      return;
    }
    for (const auto& c : g.choices)
      if (c.finish_reason == "error") {
        g.ex->respond(json_response(500, openai_error(500, "generation failed: " + c.error)));
        return;
      }
    g.ex->respond(json_response(200, g.writer->response(g)));
  }

  std::shared_ptr<Gen> new_gen(std::unique_ptr<ProtocolWriter> writer, const std::shared_ptr<Exchange>& ex,
                               const ojson& body) {
    auto g = std::make_shared<Gen>();
    owner->active_++;
    g->on_release = [this] {
      if (--owner->active_ == 0) idle();
    };
    g->ex = ex;
    g->writer = std::move(writer);
    g->created = unix_now();
    const ojson* m = field(body, "model");
    g->model = m && m->is_string() ? m->get<std::string>() : opt.served_model_names.front();
    g->id = g->writer->id_prefix() + random_hex(32);
    g->stream = get_bool(body, "stream", false);
    if (const ojson* so = field(body, "stream_options")) {
      if (!so->is_object()) bad("'stream_options' must be an object", "stream_options");
      g->include_usage = get_bool(*so, "include_usage", false);
      g->continuous_usage = get_bool(*so, "continuous_usage_stats", false);
    }
    g->writer->attach(*g);
    return g;
  }

  // Reasoning and tool-call parsers for each of the n choices, when either applies.
  void add_parsers(Gen& g, const ojson& body, const ToolChoicePlan& plan, int n) {
    if (opt.reasoning_parser.empty() && !plan.parse_tools) return;
    ReasoningParserOptions ro;
    if (const ojson* k = field(body, "chat_template_kwargs"))
      if (auto it = k->find("enable_thinking"); it != k->end() && it->is_boolean())
        ro.enable_thinking = it->get<bool>();
    for (int i = 0; i < n; ++i) {
      std::unique_ptr<ToolParser> tp;
      if (plan.parse_tools) {
        ToolParserOptions to;
        if (const ojson* t = field(body, "tools")) to.tools = json(*t);
        to.only_function = plan.only_function;
        if (const ojson* p = field(body, "parallel_tool_calls"); p && p->is_boolean()) to.single_call = !p->get<bool>();
        tp = make_tool_parser(opt.tool_call_parser, std::move(to));
      }
      g.parsers.push_back(std::make_unique<ChatOutputParser>(
          opt.reasoning_parser.empty() ? nullptr : make_reasoning_parser(opt.reasoning_parser, ro), std::move(tp)));
    }
    g.tools_called.assign(static_cast<size_t>(n), false);
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
  void chat(const ojson& body, const std::shared_ptr<Exchange>& ex, std::unique_ptr<ProtocolWriter> writer) {
    PreparedRequest pr = reader.read_chat(body, writer->clamps_max_tokens());
    auto g = new_gen(std::move(writer), ex, body);
    g->prompt_logprobs = pr.params.prompt_logprobs;
    add_parsers(*g, body, pr.tools, pr.params.n);
    start_generation(g, pr);
  }

  void chat_completions(const Call& c) { chat(c.body, c.ex, chat_writer(text)); }

  void completions(const Call& c) {
    PreparedRequest pr = reader.read_completions(c.body);
    auto g = new_gen(completion_writer(text), c.ex, c.body);
    g->echo = pr.echo;
    // vLLM: with echo, logprobs covers the prompt too (the prompt_logprobs the engine computes), and
    // max_tokens 0 returns the prompt alone (lm-evaluation-harness scores text this way).
    g->prompt_logprobs = pr.params.prompt_logprobs;
    if (pr.echo && pr.params.logprobs >= 0 && pr.params.prompt_logprobs < 0)
      g->prompt_logprobs = pr.params.prompt_logprobs = pr.params.logprobs;
    if (pr.echo && pr.max_tokens_given && pr.params.max_tokens == 0 && pr.params.prompt_logprobs < 0)
      pr.params.prompt_logprobs = 0;  // the engine scores the prompt (not reported) and generates nothing
    start_generation(g, pr);
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

  // The 401 for a request whose headers lack a valid key, before its body is read; nullopt otherwise.
  std::optional<HttpResponse> check_headers(const HttpRequest& r) {
    if (!needs_key(r.path) || authorized(r, opt.api_keys)) return std::nullopt;
    const bool anthropic = anthropic_errors(r.path);
    return error_response(anthropic, unauthorized(anthropic));
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

  void handle(HttpRequest&& r, const std::shared_ptr<Exchange>& ex) {
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
  impl_->handle(std::move(request), exchange);
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
