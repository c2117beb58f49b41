#include "engine/async_engine.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/logging.h"
#include "tokenizer/detokenizer.h"

namespace tessera {

using Clock = std::chrono::steady_clock;

struct AsyncEngine::Sequence {
  std::unique_ptr<tokenizer::StreamingDetokenizer> detok;
  bool done = false;
  bool got_first = false;
  bool waiting = true;  // counted in its unit's group_waiting_ entry
  Clock::time_point scheduled_at{}, first_token_at{}, last_token_at{};
};

struct AsyncEngine::Tracked {
  GenerationRequest request;
  OutputCallback callback;
  std::vector<Sequence> seqs;
  int remaining = 0;
  Clock::time_point submitted;
  uint64_t group = 0;
};

AsyncEngine::AsyncEngine(std::unique_ptr<LLMEngine> engine, const tokenizer::Tokenizer* tok, AsyncEngineOptions options)
    : engine_(std::move(engine)),
      tok_(tok),
      options_(options),
      model_config_(engine_->model_config()),
      max_model_len_(engine_->max_model_len()),
      vocab_size_(engine_->model_config().vocab_size),
      eos_ids_(engine_->eos_token_ids()) {
  snapshot_.engine = engine_->stats();
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() { drain(std::chrono::milliseconds(0)); }

SubmitResult AsyncEngine::check(const GenerationRequest& request) const {
  SubmitResult r;
  SamplingLimits limits;
  limits.max_logprobs = options_.max_logprobs < 0 ? vocab_size_ : options_.max_logprobs;
  if (Status s = validate_request(request.prompt_ids, request.params, max_model_len_, vocab_size_, &r.param, limits);
      !s.ok()) {
    r.error = SubmitError::kInvalid;
    r.message = s.message();
  }
  return r;
}

SubmitResult AsyncEngine::submit(GenerationRequest request, OutputCallback on_output) {
  std::vector<GenerationRequest> requests;
  requests.push_back(std::move(request));
  std::vector<OutputCallback> callbacks;
  callbacks.push_back(std::move(on_output));
  return submit(std::move(requests), std::move(callbacks));
}

SubmitResult AsyncEngine::submit(std::vector<GenerationRequest> requests, std::vector<OutputCallback> on_output) {
  if (requests.empty() || requests.size() != on_output.size())
    return {SubmitError::kInvalid, "a submission needs one output callback per request", ""};
  size_t sequences = 0;
  for (const auto& r : requests) {
    if (SubmitResult c = check(r); !c.ok()) return c;
    sequences += static_cast<size_t>(std::max(1, r.params.n));
  }
  const size_t limit = static_cast<size_t>(std::max(1, options_.max_waiting_requests));
  if (sequences > limit)
    return {SubmitError::kInvalid,
            fmt::format("this request has {} sequences (prompts x n), more than the waiting queue holds ({}, "
                        "--max-waiting-requests); send fewer prompts or a smaller n",
                        sequences, limit),
            ""};
  std::lock_guard<std::mutex> lk(mu_);
  if (!snapshot_.alive) return {SubmitError::kDead, "the engine stopped after an error: " + snapshot_.fatal_error, ""};
  if (draining_ || stop_) return {SubmitError::kDraining, "the server is shutting down", ""};
  if (waiting_groups_ >= limit)
    return {SubmitError::kOverloaded,
            fmt::format("too many requests waiting ({}); retry later or raise --max-waiting-requests", waiting_groups_),
            ""};
  const uint64_t group = next_group_++;
  ++waiting_groups_;
  for (size_t i = 0; i < requests.size(); ++i)
    pending_.push_back(Pending{std::move(requests[i]), std::move(on_output[i]), group});
  cv_.notify_one();
  return {};
}

void AsyncEngine::leave_waiting(uint64_t group, int count) {
  auto it = group_waiting_.find(group);
  if (it == group_waiting_.end()) return;
  it->second -= count;
  if (it->second > 0) return;
  group_waiting_.erase(it);
  std::lock_guard<std::mutex> lk(mu_);
  if (waiting_groups_ > 0) --waiting_groups_;
}

void AsyncEngine::abort(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  pending_aborts_.push_back(id);
  cv_.notify_one();
}

void AsyncEngine::drain(std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!thread_.joinable()) return;
    draining_ = true;
    drain_deadline_ = Clock::now() + timeout;
    cv_.notify_one();
  }
  thread_.join();
}

void AsyncEngine::fail(const std::string& what) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!thread_.joinable()) return;
    failure_ = what;
    cv_.notify_one();
  }
  thread_.join();
}

AsyncEngineStats AsyncEngine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  AsyncEngineStats s = snapshot_;
  s.num_pending = pending_.size();
  return s;
}

namespace {
std::string sequence_id(const std::string& request, int index) {
  return index == 0 ? request : request + "#" + std::to_string(index);
}
}  // namespace

namespace {

// The last delta of a request (or of its sequence `index`).
StreamDelta finished_delta(const std::string& id, FinishReason reason, std::string text = {}, int index = 0) {
  StreamDelta d;
  d.request_id = id;
  d.index = index;
  d.finished = true;
  d.finish_reason = reason;
  d.text = std::move(text);
  return d;
}

}  // namespace

void AsyncEngine::loop() {
  for (;;) {
    std::deque<Pending> incoming;
    std::vector<std::string> aborts;
    bool drain_expired = false, draining = false;
    std::optional<std::string> failed;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] {
        return !pending_.empty() || !pending_aborts_.empty() || engine_->has_unfinished() || draining_ || stop_ ||
               failure_;
      });
      failed = failure_;
      if (!failed) incoming.swap(pending_);
      aborts.swap(pending_aborts_);
      draining = draining_;
      drain_expired = draining_ && Clock::now() >= drain_deadline_;
    }
    if (failed) {
      TLOG_ERROR("{}; failing all requests", *failed);
      fail_everything(*failed, *failed);
      return;
    }
    // Count every unit's sequences first: a refused entry of a unit must not end the unit's wait early.
    for (const auto& p : incoming) group_waiting_[p.group] += std::max(1, p.request.params.n);
    for (Pending& p : incoming) admit(p, draining);
    if (drain_expired) {
      for (auto& [id, t] : tracked_) aborts.push_back(id);
    }
    for (const auto& id : aborts) abort_tracked(id);
    if (engine_->has_unfinished()) {
      try {
        auto outs = engine_->step();
        handle_outputs(outs);
      } catch (const std::exception& e) {
        TLOG_ERROR("engine step failed: {}; failing all requests", e.what());
        fail_everything(e.what(), std::string("engine error: ") + e.what());
        return;
      }
    }
    std::lock_guard<std::mutex> lk(mu_);
    snapshot_.engine = engine_->stats();
    if (draining_ && tracked_.empty() && pending_.empty() && !engine_->has_unfinished()) return;
  }
}

void AsyncEngine::admit(Pending& p, bool draining) {
  GenerationRequest& req = p.request;
  const std::string id = req.id;
  const int n = std::max(1, req.params.n);
  auto refuse = [&](FinishReason reason, std::string text) {
    leave_waiting(p.group, n);
    p.callback(finished_delta(id, reason, std::move(text)));
  };
  if (tracked_.count(id)) return refuse(FinishReason::kError, "duplicate request id " + id);
  if (draining) return refuse(FinishReason::kAbort, {});  // accepted just before the drain began: refuse cleanly
  Status s = engine_->add_request(id, req.prompt_ids, req.params);
  if (!s.ok()) return refuse(FinishReason::kError, s.message());
  auto t = std::make_unique<Tracked>();
  t->request = std::move(req);
  t->callback = std::move(p.callback);
  t->submitted = Clock::now();
  t->group = p.group;
  t->seqs.resize(static_cast<size_t>(t->request.params.n));
  t->remaining = t->request.params.n;
  for (int i = 0; i < t->request.params.n; ++i) {
    if (tok_) {
      tokenizer::DetokenizerOptions o;
      o.skip_special_tokens = t->request.params.skip_special_tokens;
      o.stop_strings = t->request.params.stop;
      o.include_stop_string_in_output = t->request.params.include_stop_str_in_output;
      o.min_tokens = t->request.params.min_tokens;
      t->seqs[i].detok = std::make_unique<tokenizer::StreamingDetokenizer>(*tok_, o);
    }
    seq_owner_[sequence_id(id, i)] = {t.get(), i};
  }
  tracked_.emplace(id, std::move(t));
}

void AsyncEngine::abort_tracked(const std::string& id) {
  auto it = tracked_.find(id);
  if (it == tracked_.end()) return;
  Tracked* t = it->second.get();
  engine_->abort(id);
  for (size_t i = 0; i < t->seqs.size(); ++i) {
    if (t->seqs[i].waiting) {
      t->seqs[i].waiting = false;
      leave_waiting(t->group, 1);
    }
    if (t->seqs[i].done) continue;
    StreamDelta d = finished_delta(id, FinishReason::kAbort, {}, static_cast<int>(i));
    d.prompt_tokens = static_cast<int>(t->request.prompt_ids.size());
    t->callback(d);
    seq_owner_.erase(sequence_id(id, static_cast<int>(i)));
  }
  tracked_.erase(it);
}

void AsyncEngine::fail_everything(const std::string& what, const std::string& delta_text) {
  // A failed step leaves the device state unknown: fail every request and stop.
  for (auto& [id, t] : tracked_)
    for (size_t i = 0; i < t->seqs.size(); ++i)
      if (!t->seqs[i].done) t->callback(finished_delta(id, FinishReason::kError, delta_text, static_cast<int>(i)));
  tracked_.clear();
  seq_owner_.clear();
  group_waiting_.clear();
  std::lock_guard<std::mutex> lk(mu_);
  waiting_groups_ = 0;
  snapshot_.alive = false;
  snapshot_.fatal_error = what;
  for (auto& [req, cb, group] : pending_) cb(finished_delta(req.id, FinishReason::kError, snapshot_.fatal_error));
  pending_.clear();
}

void AsyncEngine::time_delta(const RequestOutput& o, Sequence& seq, Tracked& t, StreamDelta& d) {
  const auto now = Clock::now();
  auto secs = [](Clock::duration x) { return std::chrono::duration<double>(x).count(); };
  if (o.scheduled_at != Clock::time_point{}) seq.scheduled_at = o.scheduled_at;
  if (!o.new_token_ids.empty()) {
    if (!seq.got_first) {
      seq.got_first = true;
      seq.first_token_at = now;
      d.first_token_latency = secs(now - t.submitted);
      if (seq.scheduled_at != Clock::time_point{}) {
        d.queue_time = std::max(0.0, secs(seq.scheduled_at - t.submitted));
        d.prefill_time = secs(now - seq.scheduled_at);
      }
    } else {
      d.inter_token_latency = secs(now - seq.last_token_at);
    }
    seq.last_token_at = now;
  }
  if (d.finished && seq.got_first) {
    d.decode_time = secs(seq.last_token_at - seq.first_token_at);
    if (seq.scheduled_at != Clock::time_point{}) d.inference_time = secs(seq.last_token_at - seq.scheduled_at);
  }
}

void AsyncEngine::handle_outputs(std::vector<RequestOutput>& outs) {
  for (auto& o : outs) {
    auto owner = seq_owner_.find(o.request_id);
    if (owner == seq_owner_.end()) continue;  // aborted meanwhile
    Tracked* t = owner->second.first;
    const int index = owner->second.second;
    Sequence& seq = t->seqs[index];
    StreamDelta d;
    d.request_id = t->request.id;
    d.index = index;
    d.token_ids = o.new_token_ids;
    d.logprobs = std::move(o.logprobs);
    d.prompt_logprobs = std::move(o.prompt_logprobs);
    d.prompt_tokens = o.num_prompt_tokens;
    d.completion_tokens = o.num_output_tokens;
    d.cached_tokens = o.num_cached_tokens;
    bool stopped_by_string = false;
    if (seq.detok) {
      // A stop token (EOS or one of stop_token_ids) that ended the sequence: its text is not part of the
      // output unless include_stop_str_in_output (vLLM's rule); its id stays in token_ids.
      size_t text_tokens = o.new_token_ids.size();
      if (o.finished && o.stop_token && text_tokens > 0 && o.new_token_ids.back() == *o.stop_token &&
          !t->request.params.include_stop_str_in_output)
        --text_tokens;
      for (size_t i = 0; i < text_tokens; ++i) {
        auto r = seq.detok->push(o.new_token_ids[i]);
        d.text += r.text;
        if (r.stopped) {
          stopped_by_string = true;
          d.stop_string = r.stop_string;
          // Several tokens in one step (speculative decoding): the ones after the stop string
          // are not part of the output.
          const size_t keep = i + 1, extra = o.new_token_ids.size() - keep;
          d.token_ids.resize(keep);
          if (d.logprobs.size() > keep) d.logprobs.resize(keep);
          d.completion_tokens -= static_cast<int>(extra);
          break;
        }
      }
      if (!stopped_by_string && o.finished) d.text += seq.detok->finish().text;
    }
    if (stopped_by_string) {
      if (!o.finished) engine_->abort(o.request_id, /*only_this_sequence=*/true);
      d.finished = true;
      d.finish_reason = FinishReason::kStop;
    } else if (o.finished) {
      d.finished = true;
      d.finish_reason = o.finish_reason;
      d.stop_token = o.stop_token;
      if (o.finish_reason == FinishReason::kError) d.text = o.error;  // an error delta's text is its message
    }
    time_delta(o, seq, *t, d);
    if (d.finished) {
      seq.done = true;
      seq_owner_.erase(owner);
    }
    if (seq.waiting && (seq.got_first || d.finished)) {
      seq.waiting = false;
      leave_waiting(t->group, 1);
    }
    const std::string rid = t->request.id;
    const bool last = d.finished && --t->remaining == 0;
    t->callback(d);
    if (last) tracked_.erase(rid);
  }
}

}  // namespace tessera
