// The figures of an --dataset-name agent run: the reference prompt's TTFT, per turn index the
// requests, TTFT and prompt / cached prompt tokens (the server's usage.prompt_tokens_details),
// and over turns 2..N the prefix-cache hit rate and the mean TTFT against the reference's.
#pragma once
#include <cstddef>
#include <vector>

#include "bench/agent_runner.h"
#include "bench/stats.h"

namespace tessera::bench {

struct AgentTurnMetrics {
  int turn = 0;  // from 1
  size_t requests = 0, completed = 0, failed = 0;
  Summary ttft_ms;                 // successful requests
  double mean_prompt_tokens = 0;   // successful requests with usage
  double mean_cached_tokens = -1;  // those that reported cached_tokens; -1 when none did
};

struct AgentMetrics {
  AgentOptions options;
  size_t reference_completed = 0, reference_failed = 0;
  Summary reference_ttft_ms;  // its median is "the reference TTFT"
  std::vector<AgentTurnMetrics> turns;
  size_t turns_not_sent = 0;
  // Turns 2..N: cached / prompt tokens of the successful requests that reported cached_tokens;
  // -1 when none did (or there is one turn).
  long long later_prompt_tokens = 0, later_cached_tokens = 0;
  double prefix_cache_hit_rate = -1;
  size_t later_without_cached_tokens = 0;  // successful turn 2..N requests without cached_tokens
  double later_ttft_mean_ms = -1;          // mean TTFT of the successful turns 2..N; -1 when none
  double ttft_ratio = -1;                  // later_ttft_mean_ms / the reference's median; -1 when either is missing
};

AgentMetrics compute_agent_metrics(const AgentRunResult& result, const AgentOptions& options);

}  // namespace tessera::bench
