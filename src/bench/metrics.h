// Per-level figures computed from request records: throughput, latency distributions, goodput.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/load_runner.h"
#include "bench/stats.h"

namespace tessera::bench {

// Service-level objectives for goodput, in milliseconds, as vLLM's --goodput KEY:VALUE.
struct SloTargets {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  std::optional<double> e2el_ms;
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};

// Parses "ttft:500", "tpot:50", "e2el:2000" (any subset); throws on anything else.
SloTargets parse_slo_targets(const std::vector<std::string>& items);

struct LevelMetrics {
  std::string label;
  int max_concurrency = 0;  // 0: unlimited
  double request_rate = 0;  // requests per second offered; infinity when all at once
  size_t requests = 0;
  size_t completed = 0;
  size_t failed = 0;
  std::map<std::string, size_t> failures_by_kind;
  std::map<std::string, std::string> failure_example;  // first message of each kind
  double duration_s = 0;
  double request_throughput = 0;  // successful requests per second
  long long prompt_tokens = 0;
  long long completion_tokens = 0;
  double prompt_token_throughput = 0;
  double completion_token_throughput = 0;
  double total_token_throughput = 0;
  size_t requests_without_usage = 0;  // successful ones whose token counts are estimates
  Summary ttft_ms, tpot_ms, itl_ms, e2el_ms;
  bool slo_set = false;
  size_t good_requests = 0;  // met every SLO
  double goodput = 0;        // good requests per second
  size_t max_in_flight = 0;
  // Client overhead.
  double client_cpu_seconds = 0;
  double client_cpu_percent = 0;  // of one core, over the level's duration
  double client_cpu_us_per_request = 0;
  Summary loop_lag_ms;
  size_t connections_opened = 0;
};

LevelMetrics compute_level_metrics(const LevelResult& result, const SloTargets& slo);

}  // namespace tessera::bench
