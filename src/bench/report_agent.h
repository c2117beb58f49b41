// The per-turn part of an --dataset-name agent report (report_agent.cpp), used by the four report writers.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "bench/agent_metrics.h"

namespace tessera::bench {

// "turns 2-N: prefix-cache hit rate X% (...); mean TTFT Y ms = Z x the reference TTFT".
std::string agent_summary_line(const AgentMetrics& agent);
std::string agent_terminal_report(const AgentMetrics& agent);
nlohmann::json agent_json(const AgentMetrics& agent);
std::string agent_markdown(const AgentMetrics& agent);
std::string agent_html(const AgentMetrics& agent);

}  // namespace tessera::bench
