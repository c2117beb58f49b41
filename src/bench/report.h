// A finished benchmark and the four ways it is written out: terminal table, JSON, Markdown, HTML.
// An agent run's per-turn table goes into the terminal, JSON and Markdown reports.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "bench/agent_metrics.h"
#include "bench/metrics.h"

namespace tessera::bench {

struct BenchReport {
  std::string tool_version;
  std::string started_at_utc;  // ISO 8601
  std::string base_url;
  std::string endpoint;
  std::string model;
  bool stream = true;
  double temperature = 0;
  std::string workload;            // "fixed prompt: ...", "random: input 1024 / output 128 ...", ...
  std::vector<std::string> notes;  // estimates and caveats the reader must know about
  SloTargets slo;
  std::vector<LevelMetrics> levels;
  // --dataset-name agent: the per-turn figures (its one level holds every turn's request).
  std::optional<AgentMetrics> agent;
};

// Seed-style summary table plus a latency table, for stdout.
std::string format_terminal_report(const BenchReport& report);
nlohmann::json report_to_json(const BenchReport& report);
std::string report_to_markdown(const BenchReport& report);
// A self-contained page: inline CSS and SVG plots, no scripts, nothing fetched.
std::string report_to_html(const BenchReport& report);

// "10", or "∞" for an unlimited level; the x axis of every plot.
std::string concurrency_label(const LevelMetrics& level);

}  // namespace tessera::bench
