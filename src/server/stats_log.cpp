#include "server/stats_log.h"

#include <fmt/format.h>

#include "core/logging.h"

namespace tessera::server {

std::string stats_log_line(const AsyncEngineStats& now, const AsyncEngineStats& before, double seconds) {
  const EngineStats& a = now.engine;
  const EngineStats& b = before.engine;
  const double secs = seconds > 0 ? seconds : 1;
  const double prompt = static_cast<double>(a.prompt_tokens - b.prompt_tokens) / secs;
  const double generation = static_cast<double>(a.generation_tokens - b.generation_tokens) / secs;
  uint64_t queries = a.prefix_cache_queries - b.prefix_cache_queries;
  uint64_t hits = a.prefix_cache_hit_tokens - b.prefix_cache_hit_tokens;
  if (queries == 0) {
    queries = a.prefix_cache_queries;
    hits = a.prefix_cache_hit_tokens;
  }
  const double hit_rate = queries > 0 ? 100.0 * static_cast<double>(hits) / static_cast<double>(queries) : 0.0;
  return fmt::format(
      "Avg prompt throughput: {:.1f} tokens/s, Avg generation throughput: {:.1f} tokens/s, Running: {} reqs, "
      "Waiting: {} reqs, GPU KV cache usage: {:.1f}%, Prefix cache hit rate: {:.1f}%",
      prompt, generation, a.num_running, a.num_waiting + now.num_pending, 100.0 * a.kv_cache_usage, hit_rate);
}

namespace {
bool tokens_moved(const AsyncEngineStats& now, const AsyncEngineStats& before) {
  return now.engine.prompt_tokens != before.engine.prompt_tokens ||
         now.engine.generation_tokens != before.engine.generation_tokens;
}
}  // namespace

bool stats_interval_active(const AsyncEngineStats& now, const AsyncEngineStats& before, bool previous_active) {
  const EngineStats& a = now.engine;
  return tokens_moved(now, before) || previous_active || a.num_running > 0 || a.num_waiting + now.num_pending > 0;
}

StatsLogger::StatsLogger(std::function<AsyncEngineStats()> stats, std::chrono::milliseconds interval)
    : stats_(std::move(stats)), interval_(interval), thread_([this] { run(); }) {}

StatsLogger::~StatsLogger() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StatsLogger::run() {
  AsyncEngineStats before = stats_();
  auto since = std::chrono::steady_clock::now();
  bool previous_tokens = false;
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, interval_, [this] { return stop_; })) {
    const AsyncEngineStats now = stats_();
    const auto at = std::chrono::steady_clock::now();
    const bool tokens = tokens_moved(now, before);
    if (stats_interval_active(now, before, previous_tokens))
      TLOG_INFO("{}", stats_log_line(now, before, std::chrono::duration<double>(at - since).count()));
    previous_tokens = tokens;
    before = now;
    since = at;
  }
}

}  // namespace tessera::server
