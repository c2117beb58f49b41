#include <fmt/format.h>

#include "bench/report.h"
#include "bench/report_agent.h"
#include "bench/svg_chart.h"

namespace tessera::bench {
namespace {

// Colour-blind-safe palette (Okabe-Ito).
constexpr const char* kColors[] = {"#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9"};

template <typename Getter>
ChartSeries series_of(const BenchReport& report, std::string name, int color, Getter value) {
  ChartSeries s{std::move(name), kColors[color % 6], {}};
  for (const LevelMetrics& level : report.levels) s.values.push_back(value(level));
  return s;
}

std::vector<std::string> x_labels(const BenchReport& report) {
  std::vector<std::string> labels;
  for (const LevelMetrics& level : report.levels) labels.push_back(concurrency_label(level));
  return labels;
}

// One level: the latency distributions (the percentile curves of TTFT, TPOT, ITL and end-to-end latency), since
// charts over levels would be single dots; the summary table holds the throughputs.
std::string distribution_charts(const LevelMetrics& l) {
  const std::vector<std::string> at = {"min", "p50", "p90", "p95", "p99", "max"};
  auto curve = [](std::string name, int color, const Summary& s, double scale) {
    return ChartSeries{std::move(name),
                       kColors[color % 6],
                       {s.min * scale, s.median * scale, s.p90 * scale, s.p95 * scale, s.p99 * scale, s.max * scale}};
  };
  std::vector<LineChart> charts;
  charts.push_back({"Token latencies (distribution)",
                    "percentile",
                    "ms",
                    at,
                    {curve("TTFT", 0, l.ttft_ms, 1), curve("TPOT", 1, l.tpot_ms, 1), curve("ITL", 2, l.itl_ms, 1)}});
  charts.push_back(
      {"End-to-end latency (distribution)", "percentile", "seconds", at, {curve("E2E", 3, l.e2el_ms, 0.001)}});
  std::string html = "<div class=\"charts\">\n";
  for (const LineChart& chart : charts) html += render_line_chart_svg(chart);
  return html + "</div>\n";
}

std::string charts(const BenchReport& report) {
  if (report.levels.size() == 1) return distribution_charts(report.levels.front());
  const std::string x_title = "max concurrency";
  std::vector<LineChart> charts;
  charts.push_back({"Token throughput",
                    x_title,
                    "tokens/s",
                    x_labels(report),
                    {series_of(report, "completion tok/s", 0, [](auto& l) { return l.completion_token_throughput; }),
                     series_of(report, "total tok/s", 1, [](auto& l) { return l.total_token_throughput; }),
                     series_of(report, "prompt tok/s", 2, [](auto& l) { return l.prompt_token_throughput; })}});
  LineChart requests{
      "Request throughput", x_title, "requests/s", x_labels(report), {series_of(report, "QPS", 0, [](auto& l) {
        return l.request_throughput;
      })}};
  if (report.slo.any()) requests.series.push_back(series_of(report, "goodput", 3, [](auto& l) { return l.goodput; }));
  charts.push_back(requests);
  charts.push_back({"End-to-end latency",
                    x_title,
                    "seconds",
                    x_labels(report),
                    {series_of(report, "mean", 0, [](auto& l) { return l.e2el_ms.mean / 1000; }),
                     series_of(report, "p50", 1, [](auto& l) { return l.e2el_ms.median / 1000; }),
                     series_of(report, "p90", 2, [](auto& l) { return l.e2el_ms.p90 / 1000; }),
                     series_of(report, "p95", 3, [](auto& l) { return l.e2el_ms.p95 / 1000; }),
                     series_of(report, "p99", 4, [](auto& l) { return l.e2el_ms.p99 / 1000; })}});
  charts.push_back({"Time to first token",
                    x_title,
                    "ms",
                    x_labels(report),
                    {series_of(report, "p50", 1, [](auto& l) { return l.ttft_ms.median; }),
                     series_of(report, "p95", 3, [](auto& l) { return l.ttft_ms.p95; }),
                     series_of(report, "p99", 4, [](auto& l) { return l.ttft_ms.p99; })}});
  charts.push_back({"Time per output token / inter-token latency",
                    x_title,
                    "ms",
                    x_labels(report),
                    {series_of(report, "TPOT p50", 0, [](auto& l) { return l.tpot_ms.median; }),
                     series_of(report, "TPOT p95", 5, [](auto& l) { return l.tpot_ms.p95; }),
                     series_of(report, "ITL p50", 2, [](auto& l) { return l.itl_ms.median; }),
                     series_of(report, "ITL p99", 3, [](auto& l) { return l.itl_ms.p99; })}});
  std::string html = "<div class=\"charts\">\n";
  for (const LineChart& chart : charts) html += render_line_chart_svg(chart);
  return html + "</div>\n";
}

std::string summary_table(const BenchReport& report) {
  std::string html =
      "<table><tr><th>concurrency</th><th>duration (s)</th><th>QPS</th><th>prompt tok/s</th><th>completion tok/s</th>"
      "<th>total tok/s</th><th>avg (s)</th><th>p50 (s)</th><th>p95 (s)</th><th>p99 (s)</th><th>TTFT p50 (ms)</th>"
      "<th>TPOT p50 (ms)</th><th>ok/failed</th><th>goodput</th><th>max in flight</th><th>client CPU</th></tr>\n";
  for (const LevelMetrics& l : report.levels) {
    std::string failures;
    for (const auto& [kind, count] : l.failures_by_kind)
      failures += fmt::format("{}{} {}", failures.empty() ? " (" : ", ", escape_html(kind), count);
    if (!failures.empty()) failures += ")";
    html += fmt::format(
        "<tr><td>{}</td><td>{:.3f}</td><td>{:.3f}</td><td>{:.1f}</td><td>{:.1f}</td><td>{:.1f}</td><td>{:.3f}</td>"
        "<td>{:.3f}</td><td>{:.3f}</td><td>{:.3f}</td><td>{:.1f}</td><td>{:.1f}</td><td class=\"{}\">{}/{}{}</td>"
        "<td>{}</td><td>{}</td><td>{:.0f}%</td></tr>\n",
        concurrency_label(l), l.duration_s, l.request_throughput, l.prompt_token_throughput,
        l.completion_token_throughput, l.total_token_throughput, l.e2el_ms.mean / 1000, l.e2el_ms.median / 1000,
        l.e2el_ms.p95 / 1000, l.e2el_ms.p99 / 1000, l.ttft_ms.median, l.tpot_ms.median, l.failed ? "bad" : "ok",
        l.completed, l.failed, failures, l.slo_set ? fmt::format("{:.3f}", l.goodput) : "-", l.max_in_flight,
        l.client_cpu_percent);
  }
  return html + "</table>\n";
}

}  // namespace

std::string report_to_html(const BenchReport& report) {
  std::string html = R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tessera bench report</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:22px;margin:0 0 8px} h2{font-size:17px;margin:16px 0 6px} .meta{color:#555;margin-bottom:16px;font-size:13px}
.charts{display:flex;flex-wrap:wrap;gap:12px;margin:12px 0}
.chart{border:1px solid #ddd;border-radius:6px;background:#fff}
table{border-collapse:collapse;font-size:13px;background:#fff} th,td{border:1px solid #ddd;padding:4px 8px;text-align:right}
th{background:#f0f0f0} td.bad{color:#b00020;font-weight:bold} ul{font-size:13px;color:#444}
</style></head><body>
)";
  html += "<h1>tessera bench report</h1>\n";
  html += fmt::format(
      "<div class=\"meta\">server <b>{}{}</b> · model <b>{}</b> · {} · temperature {} · {} · {} · "
      "tessera {}</div>\n",
      escape_html(report.base_url), escape_html(report.endpoint), escape_html(report.model),
      report.stream ? "streaming" : "not streaming", report.temperature, escape_html(report.workload),
      escape_html(report.started_at_utc), escape_html(report.tool_version));
  html += summary_table(report);
  html += charts(report);
  if (report.agent) html += agent_html(*report.agent);
  if (!report.notes.empty()) {
    html += "<ul>\n";
    for (const std::string& note : report.notes) html += "<li>" + escape_html(note) + "</li>\n";
    html += "</ul>\n";
  }
  return html + "</body></html>\n";
}

}  // namespace tessera::bench
