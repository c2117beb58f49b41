// The per-turn part of an --dataset-name agent report, for the terminal, JSON, Markdown and HTML reports.
#include <fmt/format.h>

#include "bench/report.h"
#include "bench/report_agent.h"
#include "bench/svg_chart.h"

namespace tessera::bench {
namespace {

std::string cached_cell(double mean) { return mean < 0 ? std::string("n/a") : fmt::format("{:.1f}", mean); }

std::string turns_label(const AgentMetrics& a) {
  return a.options.turns > 2 ? fmt::format("turns 2-{}", a.options.turns) : std::string("turn 2");
}

std::string reference_line(const AgentMetrics& a) {
  if (!a.reference_completed)
    return fmt::format("reference: {}-token prompt alone: no successful run ({} asked, {} failed)",
                       a.options.reference_len, a.options.reference_runs, a.reference_failed);
  return fmt::format("reference: {}-token prompt alone, {} run(s): TTFT median {:.1f} ms (min {:.1f}, max {:.1f})",
                     a.options.reference_len, a.reference_completed, a.reference_ttft_ms.median,
                     a.reference_ttft_ms.min, a.reference_ttft_ms.max);
}

}  // namespace

std::string agent_summary_line(const AgentMetrics& a) {
  if (a.options.turns < 2) return "one turn a conversation: no later turns to compare";
  std::string hit = a.prefix_cache_hit_rate < 0
                        ? std::string("prefix-cache hit rate n/a (no usage.prompt_tokens_details.cached_tokens)")
                        : fmt::format("prefix-cache hit rate {:.1f}% ({} of {} prompt tokens cached)",
                                      100.0 * a.prefix_cache_hit_rate, a.later_cached_tokens, a.later_prompt_tokens);
  std::string ratio = a.ttft_ratio < 0 ? std::string("TTFT ratio n/a")
                                       : fmt::format("mean TTFT {:.1f} ms = {:.2f}x the reference TTFT",
                                                     a.later_ttft_mean_ms, a.ttft_ratio);
  return fmt::format("{}: {}; {}", turns_label(a), hit, ratio);
}

std::string agent_terminal_report(const AgentMetrics& a) {
  std::string out = fmt::format(
      "\nagent conversations: {} at once x {} turns, a shared {}-token system prompt, {} tokens in and {} out a "
      "turn\n{}\n",
      a.options.conversations, a.options.turns, a.options.system_prompt_len, a.options.turn_input_len,
      a.options.turn_output_len, reference_line(a));
  out += fmt::format("{:>5} | {:>8} | {:>9} | {:>26} | {:>13} | {:>13}\n", "turn", "requests", "ok/failed",
                     "TTFT ms mean/p50/p99", "prompt tokens", "cached tokens");
  for (const AgentTurnMetrics& t : a.turns)
    out += fmt::format("{:>5} | {:>8} | {:>9} | {:>26} | {:>13.1f} | {:>13}\n", t.turn, t.requests,
                       fmt::format("{}/{}", t.completed, t.failed),
                       fmt::format("{:.1f}/{:.1f}/{:.1f}", t.ttft_ms.mean, t.ttft_ms.median, t.ttft_ms.p99),
                       t.mean_prompt_tokens, cached_cell(t.mean_cached_tokens));
  out += agent_summary_line(a) + "\n";
  if (a.turns_not_sent)
    out += fmt::format("{} turns were not sent: an earlier turn of their conversation failed\n", a.turns_not_sent);
  return out;
}

nlohmann::json agent_json(const AgentMetrics& a) {
  using nlohmann::json;
  auto number_or_null = [](double v) { return v < 0 ? json(nullptr) : json(v); };
  json turns = json::array();
  for (const AgentTurnMetrics& t : a.turns)
    turns.push_back({{"turn", t.turn},
                     {"requests", t.requests},
                     {"completed", t.completed},
                     {"failed", t.failed},
                     {"ttft_ms", {{"mean", t.ttft_ms.mean}, {"median", t.ttft_ms.median}, {"p99", t.ttft_ms.p99}}},
                     {"mean_prompt_tokens", t.mean_prompt_tokens},
                     {"mean_cached_tokens", number_or_null(t.mean_cached_tokens)}});
  const AgentOptions& o = a.options;
  return {{"conversations", o.conversations},
          {"turns", o.turns},
          {"system_prompt_len", o.system_prompt_len},
          {"turn_input_len", o.turn_input_len},
          {"turn_output_len", o.turn_output_len},
          {"reference",
           {{"prompt_len", o.reference_len},
            {"runs", o.reference_runs},
            {"completed", a.reference_completed},
            {"failed", a.reference_failed},
            {"ttft_ms", a.reference_completed ? json({{"median", a.reference_ttft_ms.median},
                                                      {"min", a.reference_ttft_ms.min},
                                                      {"max", a.reference_ttft_ms.max}})
                                              : json(nullptr)}}},
          {"per_turn", turns},
          {"turns_not_sent", a.turns_not_sent},
          {"later_turns",
           {{"prompt_tokens", a.later_prompt_tokens},
            {"cached_tokens", a.later_cached_tokens},
            {"requests_without_cached_tokens", a.later_without_cached_tokens},
            {"prefix_cache_hit_rate", number_or_null(a.prefix_cache_hit_rate)},
            {"mean_ttft_ms", number_or_null(a.later_ttft_mean_ms)},
            {"ttft_ratio_to_reference", number_or_null(a.ttft_ratio)}}}};
}

std::string agent_markdown(const AgentMetrics& a) {
  std::string md = fmt::format(
      "\n## Agent conversations\n\n{} at once x {} turns, a shared {}-token system prompt, {} tokens in and {} out a "
      "turn. {}.\n\n| turn | requests | ok/failed | TTFT mean (ms) | TTFT p50 (ms) | TTFT p99 (ms) | prompt tokens "
      "(mean) | cached tokens (mean) |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
      a.options.conversations, a.options.turns, a.options.system_prompt_len, a.options.turn_input_len,
      a.options.turn_output_len, reference_line(a));
  for (const AgentTurnMetrics& t : a.turns)
    md += fmt::format("| {} | {} | {}/{} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {} |\n", t.turn, t.requests, t.completed,
                      t.failed, t.ttft_ms.mean, t.ttft_ms.median, t.ttft_ms.p99, t.mean_prompt_tokens,
                      cached_cell(t.mean_cached_tokens));
  return md + "\n" + agent_summary_line(a) + ".\n";
}

std::string agent_html(const AgentMetrics& a) {
  std::string html = fmt::format("<h2>Agent conversations</h2>\n<p>{}<br>{}</p>\n", escape_html(reference_line(a)),
                                 escape_html(agent_summary_line(a)));
  html +=
      "<table><tr><th>turn</th><th>requests</th><th>ok/failed</th><th>TTFT mean (ms)</th><th>TTFT p50 (ms)</th>"
      "<th>TTFT p99 (ms)</th><th>prompt tokens</th><th>cached tokens</th></tr>\n";
  LineChart chart{"Time to first token by turn", "turn", "ms", {}, {}};
  ChartSeries mean{"mean", "#0072B2", {}}, p99{"p99", "#D55E00", {}}, reference{"reference (median)", "#009E73", {}};
  for (const AgentTurnMetrics& t : a.turns) {
    html += fmt::format(
        "<tr><td>{}</td><td>{}</td><td class=\"{}\">{}/{}</td><td>{:.1f}</td><td>{:.1f}</td><td>{:.1f}</td>"
        "<td>{:.1f}</td><td>{}</td></tr>\n",
        t.turn, t.requests, t.failed ? "bad" : "ok", t.completed, t.failed, t.ttft_ms.mean, t.ttft_ms.median,
        t.ttft_ms.p99, t.mean_prompt_tokens, cached_cell(t.mean_cached_tokens));
    chart.x_labels.push_back(std::to_string(t.turn));
    mean.values.push_back(t.ttft_ms.mean);
    p99.values.push_back(t.ttft_ms.p99);
    reference.values.push_back(a.reference_ttft_ms.median);
  }
  chart.series = {mean, p99};
  if (a.reference_completed) chart.series.push_back(reference);
  return html + "</table>\n<div class=\"charts\">\n" + render_line_chart_svg(chart) + "</div>\n";
}

}  // namespace tessera::bench
