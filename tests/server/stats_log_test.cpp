// vLLM's periodic stats line: its exact wording and figures, and when an interval is worth a line.
#include "server/stats_log.h"

#include <gtest/gtest.h>

namespace tessera::server {
namespace {

TEST(StatsLog, LineHasVllmsWordingAndTheIntervalsFigures) {
  AsyncEngineStats before, now;
  before.engine.prompt_tokens = 100;
  before.engine.generation_tokens = 50;
  before.engine.prefix_cache_queries = 100;
  before.engine.prefix_cache_hit_tokens = 0;
  now.engine.prompt_tokens = 1100;  // 1000 in 10 s
  now.engine.generation_tokens = 450;
  now.engine.prefix_cache_queries = 1100;
  now.engine.prefix_cache_hit_tokens = 375;  // 375 of the interval's 1000
  now.engine.num_running = 3;
  now.engine.num_waiting = 1;
  now.num_pending = 1;
  now.engine.kv_cache_usage = 0.125;
  EXPECT_EQ(stats_log_line(now, before, 10.0),
            "Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 40.0 tokens/s, Running: 3 reqs, "
            "Waiting: 2 reqs, GPU KV cache usage: 12.5%, Prefix cache hit rate: 37.5%");
  // No new prompt in the interval: the hit rate since startup.
  AsyncEngineStats later = now;
  later.engine.generation_tokens += 10;
  EXPECT_NE(stats_log_line(later, now, 10.0).find("Prefix cache hit rate: 34.1%"), std::string::npos);
}

TEST(StatsLog, QuietWhenIdle) {
  AsyncEngineStats before, now;
  EXPECT_FALSE(stats_interval_active(now, before, false));
  EXPECT_TRUE(stats_interval_active(now, before, true)) << "the interval after one with tokens still logs";
  now.engine.generation_tokens = 1;
  EXPECT_TRUE(stats_interval_active(now, before, false));
  AsyncEngineStats waiting;
  waiting.num_pending = 1;
  EXPECT_TRUE(stats_interval_active(waiting, waiting, false));
}

}  // namespace
}  // namespace tessera::server
