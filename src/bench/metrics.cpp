#include "bench/metrics.h"

#include "core/error.h"

namespace tessera::bench {

SloTargets parse_slo_targets(const std::vector<std::string>& items) {
  SloTargets targets;
  for (const std::string& item : items) {
    size_t colon = item.find(':');
    std::string key = item.substr(0, colon);
    double value = 0;
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no value");
      size_t used = 0;
      value = std::stod(item.substr(colon + 1), &used);
      if (used != item.size() - colon - 1 || value <= 0) throw std::invalid_argument("bad value");
    } catch (const std::exception&) {
      fail(ErrorKind::kInvalidArgument,
           "--goodput '{}': expected KEY:MILLISECONDS with a positive number, e.g. ttft:500", item);
    }
    if (key == "ttft")
      targets.ttft_ms = value;
    else if (key == "tpot")
      targets.tpot_ms = value;
    else if (key == "e2el")
      targets.e2el_ms = value;
    else
      fail(ErrorKind::kInvalidArgument, "--goodput '{}': the key must be ttft, tpot or e2el", item);
  }
  return targets;
}

namespace {

// vLLM's definition: time per output token after the first, per request.
std::optional<double> time_per_output_token_ms(const RequestRecord& record) {
  if (record.completion_tokens <= 1 || record.ttft_s < 0) return std::nullopt;
  return (record.latency_s - record.ttft_s) * 1000.0 / (record.completion_tokens - 1);
}

bool meets(const SloTargets& slo, const RequestRecord& record) {
  if (slo.ttft_ms && (record.ttft_s < 0 || record.ttft_s * 1000.0 > *slo.ttft_ms)) return false;
  if (slo.tpot_ms) {
    std::optional<double> tpot = time_per_output_token_ms(record);
    if (tpot && *tpot > *slo.tpot_ms) return false;
  }
  if (slo.e2el_ms && record.latency_s * 1000.0 > *slo.e2el_ms) return false;
  return true;
}

}  // namespace

LevelMetrics compute_level_metrics(const LevelResult& result, const SloTargets& slo) {
  LevelMetrics m;
  m.label = result.config.label;
  m.max_concurrency = result.config.max_concurrency;
  m.request_rate = result.config.arrivals.request_rate;
  m.requests = result.records.size();
  m.duration_s = result.duration_s;
  m.max_in_flight = result.max_in_flight;
  m.slo_set = slo.any();
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestRecord& record : result.records) {
    if (!record.success) {
      ++m.failed;
      ++m.failures_by_kind[record.failure_kind];
      m.failure_example.emplace(record.failure_kind, record.failure_message);
      continue;
    }
    ++m.completed;
    m.prompt_tokens += record.prompt_tokens;
    m.completion_tokens += record.completion_tokens;
    if (!record.usage_reported) ++m.requests_without_usage;
    if (record.ttft_s >= 0) ttft.push_back(record.ttft_s * 1000.0);
    if (auto value = time_per_output_token_ms(record)) tpot.push_back(*value);
    for (double gap : record.itl_s) itl.push_back(gap * 1000.0);
    e2el.push_back(record.latency_s * 1000.0);
    if (m.slo_set && meets(slo, record)) ++m.good_requests;
  }
  m.ttft_ms = summarize(std::move(ttft));
  m.tpot_ms = summarize(std::move(tpot));
  m.itl_ms = summarize(std::move(itl));
  m.e2el_ms = summarize(std::move(e2el));
  if (m.duration_s > 0) {
    m.request_throughput = static_cast<double>(m.completed) / m.duration_s;
    m.prompt_token_throughput = static_cast<double>(m.prompt_tokens) / m.duration_s;
    m.completion_token_throughput = static_cast<double>(m.completion_tokens) / m.duration_s;
    m.total_token_throughput = m.prompt_token_throughput + m.completion_token_throughput;
    m.goodput = static_cast<double>(m.good_requests) / m.duration_s;
    m.client_cpu_percent = 100.0 * result.overhead.cpu_seconds / m.duration_s;
  }
  m.client_cpu_seconds = result.overhead.cpu_seconds;
  if (m.requests) m.client_cpu_us_per_request = 1e6 * result.overhead.cpu_seconds / static_cast<double>(m.requests);
  m.loop_lag_ms = summarize(result.overhead.loop_lag_ms);
  m.connections_opened = result.overhead.connections_opened;
  return m;
}

}  // namespace tessera::bench
