// Prometheus metrics with vLLM's names and meanings under the `tessera:` prefix, formatted by
// hand (a dozen series do not justify prometheus-cpp's registry and its extra link dependency;
// the exposition text format is small and stable).
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

class Metrics {
 public:
  explicit Metrics(std::string model_name);

  // finish_reason: "stop", "length", "abort", "error"
  void request_finished(const std::string& finish_reason, double e2e_seconds, double ttft_seconds,
                        int completion_tokens);
  void request_rejected() { rejected_++; }
  uint64_t aborted() const { return finished_[2].load(); }

  // The exposition text; gauges and token counters come from the engine's snapshot.
  std::string render(const AsyncEngineStats& stats) const;

 private:
  std::string labels_;
  std::array<std::atomic<uint64_t>, 4> finished_{};  // stop, length, abort, error
  std::atomic<uint64_t> rejected_{0};
  Histogram ttft_, tpot_, e2e_;
};

}  // namespace tessera::server
