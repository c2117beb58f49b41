// OpenAI (/v1/chat/completions, /v1/completions, /v1/models, /v1/responses), Anthropic (/v1/messages) and
// vLLM (/tokenize, /detokenize, /health, /version, /metrics) endpoints: routing and auth, request
// preparation, and the generation bookkeeping every protocol shares; each protocol's output is its
// ProtocolWriter (openai_writers.cpp, anthropic_messages.cpp, responses_writer.cpp). Everything a request
// touches runs inside one exception boundary per request; a bad request gets an error object, never a crash.
#include "server/api_server.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string_view>

#include "core/json_depth.h"
#include "core/logging.h"
#include "core/version.h"
#include "server/anthropic_messages.h"
#include "server/api_common.h"
#include "server/auth.h"
#include "server/generation.h"
#include "server/parsers/chat_output_parser.h"
#include "server/protocol_writers.h"
#include "server/responses_api.h"
#include "server/sampling_params_json.h"
#include "server/structured_output.h"
#include "server/text_only.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tessera::server {

using namespace api;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
struct ApiServer::Impl {
  ApiOptions opt;
  EngineClient& engine;
  const tokenizer::Tokenizer& tok;
  const tokenizer::ChatTemplate* tmpl;
  Metrics& metrics;
  ApiServer* owner;
  TokenText text;

  Impl(ApiOptions o, EngineClient& e, const tokenizer::Tokenizer& t, const tokenizer::ChatTemplate* c, Metrics& m,
       ApiServer* own)
      : opt(std::move(o)), engine(e), tok(t), tmpl(c), metrics(m), owner(own), text(t) {}

  // Structured output: compiled against the vocabulary on first use (the vocabulary's bytes take a moment).
  std::once_flag structured_once;
  std::unique_ptr<StructuredOutputCompiler> structured;
  std::shared_ptr<const TokenConstraintFactory> compile_constraint(const StructuredOutputSpec& spec) {
    std::call_once(structured_once, [this] {
      structured = std::make_unique<StructuredOutputCompiler>(tok, engine.vocab_size(), engine.eos_token_ids());
    });
    return structured->compile(spec);
  }

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
    // The body field that holds the prompt (the error `param` when the engine refuses the prompt).
    std::string prompt_param = "messages";
    // vLLM's truncate_prompt_tokens: only the last k tokens of each prompt are kept. 0: all.
    int truncate_prompt_tokens = 0;
    std::string structured_field;  // the field a constraint came from, when there is one
  };

  SamplingParams base_params() const {
    SamplingParams p;
    const auto& d = opt.defaults;
    if (d.temperature) p.temperature = static_cast<float>(*d.temperature);
    if (d.top_p) p.top_p = static_cast<float>(*d.top_p);
    if (d.top_k) p.top_k = *d.top_k;
    if (d.min_p) p.min_p = static_cast<float>(*d.min_p);
    if (d.repetition_penalty) p.repetition_penalty = static_cast<float>(*d.repetition_penalty);
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
                                                    "include_stop_str_in_output",
                                                    "skip_special_tokens",
                                                    "stop",
                                                    "stop_token_ids",
                                                    "logprobs",
                                                    "top_logprobs",
                                                    "prompt_logprobs",
                                                    "logit_bias",
                                                    "allowed_token_ids"};

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
    // vLLM's rule: prompt logprobs are not streamed.
    if (pr.params.prompt_logprobs > 0 && get_bool(body, "stream", false))
      bad("'prompt_logprobs' are not available when 'stream' is true", "prompt_logprobs");
    if (pr.params.n < 1 || pr.params.n > opt.max_n)
      bad(fmt::format("'n' must be between 1 and {}, got {}", opt.max_n, pr.params.n), "n");
    refuse_unserved_fields(body);
    if (const ojson* bw = field(body, "bad_words")) pr.params.bad_words_ids = bad_words_ids(*bw);
    if (const ojson* t = field(body, "truncate_prompt_tokens")) {
      if (!t->is_number_integer() || (t->get<int64_t>() < 1 && t->get<int64_t>() != -1))
        bad("'truncate_prompt_tokens' must be a positive integer, or -1 (the model's context length)",
            "truncate_prompt_tokens");
      const int64_t k = t->get<int64_t>();
      pr.truncate_prompt_tokens = k == -1 ? engine.max_model_len() : static_cast<int>(std::min<int64_t>(k, 1 << 30));
    }
    if (std::optional<StructuredOutputSpec> spec = read_structured_output(body)) {
      pr.params.constraint = compile_constraint(*spec);
      pr.structured_field = spec->field;
    }
  }

  // Fields of vLLM's or OpenAI's requests that change what is generated and that this server does not act on:
  // a 400 naming each, never a silent 200 with other output than asked.
  static void refuse_unserved_fields(const ojson& body) {
    static constexpr std::pair<const char*, const char*> kRefused[] = {
        {"thinking_token_budget",
         "a thinking budget is not enforced by this server; bound the whole output with "
         "max_tokens, or turn thinking off with chat_template_kwargs.enable_thinking"},
        {"chat_template",
         "a chat template in the request is not accepted (vLLM refuses it too unless "
         "--trust-request-chat-template); start the server with --chat-template"},
        {"return_tokens_as_token_ids",
         "tokens as 'token_id:<id>' strings are not supported; ask for logprobs, "
         "or /tokenize and /detokenize"},
        {"guided_decoding_backend", "there is one grammar engine; leave 'guided_decoding_backend' out"},
        {"logits_processors", "custom logits processors are not supported"},
        {"vllm_xargs", "'vllm_xargs' (extra arguments for custom logits processors) is not supported"},
    };
    for (const auto& [name, why] : kRefused) {
      const ojson* v = field(body, name);
      if (!v) continue;
      // A value that asks for nothing is accepted.
      if ((v->is_boolean() && !v->get<bool>()) || (v->is_array() && v->empty())) continue;
      bad(fmt::format("'{}': {}", name, why), name);
    }
  }

  // vLLM's bad_words: each word as tokens, with and without a leading space (its two usual spellings).
  std::vector<std::vector<int32_t>> bad_words_ids(const ojson& words) const {
    if (!words.is_array()) bad("'bad_words' must be a list of strings", "bad_words");
    std::vector<std::vector<int32_t>> out;
    for (const auto& w : words) {
      if (!w.is_string() || w.get_ref<const std::string&>().empty())
        bad("'bad_words' must be a list of non-empty strings", "bad_words");
      std::string word = w.get<std::string>();
      const size_t start = word.find_first_not_of(' ');
      word = start == std::string::npos ? word : word.substr(start);
      for (const std::string& spelling : {word, " " + word}) {
        std::vector<int32_t> ids = tok.encode(spelling, false);
        if (!ids.empty() && std::find(out.begin(), out.end(), ids) == out.end()) out.push_back(std::move(ids));
      }
    }
    return out;
  }

  // The max_tokens a prompt of prompt_len tokens runs with: the one asked for, lowered to the room left in
  // the context when the protocol clamps (Anthropic, Responses), or the default (the room left, or the
  // endpoint's or the generation config's). Whether it fits is the engine's to say (validate_request:
  // vLLM's context-length errors, 400).
  void fit_max_tokens(const Prepared& pr, size_t prompt_len, SamplingParams& p) {
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

  void start_generation(std::shared_ptr<Gen> g, Prepared& pr) {
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

  // A chat request (OpenAI chat, or Anthropic Messages and Responses translated to one), written by `writer`.
  void chat(const ojson& body, const std::shared_ptr<Exchange>& ex, std::unique_ptr<ProtocolWriter> writer) {
    const ojson* msgs = field(body, "messages");
    if (!msgs) bad("'messages' is required", "messages");
    ToolChoicePlan plan;
    check_tools(body, &plan);
    Prepared pr;
    read_params(body, pr);
    if (std::optional<StructuredOutputSpec> calls = tool_call_structure(body, plan, opt.tool_call_parser)) {
      if (pr.params.constraint)
        bad(fmt::format("tool_choice {} and '{}' both constrain the output; send one of them",
                        dump(*field(body, "tool_choice")), pr.structured_field),
            "tool_choice");
      pr.params.constraint = compile_constraint(*calls);
    }
    // With a reasoning parser and thinking on, the constraint starts once the reasoning ends (the template
    // opened the think block in the prompt: a constraint from the first token would forbid closing it).
    if (pr.params.constraint && !opt.reasoning_parser.empty()) {
      const ojson* k = field(body, "chat_template_kwargs");
      if (reasoning_options_from_kwargs(k ? json(*k) : json(nullptr)).enable_thinking)
        if (std::optional<int32_t> end = tok.token_to_id("</think>")) pr.params.constraint_after_token = *end;
    }
    pr.clamp_max_tokens = writer->clamps_max_tokens();
    std::string prompt = render_chat(body);
    const bool add_special = get_bool(body, "add_special_tokens", false);
    pr.prompts.push_back(tok.encode(prompt, add_special));
    pr.prompt_texts.push_back(std::move(prompt));
    auto g = new_gen(std::move(writer), ex, body);
    g->prompt_logprobs = pr.params.prompt_logprobs;
    add_parsers(*g, body, plan, pr.params.n);
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
    pr.prompt_param = "prompt";
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
        // Only the narrowing is checked here; the vocabulary is the engine's to check (validate_request).
        const int64_t v = t.is_number_unsigned() && t.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                              ? INT64_MAX
                              : t.get<int64_t>();
        if (v < INT32_MIN || v > INT32_MAX) bad("'prompt' token ids must be 32-bit integers", "prompt");
        ids.push_back(static_cast<int32_t>(v));
      }
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
    if (pr.params.n * static_cast<int>(pr.prompts.size()) > opt.max_prompts)
      bad(fmt::format("n x prompts must be at most {}", opt.max_prompts), "n");
    auto g = new_gen(completion_writer(text), ex, body);
    g->echo = echo;
    // vLLM: with echo, logprobs covers the prompt too (the prompt_logprobs the engine computes), and
    // max_tokens 0 returns the prompt alone (lm-evaluation-harness scores text this way).
    g->prompt_logprobs = pr.params.prompt_logprobs;
    if (echo && pr.params.logprobs >= 0 && pr.params.prompt_logprobs < 0)
      g->prompt_logprobs = pr.params.prompt_logprobs = pr.params.logprobs;
    if (echo && pr.max_tokens_given && pr.params.max_tokens == 0 && pr.params.prompt_logprobs < 0)
      pr.params.prompt_logprobs = 0;  // the engine scores the prompt (not reported) and generates nothing
    start_generation(g, pr);
  }

  // ---- Anthropic Messages and the Responses API, as chat ---------------------------------------------
  void messages(const ojson& body, const std::shared_ptr<Exchange>& ex) {
    chat(messages_to_chat(body, opt.max_messages), ex, messages_writer());
  }

  // OpenAI Responses API: translated to a chat request (responses_api.cpp), generated as chat is.
  void responses(const ojson& body, const std::shared_ptr<Exchange>& ex) {
    ResponsesRequest rq = responses_to_chat(body);
    if (!rq.ignored_tools.empty())
      TLOG_DEBUG("/v1/responses: ignoring tools this server cannot run: {}", fmt::join(rq.ignored_tools, ", "));
    const ojson chat_body = std::move(rq.chat);
    try {
      chat(chat_body, ex, responses_writer(text, std::move(rq)));
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

  void count_tokens(const ojson& body, const std::shared_ptr<Exchange>& ex) {
    ojson b = body;
    if (!b.contains("max_tokens")) b["max_tokens"] = 1;
    ojson chat_body = messages_to_chat(b, opt.max_messages);
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
      // Above 2^63 - 1 the id is read unsigned (as int64 it would print as a negative number).
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        bad(fmt::format("token id {} is outside the vocabulary", v.get<uint64_t>()), "tokens");
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
  struct Route {
    const char* path;
    const char* method;
  };

  // Whether `path` is answered only with a key: everything under /v1, unknown paths included, so that routes
  // are not listed without one (vLLM's middleware does the same), and the routes outside /v1 that are not open.
  static bool needs_key(const std::string& path) {
    return path == "/v1" || path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize";
  }

  // The 401 for a request whose headers lack a valid key, before its body is read; nullopt otherwise.
  std::optional<HttpResponse> check_headers(const HttpRequest& r) {
    if (!needs_key(r.path) || authorized(r, opt.api_keys)) return std::nullopt;
    const bool anthropic = r.path.rfind("/v1/messages", 0) == 0;
    return error_response(anthropic, unauthorized(anthropic));
  }

  // The route of `path`, after the key check that keeps routes under /v1 from being listed without one
  // (vLLM's middleware does the same); 404 and 405 otherwise.
  const Route& route_of(const HttpRequest& r, bool anthropic) {
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
    static const Route model_route{"/v1/models/", "GET"};
    const std::string& path = r.path;
    const bool open = path == "/health" || path == "/ping" || path == "/version" || path == "/metrics" || path == "/";
    if ((path == "/v1" || path.rfind("/v1/", 0) == 0) && !authorized(r, opt.api_keys)) throw unauthorized(anthropic);
    const Route* route = nullptr;
    for (const auto& rt : routes)
      if (path == rt.path) route = &rt;
    if (!route && path.rfind("/v1/models/", 0) == 0) route = &model_route;
    if (!route) throw ApiError{404, fmt::format("{} {} is not an endpoint of this server", r.method, path), {}, {}};
    if (r.method != route->method && !(r.method == "HEAD" && std::string(route->method) == "GET"))
      throw ApiError{405,
                     fmt::format("{} is not allowed on {}; use {}", r.method, path, route->method),
                     {},
                     {{"Allow", route->method}}};
    if (!open && !authorized(r, opt.api_keys)) throw unauthorized(anthropic);
    return *route;
  }

  // The answer of a GET route, or nullopt for the POST routes.
  std::optional<HttpResponse> get_response(const HttpRequest& r) {
    const std::string& path = r.path;
    if (path == "/health" || path == "/ping") {
      auto st = engine.stats();
      if (!st.alive) throw ApiError{503, "the engine stopped after an error: " + st.fatal_error, {}, {}};
      if (owner->draining_) throw ApiError{503, "the server is shutting down", {}, {{"Retry-After", "1"}}};
      return HttpResponse{200, "application/json", {}, ""};
    }
    // Claude Code probes the base URL with HEAD / before its first request.
    if (path == "/") {
      if (r.method == "HEAD") return HttpResponse{200, "application/json", {}, ""};
      return json_response(200, {{"status", "ok"}, {"server", "tessera"}});
    }
    if (path == "/version") return json_response(200, {{"version", TESSERA_VERSION_STRING}});
    if (path == "/metrics")
      return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", {}, metrics.render(engine.stats())};
    if (path == "/v1/models") return json_response(200, models());
    if (path.rfind("/v1/models/", 0) == 0) {
      const std::string id = path.substr(11);
      // The list must outlive the loop: models()["data"] would refer into a destroyed temporary (the
      // request fuzzer's first finding, a heap-use-after-free on every GET /v1/models/{id}).
      const ojson all = models();
      for (const auto& m : all["data"])
        if (m["id"] == id) return json_response(200, m);
      throw ApiError{404, fmt::format("The model `{}` does not exist.", id), "model", {}};
    }
    return std::nullopt;
  }

  void chat_completions(const ojson& body, const std::shared_ptr<Exchange>& ex) { chat(body, ex, chat_writer(text)); }

  // The POST routes: path, whether it generates (refused while draining), the handler.
  struct PostRoute {
    const char* path;
    bool generates;
    void (Impl::*serve)(const ojson& body, const std::shared_ptr<Exchange>& ex);
  };

  // A POST route, with the parsed body.
  void serve_post(const std::string& path, const ojson& body, const std::shared_ptr<Exchange>& ex) {
    static constexpr PostRoute kPostRoutes[] = {
        {"/v1/chat/completions", true, &Impl::chat_completions},
        {"/v1/completions", true, &Impl::completions},
        {"/v1/messages", true, &Impl::messages},
        {"/v1/responses", true, &Impl::responses},
        {"/v1/messages/count_tokens", false, &Impl::count_tokens},
        {"/tokenize", false, &Impl::tokenize},
        {"/detokenize", false, &Impl::detokenize},
    };
    for (const PostRoute& r : kPostRoutes) {
      if (path != r.path) continue;
      if (r.generates && owner->draining_)
        throw ApiError{503, "the server is shutting down", {}, {{"Retry-After", "1"}}};
      (this->*r.serve)(body, ex);
      return;
    }
  }

  void handle(HttpRequest&& r, const std::shared_ptr<Exchange>& ex) {
    const std::string& path = r.path;
    const bool anthropic = path.rfind("/v1/messages", 0) == 0;
    try {
      route_of(r, anthropic);
      if (std::optional<HttpResponse> response = get_response(r)) return ex->respond(std::move(*response));
      ojson body = parse_body(r);
      check_model(body);
      serve_post(path, body, ex);
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
      TLOG_ERROR("{} {}: internal error: {}", r.method, path, e.what());
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

std::string ApiServer::error_body(int status, const std::string& message) {
  return dump(openai_error(status, message));
}

}  // namespace tessera::server
