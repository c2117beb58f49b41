#include <fmt/format.h>

#include "bench/report.h"
#include "bench/report_agent.h"

namespace tessera::bench {
namespace {

std::string summary_cells(const Summary& s) {
  return fmt::format("{:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f}", s.mean, s.median, s.p95, s.p99, s.max);
}

}  // namespace

std::string report_to_markdown(const BenchReport& report) {
  std::string md = "# tessera bench report\n\n";
  md += fmt::format(
      "| setting | value |\n| --- | --- |\n| server | {}{} |\n| model | {} |\n| streaming | {} |\n"
      "| temperature | {} |\n| workload | {} |\n| started | {} |\n| tool | tessera {} |\n",
      report.base_url, report.endpoint, report.model, report.stream ? "yes" : "no", report.temperature, report.workload,
      report.started_at_utc, report.tool_version);
  if (report.slo.any()) {
    std::string slo;
    if (report.slo.ttft_ms) slo += fmt::format("TTFT ≤ {} ms ", *report.slo.ttft_ms);
    if (report.slo.tpot_ms) slo += fmt::format("TPOT ≤ {} ms ", *report.slo.tpot_ms);
    if (report.slo.e2el_ms) slo += fmt::format("E2E ≤ {} ms ", *report.slo.e2el_ms);
    md += fmt::format("| goodput SLO | {}|\n", slo);
  }
  md +=
      "\n## Throughput\n\n| concurrency | duration (s) | QPS (req/s) | prompt tok/s | completion tok/s | total tok/s | "
      "avg latency (s) | p50 (s) | p95 (s) | ok/failed | goodput (req/s) | max in flight |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  for (const LevelMetrics& l : report.levels) {
    md += fmt::format(
        "| {} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {}/{} | {} | {} |\n",
        concurrency_label(l), l.duration_s, l.request_throughput, l.prompt_token_throughput,
        l.completion_token_throughput, l.total_token_throughput, l.e2el_ms.mean / 1000, l.e2el_ms.median / 1000,
        l.e2el_ms.p95 / 1000, l.completed, l.failed, l.slo_set ? fmt::format("{:.3f}", l.goodput) : "-",
        l.max_in_flight);
  }
  md +=
      "\n## Latency (ms): mean | median | p95 | p99 | max\n\n| concurrency | metric | mean | median | p95 | p99 | max "
      "|\n"
      "| --- | --- | --- | --- | --- | --- | --- |\n";
  for (const LevelMetrics& l : report.levels) {
    md += fmt::format("| {} | TTFT | {} |\n", concurrency_label(l), summary_cells(l.ttft_ms));
    md += fmt::format("| {} | TPOT | {} |\n", concurrency_label(l), summary_cells(l.tpot_ms));
    md += fmt::format("| {} | ITL | {} |\n", concurrency_label(l), summary_cells(l.itl_ms));
    md += fmt::format("| {} | E2E | {} |\n", concurrency_label(l), summary_cells(l.e2el_ms));
  }
  md +=
      "\n## Failures and client overhead\n\n| concurrency | failures by kind | client CPU (% of a core) | CPU µs per "
      "request | event-loop lag p99 (ms) | connections opened |\n| --- | --- | --- | --- | --- | --- |\n";
  for (const LevelMetrics& l : report.levels) {
    std::string failures;
    for (const auto& [kind, count] : l.failures_by_kind)
      failures += fmt::format("{}{}: {}", failures.empty() ? "" : ", ", kind, count);
    md += fmt::format("| {} | {} | {:.1f} | {:.0f} | {:.2f} | {} |\n", concurrency_label(l),
                      failures.empty() ? "none" : failures, l.client_cpu_percent, l.client_cpu_us_per_request,
                      l.loop_lag_ms.p99, l.connections_opened);
  }
  if (report.agent) md += agent_markdown(*report.agent);
  if (!report.notes.empty()) {
    md += "\n## Notes\n\n";
    for (const std::string& note : report.notes) md += "- " + note + "\n";
  }
  return md;
}

}  // namespace tessera::bench
