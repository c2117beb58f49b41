// Prometheus metrics: vLLM's series under vLLM's names (the `vllm:` prefix, a `model_name` label, vLLM's
// buckets), so vLLM's Grafana dashboard and scrapers work unchanged, and tessera's own under `tessera:`.
// Formatted by hand (a few dozen series do not justify prometheus-cpp's registry and its extra link
// dependency; the exposition text format is small and stable).
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tessera {
struct AsyncEngineStats;
}

namespace tessera::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> buckets) : bounds_(std::move(buckets)), counts_(bounds_.size() + 1) {}
  void observe(double v);
  void format(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// vLLM's 1-2-5 buckets up to `max` (1, 2, 5, 10, 20, 50, ...), for token counts.
std::vector<double> one_two_five_buckets(int max);

// What vLLM observes of one finished request. Times in seconds; a negative time was not measured (an
// aborted request that never got a token has no time to first token).
struct FinishedRequest {
  std::string finish_reason;  // "stop", "length", "abort", "error"
  double e2e = 0, ttft = -1, queue = -1, prefill = -1, decode = -1, inference = -1;
  int prompt_tokens = 0, generation_tokens = 0;
  int max_generation_tokens = 0;  // the longest of the request's n outputs
  int max_tokens = 0, n = 1;      // the request's parameters
};

class Metrics {
 public:
  // max_model_len sets the token-count histograms' buckets (vLLM's 1-2-5 buckets up to it).
  explicit Metrics(std::string model_name, int max_model_len = 0);

  void request_finished(const FinishedRequest& r);
  // The time between two outputs of a sequence (vLLM's inter_token_latency_seconds).
  void inter_token_latency(double seconds) { itl_.observe(seconds); }
  void request_rejected() { rejected_++; }
  uint64_t aborted() const { return finished_[2].load(); }

  // The exposition text; gauges and token counters come from the engine's snapshot.
  std::string render(const AsyncEngineStats& stats) const;

 private:
  void render_engine(std::string& o, const AsyncEngineStats& s) const;
  void render_requests(std::string& o) const;

  std::string labels_;
  std::array<std::atomic<uint64_t>, 4> finished_{};  // stop, length, abort, error
  std::atomic<uint64_t> rejected_{0};
  Histogram ttft_, tpot_, itl_, e2e_, queue_, prefill_, decode_, inference_;
  Histogram prompt_tokens_, generation_tokens_, max_generation_tokens_, max_tokens_, n_;
};

}  // namespace tessera::server
