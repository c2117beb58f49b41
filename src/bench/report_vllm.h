// vLLM's benchmark output for one level, so scripts written for `vllm bench serve` read tessera's runs: the
// "Serving Benchmark Result" block on stdout and the result JSON of --save-result (vllm/benchmarks/serve.py's
// keys: completed, total_input_tokens, request_throughput, output_throughput, mean_ttft_ms, p99_ttft_ms, ...).
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "bench/load_runner.h"
#include "bench/metrics.h"

namespace tessera::bench {

struct VllmResultSettings {
  std::string date;  // %Y%m%d-%H%M%S, local time
  std::string backend, label, model_id, tokenizer_id;
  size_t num_prompts = 0;
  double request_rate = 0;  // infinity: "inf"
  double burstiness = 1;
  std::optional<int> max_concurrency;
  ArrivalProcess arrivals;            // a ramp (--ramp-up-strategy) adds vLLM's ramp_up_* keys and rps_change_events
  std::vector<std::string> metadata;  // KEY=VALUE
  std::vector<std::string> metrics;   // ttft, tpot, itl, e2el: which get mean/median/std/percentiles
  std::vector<double> percentiles;    // e.g. {99} or {25, 50, 75}
  bool goodput = false;               // --goodput given: request_goodput is a number, else null
  bool detailed = false;              // --save-detailed: the per-request lists stay in the file
};

// Splits "ttft,tpot,itl" / "25,50,99" and checks the names and the numbers (0 < p <= 100); throws on others.
std::vector<std::string> parse_percentile_metrics(const std::string& text);
std::vector<double> parse_metric_percentiles(const std::string& text);

// The result JSON of one level, keys in vLLM's order.
nlohmann::ordered_json vllm_result_json(const LevelResult& result, const LevelMetrics& metrics,
                                        const VllmResultSettings& settings);
// The block vLLM prints after a run ("============ Serving Benchmark Result ============" ...).
std::string vllm_result_block(const nlohmann::ordered_json& result, const VllmResultSettings& settings);
// vLLM's default file name: {label or backend}-{rate}qps[-concurrency{N}]-{model basename}-{date}.json; with a
// ramp {label or backend}-ramp-up-{strategy}-{start}qps-{end}qps[-concurrency{N}]-{model basename}-{date}.json.
std::string vllm_result_filename(const VllmResultSettings& settings);
// vLLM's rps_change_events of a ramped level: {"rps": start, "timestamp"} at the start, then one event for each
// whole rate (int(rate)) the ramp passes, stamped when the request that reached it was due (wall clock, local
// time, Python's datetime.isoformat()).
nlohmann::ordered_json rps_change_events(const LevelResult& result);
// Python's str() of a float ("8.0", "0.5", "inf"), as vLLM's file names and logs show rates.
std::string python_float(double v);

}  // namespace tessera::bench
