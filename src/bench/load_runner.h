// Runs one level of a benchmark: releases requests on their arrival schedule, keeps at most
// `max_concurrency` in flight, and collects a RequestRecord for each, all on the calling thread.
#pragma once
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "bench/arrival.h"
#include "bench/http_client.h"
#include "bench/openai_protocol.h"
#include "bench/request_record.h"
#include "bench/workload.h"

namespace tessera::bench {

struct LevelConfig {
  std::string label;        // "concurrency 10", shown in reports
  int max_concurrency = 0;  // 0: no limit beyond the arrival process
  ArrivalProcess arrivals;
  uint64_t seed = 0;
  std::string request_id_prefix{};  // non-empty: each request carries x-request-id PREFIX{prompt index}
};

struct RequestSettings {
  ApiEndpoint endpoint = ApiEndpoint::kChatCompletions;
  GenerationParams generation;
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  bool keep_output_text = false;  // for counting tokens afterwards with --tokenizer
};

// How much the client itself cost while the level ran, so a reader can tell whether the
// numbers measure the server or the benchmark.
struct ClientOverhead {
  double cpu_seconds = 0;           // CPU time of the thread driving all requests
  std::vector<double> loop_lag_ms;  // how late a 10 ms probe timer fired: bounds timestamp error
  size_t connections_opened = 0;
};

struct LevelResult {
  LevelConfig config;
  std::vector<RequestRecord> records;                       // in completion order
  double duration_s = 0;                                    // first release to last completion
  Clock::time_point started_at{};                           // record start_s values count from here
  std::chrono::system_clock::time_point wall_started_at{};  // the same moment on the wall clock
  std::vector<double> release_times;  // the arrival schedule, seconds from started_at, in prompt order
  size_t max_in_flight = 0;
  ClientOverhead overhead;
};

// CPU time used by the calling thread so far (the thread driving the requests), in seconds.
double thread_cpu_seconds();

// How late a 10 ms probe timer fires on `io` while requests run (the event loop's lag), appended
// to `lag_ms` sample by sample from start() until stop().
class LoopLagProbe {
 public:
  LoopLagProbe(boost::asio::io_context& io, std::vector<double>& lag_ms) : timer_(io), lag_ms_(lag_ms) {}
  void start(Clock::time_point from);
  void stop();

 private:
  boost::asio::steady_timer timer_;
  std::vector<double>& lag_ms_;
  Clock::time_point due_{};
  bool stopped_ = false;
};

// Called after every completed request with (completed, total, in_flight).
using ProgressHandler = std::function<void(size_t, size_t, size_t)>;

// Runs `io` until every prompt has completed; `io` must not be running elsewhere.
LevelResult run_level(boost::asio::io_context& io, HttpClient& client, const std::vector<PromptSpec>& prompts,
                      const LevelConfig& config, const RequestSettings& settings, const ProgressHandler& progress);

}  // namespace tessera::bench
