#include "bench/agent_metrics.h"

#include <algorithm>

namespace tessera::bench {
namespace {

struct TurnSums {
  std::vector<double> ttft_ms;
  long long prompt_tokens = 0, cached_tokens = 0;
  size_t with_usage = 0, with_cached = 0;
};

}  // namespace

AgentMetrics compute_agent_metrics(const AgentRunResult& result, const AgentOptions& options) {
  AgentMetrics m;
  m.options = options;
  m.turns_not_sent = result.turns_not_sent;
  std::vector<double> reference;
  for (const RequestRecord& r : result.reference) {
    if (!r.success) {
      ++m.reference_failed;
      continue;
    }
    ++m.reference_completed;
    reference.push_back(r.ttft_s * 1000.0);
  }
  m.reference_ttft_ms = summarize(std::move(reference));

  const size_t turns = static_cast<size_t>(std::max(options.turns, 0));
  std::vector<TurnSums> sums(turns);
  m.turns.resize(turns);
  std::vector<double> later_ttft;
  for (const RequestRecord& r : result.conversations.records) {
    const size_t t = static_cast<size_t>(r.turn);
    if (t >= turns) continue;
    AgentTurnMetrics& turn = m.turns[t];
    ++turn.requests;
    if (!r.success) {
      ++turn.failed;
      continue;
    }
    ++turn.completed;
    TurnSums& s = sums[t];
    s.ttft_ms.push_back(r.ttft_s * 1000.0);
    if (t > 0) later_ttft.push_back(r.ttft_s * 1000.0);
    if (!r.usage_reported) continue;
    ++s.with_usage;
    s.prompt_tokens += r.prompt_tokens;
    if (r.cached_tokens < 0) {
      m.later_without_cached_tokens += t > 0;
      continue;
    }
    ++s.with_cached;
    s.cached_tokens += r.cached_tokens;
    if (t > 0) {
      m.later_prompt_tokens += r.prompt_tokens;
      m.later_cached_tokens += r.cached_tokens;
    }
  }
  for (size_t t = 0; t < turns; ++t) {
    AgentTurnMetrics& turn = m.turns[t];
    const TurnSums& s = sums[t];
    turn.turn = static_cast<int>(t) + 1;
    turn.ttft_ms = summarize(s.ttft_ms);
    if (s.with_usage)
      turn.mean_prompt_tokens = static_cast<double>(s.prompt_tokens) / static_cast<double>(s.with_usage);
    if (s.with_cached)
      turn.mean_cached_tokens = static_cast<double>(s.cached_tokens) / static_cast<double>(s.with_cached);
  }
  if (m.later_prompt_tokens > 0)
    m.prefix_cache_hit_rate = static_cast<double>(m.later_cached_tokens) / static_cast<double>(m.later_prompt_tokens);
  if (!later_ttft.empty()) {
    m.later_ttft_mean_ms = summarize(later_ttft).mean;
    if (m.reference_completed && m.reference_ttft_ms.median > 0)
      m.ttft_ratio = m.later_ttft_mean_ms / m.reference_ttft_ms.median;
  }
  return m;
}

}  // namespace tessera::bench
