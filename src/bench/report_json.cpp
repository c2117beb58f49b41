#include <cmath>

#include "bench/report.h"
#include "bench/report_agent.h"

namespace tessera::bench {
namespace {

using nlohmann::json;

json summary_json(const Summary& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"median", s.median}, {"p90", s.p90},
          {"p95", s.p95},     {"p99", s.p99},   {"min", s.min},       {"max", s.max}};
}

json optional_number(const std::optional<double>& value) { return value ? json(*value) : json(nullptr); }

json level_json(const LevelMetrics& l) {
  json j;
  j["label"] = l.label;
  j["max_concurrency"] = l.max_concurrency > 0 ? json(l.max_concurrency) : json(nullptr);
  j["request_rate"] = std::isinf(l.request_rate) ? json("inf") : json(l.request_rate);
  j["requests"] = l.requests;
  j["completed"] = l.completed;
  j["failed"] = l.failed;
  j["failures_by_kind"] = l.failures_by_kind;
  j["failure_examples"] = l.failure_example;
  j["duration_s"] = l.duration_s;
  j["request_throughput"] = l.request_throughput;
  j["prompt_tokens"] = l.prompt_tokens;
  j["completion_tokens"] = l.completion_tokens;
  j["prompt_token_throughput"] = l.prompt_token_throughput;
  j["completion_token_throughput"] = l.completion_token_throughput;
  j["total_token_throughput"] = l.total_token_throughput;
  j["requests_without_usage"] = l.requests_without_usage;
  j["ttft_ms"] = summary_json(l.ttft_ms);
  j["tpot_ms"] = summary_json(l.tpot_ms);
  j["itl_ms"] = summary_json(l.itl_ms);
  j["e2el_ms"] = summary_json(l.e2el_ms);
  j["good_requests"] = l.slo_set ? json(l.good_requests) : json(nullptr);
  j["goodput"] = l.slo_set ? json(l.goodput) : json(nullptr);
  j["max_in_flight"] = l.max_in_flight;
  j["client_overhead"] = {{"cpu_seconds", l.client_cpu_seconds},
                          {"cpu_percent_of_one_core", l.client_cpu_percent},
                          {"cpu_us_per_request", l.client_cpu_us_per_request},
                          {"event_loop_lag_ms", summary_json(l.loop_lag_ms)},
                          {"connections_opened", l.connections_opened}};
  return j;
}

}  // namespace

json report_to_json(const BenchReport& report) {
  json j;
  j["tool"] = "tessera bench";
  j["version"] = report.tool_version;
  j["started_at"] = report.started_at_utc;
  j["base_url"] = report.base_url;
  j["endpoint"] = report.endpoint;
  j["model"] = report.model;
  j["stream"] = report.stream;
  j["temperature"] = report.temperature;
  j["workload"] = report.workload;
  j["notes"] = report.notes;
  j["slo_ms"] = {{"ttft", optional_number(report.slo.ttft_ms)},
                 {"tpot", optional_number(report.slo.tpot_ms)},
                 {"e2el", optional_number(report.slo.e2el_ms)}};
  j["levels"] = json::array();
  for (const LevelMetrics& level : report.levels) j["levels"].push_back(level_json(level));
  if (report.agent) j["agent"] = agent_json(*report.agent);
  return j;
}

}  // namespace tessera::bench
