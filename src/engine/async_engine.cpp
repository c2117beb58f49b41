#include "engine/async_engine.h"

#include <fmt/format.h>

#include "core/logging.h"
#include "tokenizer/detokenizer.h"

namespace tessera {

using Clock = std::chrono::steady_clock;

struct AsyncEngine::Sequence {
  std::unique_ptr<tokenizer::StreamingDetokenizer> detok;
  bool done = false;
  bool got_first = false;
};

struct AsyncEngine::Tracked {
  GenerationRequest request;
  OutputCallback callback;
  std::vector<Sequence> seqs;
  int remaining = 0;
  Clock::time_point submitted;
};

AsyncEngine::AsyncEngine(std::unique_ptr<LLMEngine> engine, const tokenizer::Tokenizer* tok, AsyncEngineOptions options)
    : engine_(std::move(engine)),
      tok_(tok),
      options_(options),
      model_config_(engine_->model_config()),
      max_model_len_(engine_->max_model_len()),
      vocab_size_(engine_->model_config().vocab_size) {
  snapshot_.engine = engine_->stats();
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() { drain(std::chrono::milliseconds(0)); }

SubmitResult AsyncEngine::submit(GenerationRequest request, OutputCallback on_output) {
  if (request.prompt_ids.empty()) return {SubmitError::kInvalid, "the prompt is empty"};
  if (static_cast<int>(request.prompt_ids.size()) + 1 > max_model_len_)
    return {SubmitError::kInvalid,
            fmt::format("This model's maximum context length is {} tokens. However, your request has {} input tokens "
                        "and at least 1 more is needed for the output. Please reduce the length of the input.",
                        max_model_len_, request.prompt_ids.size())};
  for (int32_t t : request.prompt_ids)
    if (t < 0 || t >= vocab_size_)
      return {SubmitError::kInvalid, fmt::format("token id {} is outside the vocabulary (0..{})", t, vocab_size_ - 1)};
  if (Status s = validate_sampling_params(request.params, vocab_size_); !s.ok())
    return {SubmitError::kInvalid, s.message()};
  std::lock_guard<std::mutex> lk(mu_);
  if (!snapshot_.alive) return {SubmitError::kDead, "the engine stopped after an error: " + snapshot_.fatal_error};
  if (draining_ || stop_) return {SubmitError::kDraining, "the server is shutting down"};
  const size_t queued = pending_.size() + snapshot_.engine.num_waiting;
  if (queued >= static_cast<size_t>(options_.max_waiting_requests))
    return {SubmitError::kOverloaded,
            fmt::format("too many requests waiting ({}); retry later or raise --max-waiting-requests", queued)};
  pending_.emplace_back(std::move(request), std::move(on_output));
  cv_.notify_one();
  return {};
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

void AsyncEngine::loop() {
  for (;;) {
    std::deque<std::pair<GenerationRequest, OutputCallback>> incoming;
    std::vector<std::string> aborts;
    bool drain_expired = false, draining = false;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] {
        return !pending_.empty() || !pending_aborts_.empty() || engine_->has_unfinished() || draining_ || stop_;
      });
      incoming.swap(pending_);
      aborts.swap(pending_aborts_);
      draining = draining_;
      drain_expired = draining_ && Clock::now() >= drain_deadline_;
    }
    for (auto& [req, cb] : incoming) {
      const std::string id = req.id;
      if (tracked_.count(id)) {
        StreamDelta d;
        d.request_id = id;
        d.finished = true;
        d.finish_reason = FinishReason::kError;
        d.text = "duplicate request id " + id;
        cb(d);
        continue;
      }
      if (draining) {  // accepted just before the drain began: refuse cleanly
        StreamDelta d;
        d.request_id = id;
        d.finished = true;
        d.finish_reason = FinishReason::kAbort;
        cb(d);
        continue;
      }
      Status s = engine_->add_request(id, req.prompt_ids, req.params);
      if (!s.ok()) {
        StreamDelta d;
        d.request_id = id;
        d.finished = true;
        d.finish_reason = FinishReason::kError;
        d.text = s.message();
        cb(d);
        continue;
      }
      auto t = std::make_unique<Tracked>();
      t->request = std::move(req);
      t->callback = std::move(cb);
      t->submitted = Clock::now();
      t->seqs.resize(static_cast<size_t>(t->request.params.n));
      t->remaining = t->request.params.n;
      for (int i = 0; i < t->request.params.n; ++i) {
        if (tok_) {
          tokenizer::DetokenizerOptions o;
          o.skip_special_tokens = t->request.params.skip_special_tokens;
          o.stop_strings = t->request.params.stop;
          o.include_stop_string_in_output = t->request.params.include_stop_str_in_output;
          t->seqs[i].detok = std::make_unique<tokenizer::StreamingDetokenizer>(*tok_, o);
        }
        seq_owner_[sequence_id(id, i)] = {t.get(), i};
      }
      tracked_.emplace(id, std::move(t));
    }
    if (drain_expired) {
      for (auto& [id, t] : tracked_) aborts.push_back(id);
    }
    for (const auto& id : aborts) {
      auto it = tracked_.find(id);
      if (it == tracked_.end()) continue;
      Tracked* t = it->second.get();
      engine_->abort(id);
      for (size_t i = 0; i < t->seqs.size(); ++i) {
        if (t->seqs[i].done) continue;
        StreamDelta d;
        d.request_id = id;
        d.index = static_cast<int>(i);
        d.finished = true;
        d.finish_reason = FinishReason::kAbort;
        d.prompt_tokens = static_cast<int>(t->request.prompt_ids.size());
        t->callback(d);
        seq_owner_.erase(sequence_id(id, static_cast<int>(i)));
      }
      tracked_.erase(it);
    }
    if (engine_->has_unfinished()) {
      try {
        auto outs = engine_->step();
        handle_outputs(outs);
      } catch (const std::exception& e) {
        // A failed step leaves the device state unknown: fail every request and stop.
        TLOG_ERROR("engine step failed: {}; failing all requests", e.what());
        for (auto& [id, t] : tracked_)
          for (size_t i = 0; i < t->seqs.size(); ++i)
            if (!t->seqs[i].done) {
              StreamDelta d;
              d.request_id = id;
              d.index = static_cast<int>(i);
              d.finished = true;
              d.finish_reason = FinishReason::kError;
              d.text = std::string("engine error: ") + e.what();
              t->callback(d);
            }
        tracked_.clear();
        seq_owner_.clear();
        std::lock_guard<std::mutex> lk(mu_);
        snapshot_.alive = false;
        snapshot_.fatal_error = e.what();
        for (auto& [req, cb] : pending_) {
          StreamDelta d;
          d.request_id = req.id;
          d.finished = true;
          d.finish_reason = FinishReason::kError;
          d.text = snapshot_.fatal_error;
          cb(d);
        }
        pending_.clear();
        return;
      }
    }
    std::lock_guard<std::mutex> lk(mu_);
    snapshot_.engine = engine_->stats();
    if (draining_ && tracked_.empty() && pending_.empty() && !engine_->has_unfinished()) return;
  }
}

void AsyncEngine::handle_outputs(std::vector<RequestOutput>& outs) {
  const auto now = Clock::now();
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
    d.prompt_tokens = o.num_prompt_tokens;
    d.completion_tokens = o.num_output_tokens;
    d.cached_tokens = o.num_cached_tokens;
    if (!seq.got_first && !o.new_token_ids.empty()) {
      seq.got_first = true;
      d.first_token_latency = std::chrono::duration<double>(now - t->submitted).count();
    }
    bool stopped_by_string = false;
    if (seq.detok) {
      for (int32_t tok : o.new_token_ids) {
        auto r = seq.detok->push(tok);
        d.text += r.text;
        if (r.stopped) {
          stopped_by_string = true;
          d.stop_string = r.stop_string;
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
    }
    if (d.finished) {
      seq.done = true;
      seq_owner_.erase(owner);
    }
    const std::string rid = t->request.id;
    const bool last = d.finished && --t->remaining == 0;
    t->callback(d);
    if (last) tracked_.erase(rid);
  }
}

}  // namespace tessera
