// vLLM's periodic stats line, logged every interval (10 s) while the server has work:
//   Avg prompt throughput: 12.5 tokens/s, Avg generation throughput: 40.1 tokens/s, Running: 2 reqs,
//   Waiting: 0 reqs, GPU KV cache usage: 1.2%, Prefix cache hit rate: 35.0%
// (--disable-log-stats turns it off).
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "engine/async_engine.h"

namespace tessera::server {

// The line for the interval from `before` to `now` (`seconds` long). The prefix cache hit rate is the
// interval's hits over its queries, or since startup when the interval had none.
std::string stats_log_line(const AsyncEngineStats& now, const AsyncEngineStats& before, double seconds);

// Whether the interval is worth a line (vLLM: tokens went through in it or in the one before, or requests
// are running or waiting): an idle server stays quiet.
bool stats_interval_active(const AsyncEngineStats& now, const AsyncEngineStats& before, bool previous_active);

// A thread that reads `stats` every `interval` and logs the line while there is activity.
class StatsLogger {
 public:
  StatsLogger(std::function<AsyncEngineStats()> stats, std::chrono::milliseconds interval);
  ~StatsLogger();  // stops the thread

 private:
  void run();
  std::function<AsyncEngineStats()> stats_;
  std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tessera::server
