// Generation bookkeeping (see generation_runner.h).
#include "server/generation_runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <span>

#include "core/logging.h"
#include "server/parsers/chat_output_parser.h"
#include "server/parsers/reasoning_parser.h"
#include "server/protocol_writers.h"
#include "server/sampling_params_json.h"

namespace tessera::server::api {

using Clock = std::chrono::steady_clock;

// When the last request finished, give freed heap back to the OS (glibc keeps it otherwise), at most
// twice a second, so RSS returns to its baseline after a burst.
void GenerationRunner::idle() {
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
  int64_t last = last_trim_ms_.load();
  if (now - last < 500 || !last_trim_ms_.compare_exchange_strong(last, now)) return;
  malloc_trim(0);
}

// The max_tokens a prompt of prompt_len tokens runs with: the one asked for, lowered to the room left in
// the context when the protocol clamps (Anthropic, Responses), or the default (the room left, or the
// endpoint's or the generation config's). Whether it fits is the engine's to say (validate_request:
// vLLM's context-length errors, 400).
void GenerationRunner::fit_max_tokens(const PreparedRequest& pr, size_t prompt_len, SamplingParams& p) const {
  const int room = engine_.max_model_len() - static_cast<int>(prompt_len);
  if (pr.max_tokens_given && pr.clamp_max_tokens) {
    p.max_tokens = std::max(1, std::min(pr.params.max_tokens, room));
    if (opt_.defaults.max_new_tokens) p.max_tokens = std::max(1, std::min(p.max_tokens, *opt_.defaults.max_new_tokens));
  } else if (pr.max_tokens_given) {
    p.max_tokens = pr.params.max_tokens;
  } else {
    int def = pr.default_max_tokens > 0 ? pr.default_max_tokens : room;
    if (opt_.defaults.max_new_tokens && pr.default_max_tokens <= 0) def = *opt_.defaults.max_new_tokens;
    p.max_tokens = std::max(1, std::min(def, room));
  }
}

// vLLM's "Received request" line (--enable-log-requests), the prompt cut at --max-log-len.
void GenerationRunner::log_request(const std::string& id, const std::string& text, const std::vector<int32_t>& ids,
                                   const SamplingParams& p) const {
  const size_t cap = opt_.max_log_len > 0 ? static_cast<size_t>(opt_.max_log_len) : std::string::npos;
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

void GenerationRunner::start_generation(std::shared_ptr<Gen> g, PreparedRequest& pr) {
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
  // --max-logprobs (vLLM's check and words), then the answer's size: tokens x top logprobs over every prompt and
  // choice, bounded before anything runs.
  std::vector<size_t> prompt_lengths;
  for (const auto& prompt : pr.prompts) prompt_lengths.push_back(prompt.size());
  std::string budget_param;
  Status s = check_max_logprobs(pr.params, opt_.max_logprobs, engine_.vocab_size(), &budget_param);
  if (s.ok()) s = check_logprob_budget(prompt_lengths, per_prompt, opt_.max_logprob_entries, &budget_param);
  if (!s.ok()) {
    g->complete = true;
    metrics_.request_rejected();
    bad(s.message(), budget_param);
  }
  if (opt_.log_requests)
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
  SubmitResult r = engine_.submit(std::move(reqs), std::move(callbacks));
  if (!r.ok()) {
    g->complete = true;
    metrics_.request_rejected();
    switch (r.error) {
      case SubmitError::kInvalid:
        bad(r.message, r.param == "prompt" ? pr.prompt_param : r.param);
      case SubmitError::kOverloaded:
        throw ApiError{429, r.message, {}, {{"Retry-After", std::to_string(opt_.retry_after_seconds)}}};
      case SubmitError::kDraining:
      case SubmitError::kDead:
      default:
        throw ApiError{503, r.message, {}, {{"Retry-After", std::to_string(opt_.retry_after_seconds)}}};
    }
  }
  // A client that goes away aborts its requests (the engine frees their blocks on its next loop turn).
  std::weak_ptr<Gen> wg = g;
  g->ex->on_disconnect([wg, this] {
    if (auto gg = wg.lock())
      for (const auto& id : gg->engine_ids) engine_.abort(id);
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
void GenerationRunner::on_delta(Gen& g, int prompt_index, const StreamDelta& d) {
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
      } else if (d.stop_token &&
                 std::find(g.stop_token_ids.begin(), g.stop_token_ids.end(), *d.stop_token) != g.stop_token_ids.end()) {
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
    for (const auto& id : g.engine_ids) engine_.abort(id);
    g.complete = true;
    if (g.stream) {
      g.ex->write(sse(openai_error(500, std::string("internal error: ") + e.what())));
      g.ex->finish();
    } else {
      g.ex->respond(json_response(500, openai_error(500, std::string("internal error: ") + e.what())));
    }
  }
}

// The delta's vLLM timings into the request's (the first sequence to report each) and /metrics_.
void GenerationRunner::record_timings(Gen& g, const StreamDelta& d) {
  if (d.inter_token_latency >= 0) metrics_.inter_token_latency(d.inter_token_latency);
  if (d.queue_time >= 0 && g.queue_time < 0) g.queue_time = d.queue_time;
  if (d.prefill_time >= 0 && g.prefill_time < 0) g.prefill_time = d.prefill_time;
  if (d.decode_time >= 0 && g.decode_time < 0) g.decode_time = d.decode_time;
  if (d.inference_time >= 0 && g.inference_time < 0) g.inference_time = d.inference_time;
}

void GenerationRunner::finalize(Gen& g) {
  g.complete = true;
  FinishedRequest fr;
  fr.e2e = std::chrono::duration<double>(Clock::now() - g.start).count();
  fr.finish_reason = g.choices.empty() ? "stop" : g.choices[0].finish_reason;
  for (const auto& c : g.choices) {
    fr.generation_tokens += static_cast<int>(c.token_ids.size());
    fr.max_generation_tokens = std::max(fr.max_generation_tokens, static_cast<int>(c.token_ids.size()));
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
  metrics_.request_finished(fr);
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

std::shared_ptr<Gen> GenerationRunner::new_gen(std::unique_ptr<ProtocolWriter> writer,
                                               const std::shared_ptr<Exchange>& ex, const ojson& body) {
  auto g = std::make_shared<Gen>();
  active_++;
  g->on_release = [this] {
    if (--active_ == 0) idle();
  };
  g->ex = ex;
  g->writer = std::move(writer);
  g->created = unix_now();
  const ojson* m = field(body, "model");
  g->model = m && m->is_string() ? m->get<std::string>() : opt_.served_model_names.front();
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
void GenerationRunner::add_parsers(Gen& g, const ojson& body, const ToolChoicePlan& plan, int n) const {
  if (opt_.reasoning_parser.empty() && !plan.parse_tools) return;
  ReasoningParserOptions ro;
  if (const ojson* k = field(body, "chat_template_kwargs"))
    if (auto it = k->find("enable_thinking"); it != k->end() && it->is_boolean()) ro.enable_thinking = it->get<bool>();
  for (int i = 0; i < n; ++i) {
    std::unique_ptr<ToolParser> tp;
    if (plan.parse_tools) {
      ToolParserOptions to;
      if (const ojson* t = field(body, "tools")) to.tools = json(*t);
      to.only_function = plan.only_function;
      if (const ojson* p = field(body, "parallel_tool_calls"); p && p->is_boolean()) to.single_call = !p->get<bool>();
      tp = make_tool_parser(opt_.tool_call_parser, std::move(to));
    }
    g.parsers.push_back(std::make_unique<ChatOutputParser>(
        opt_.reasoning_parser.empty() ? nullptr : make_reasoning_parser(opt_.reasoning_parser, ro), std::move(tp)));
  }
  g.tools_called.assign(static_cast<size_t>(n), false);
}

}  // namespace tessera::server::api
