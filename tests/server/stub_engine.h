// A stub engine at the EngineClient seam, for tests of the API server without a model (api_server_test.cpp)
// and for the request fuzzer (fuzz/request_fuzz.cpp). It records what is submitted and answers a request with
// a short output (text with a think block and a hermes tool call, token ids, logprobs when asked) when the
// server aborts it (the client went away), as the real engine does, or when the test calls finish_all().
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/async_engine.h"

namespace tessera::server_test {

class StubEngine : public EngineClient {
 public:
  static constexpr const char* kAnswer =
      "<think>why</think>Hello <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";

  SubmitResult submit(std::vector<GenerationRequest> requests, std::vector<OutputCallback> on_output) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (!refusal_.ok()) return refusal_;
    for (size_t i = 0; i < requests.size(); ++i) {
      submitted_.push_back(requests[i]);
      open_[requests[i].id] = {requests[i].params, std::move(on_output[i])};
    }
    return {};
  }
  void abort(const std::string& id) override {
    Open o;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = open_.find(id);
      if (it == open_.end()) return;
      o = std::move(it->second);
      open_.erase(it);
    }
    answer(id, o);
  }
  // Answers every open request.
  void finish_all() {
    std::map<std::string, Open> all;
    {
      std::lock_guard<std::mutex> lk(mu_);
      all.swap(open_);
    }
    for (auto& [id, o] : all) answer(id, o);
  }
  AsyncEngineStats stats() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
  }
  int max_model_len() const override { return 4096; }
  int vocab_size() const override { return 151936; }
  std::vector<int32_t> eos_token_ids() const override { return {151645}; }

  // What the tests steer and read.
  // Every later submit() is refused with `r` (kOverloaded: 429, kDead: 503, ...).
  void refuse_with(SubmitResult r) {
    std::lock_guard<std::mutex> lk(mu_);
    refusal_ = std::move(r);
  }
  // stats() reports the engine dead after `error`.
  void fail(std::string error) {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.alive = false;
    stats_.fatal_error = std::move(error);
  }
  std::vector<GenerationRequest> submitted() const {
    std::lock_guard<std::mutex> lk(mu_);
    return submitted_;
  }
  size_t open_requests() const {
    std::lock_guard<std::mutex> lk(mu_);
    return open_.size();
  }

 private:
  struct Open {
    SamplingParams params;
    OutputCallback callback;
  };
  static void answer(const std::string& id, const Open& o) {
    for (int i = 0; i < o.params.n; ++i) {
      StreamDelta d;
      d.request_id = id;
      d.index = i;
      d.token_ids = {9707, 11, 1879};
      d.text = kAnswer;
      if (o.params.logprobs >= 0)
        for (int32_t t : d.token_ids) d.logprobs.push_back(TokenLogprob{t, -0.5f, 1, {{t, -0.5f}, {13, -2.0f}}});
      d.finished = true;
      d.finish_reason = FinishReason::kStop;
      d.prompt_tokens = 5;
      d.completion_tokens = 3;
      o.callback(d);
    }
  }
  mutable std::mutex mu_;
  std::map<std::string, Open> open_;
  std::vector<GenerationRequest> submitted_;
  SubmitResult refusal_;
  AsyncEngineStats stats_;
};

}  // namespace tessera::server_test
