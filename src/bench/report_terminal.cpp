#include <fmt/format.h>

#include "bench/report.h"
#include "bench/report_agent.h"

namespace tessera::bench {
namespace {

std::string failure_breakdown(const LevelMetrics& level) {
  std::string text;
  for (const auto& [kind, count] : level.failures_by_kind) {
    text += text.empty() ? "" : ", ";
    text += fmt::format("{} {}", kind, count);
  }
  return text;
}

}  // namespace

std::string concurrency_label(const LevelMetrics& level) {
  return level.max_concurrency > 0 ? std::to_string(level.max_concurrency) : std::string("inf");
}

std::string format_terminal_report(const BenchReport& report) {
  std::string out;
  out += fmt::format("tessera bench  {}{}  model {}  {}  {}\n", report.base_url, report.endpoint, report.model,
                     report.stream ? "streaming" : "not streaming", report.workload);
  out += fmt::format("{:>11} | {:>11} | {:>9} | {:>12} | {:>16} | {:>11} | {:>9} | {:>9} | {:>9} | {:>9}\n",
                     "concurrency", "duration(s)", "QPS", "prompt tok/s", "completion tok/s", "total tok/s", "avg(s)",
                     "p50(s)", "p95(s)", "ok/failed");
  for (const LevelMetrics& l : report.levels) {
    out += fmt::format(
        "{:>11} | {:>11.3f} | {:>9.3f} | {:>12.3f} | {:>16.3f} | {:>11.3f} | {:>9.3f} | {:>9.3f} | {:>9.3f} | "
        "{:>9}\n",
        concurrency_label(l), l.duration_s, l.request_throughput, l.prompt_token_throughput,
        l.completion_token_throughput, l.total_token_throughput, l.e2el_ms.mean / 1000, l.e2el_ms.median / 1000,
        l.e2el_ms.p95 / 1000, fmt::format("{}/{}", l.completed, l.failed));
  }
  out += "\n";
  out += fmt::format("{:>11} | {:>26} | {:>20} | {:>20} | {:>13} | {:>9} | {:>16}\n", "concurrency",
                     "TTFT ms mean/p50/p99", "TPOT ms mean/p50/p99", "ITL ms mean/p50/p99",
                     report.slo.any() ? "goodput req/s" : "goodput", "in flight", "client CPU/lag99");
  for (const LevelMetrics& l : report.levels) {
    std::string goodput = l.slo_set ? fmt::format("{:.3f}", l.goodput) : "-";
    out += fmt::format("{:>11} | {:>26} | {:>20} | {:>20} | {:>13} | {:>9} | {:>16}\n", concurrency_label(l),
                       fmt::format("{:.1f}/{:.1f}/{:.1f}", l.ttft_ms.mean, l.ttft_ms.median, l.ttft_ms.p99),
                       fmt::format("{:.1f}/{:.1f}/{:.1f}", l.tpot_ms.mean, l.tpot_ms.median, l.tpot_ms.p99),
                       fmt::format("{:.1f}/{:.1f}/{:.1f}", l.itl_ms.mean, l.itl_ms.median, l.itl_ms.p99), goodput,
                       l.max_in_flight, fmt::format("{:.0f}%/{:.1f}ms", l.client_cpu_percent, l.loop_lag_ms.p99));
  }
  for (const LevelMetrics& l : report.levels) {
    if (!l.failed) continue;
    out += fmt::format("\nconcurrency {}: {} failed ({})", concurrency_label(l), l.failed, failure_breakdown(l));
    for (const auto& [kind, message] : l.failure_example) out += fmt::format("\n  {}: {}", kind, message);
    out += "\n";
  }
  if (report.agent) out += agent_terminal_report(*report.agent);
  for (const std::string& note : report.notes) out += "\nnote: " + note;
  if (!report.notes.empty()) out += "\n";
  return out;
}

}  // namespace tessera::bench
