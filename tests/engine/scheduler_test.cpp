// Scheduler (vLLM v1 style): running requests first, then waiting ones FCFS within the token
// budget and the sequence cap; chunked prefill; which request is preempted when blocks run out
// and where it goes; the max_model_len cap. Hybrid models' slots: state_slots_test.cpp.
#include <gtest/gtest.h>

#include <memory>

#include "engine/kv_cache_coordinator.h"
#include "engine/scheduler.h"
#include "scheduler_util.h"

namespace tessera {
namespace {

constexpr int kBs = 4;

std::unique_ptr<Request> make(const std::string& id, int len) { return testing::make_request(id, len); }
using testing::scheduler_config;

// (request id, new tokens) of each scheduled request, in order.
std::vector<std::pair<std::string, int>> plan(const SchedulerOutput& out) {
  std::vector<std::pair<std::string, int>> v;
  for (const auto& s : out.scheduled) v.emplace_back(s.request->id, s.num_new_tokens);
  return v;
}
using Plan = std::vector<std::pair<std::string, int>>;

// The engine's part of a step: the scheduled tokens are computed, and requests that caught up
// sample one token.
void run_step(Scheduler& s, const SchedulerOutput& out) {
  s.on_step_done(out);
  for (const auto& sr : out.scheduled)
    if (sr.request->num_computed_tokens == sr.request->num_tokens()) sr.request->output.push_back(7);
}

TEST(Scheduler, AdmitsInArrivalOrderUpToTheSequenceCap) {
  KvCacheCoordinator cache(64, kBs, /*prefix=*/false);
  Scheduler s(scheduler_config(2, 1000), cache);
  auto a = make("a", 5), b = make("b", 6), c = make("c", 7);
  s.add(a.get());
  s.add(b.get());
  s.add(c.get());
  EXPECT_EQ(c->status, RequestStatus::kWaiting);
  SchedulerOutput out = s.schedule();
  EXPECT_EQ(plan(out), (Plan{{"a", 5}, {"b", 6}}));
  EXPECT_EQ(s.num_running(), 2u);
  EXPECT_EQ(s.num_waiting(), 1u);
  EXPECT_EQ(a->status, RequestStatus::kRunning);
  EXPECT_EQ(out.num_tokens(), 11);
  run_step(s, out);
  EXPECT_EQ(a->num_computed_tokens, 5);
  // Running requests decode first; c is admitted once a leaves.
  EXPECT_EQ(plan(s.schedule()), (Plan{{"a", 1}, {"b", 1}}));
  s.remove(a.get());
  out = s.schedule();
  EXPECT_EQ(plan(out), (Plan{{"b", 1}, {"c", 7}}));
  s.remove(b.get());
  s.remove(c.get());
  EXPECT_FALSE(s.has_work());
  EXPECT_TRUE(cache.pool().all_free());
}

TEST(Scheduler, ChunkedPrefillSplitsAPromptAcrossStepsWithinTheBudget) {
  KvCacheCoordinator cache(64, kBs, /*prefix=*/false);
  Scheduler s(scheduler_config(8, 10), cache);
  auto a = make("a", 8), b = make("b", 8), c = make("c", 3);
  s.add(a.get());
  s.add(b.get());
  s.add(c.get());
  SchedulerOutput out = s.schedule();
  EXPECT_EQ(plan(out), (Plan{{"a", 8}, {"b", 2}})) << "b gets what is left of the budget; c waits";
  run_step(s, out);
  EXPECT_TRUE(b->output.empty()) << "a chunk that does not reach the prompt's end samples nothing";
  out = s.schedule();
  EXPECT_EQ(plan(out), (Plan{{"a", 1}, {"b", 6}, {"c", 3}}));
  run_step(s, out);
  EXPECT_EQ(b->num_computed_tokens, 8);
  EXPECT_EQ(plan(s.schedule()), (Plan{{"a", 1}, {"b", 1}, {"c", 1}}));
}

TEST(Scheduler, WithoutChunkedPrefillAPromptWaitsForRoomAndBlocksTheQueue) {
  KvCacheCoordinator cache(64, kBs, /*prefix=*/false);
  Scheduler s(scheduler_config(8, 10, /*chunked=*/false), cache);
  auto a = make("a", 8), b = make("b", 8), c = make("c", 1);
  s.add(a.get());
  s.add(b.get());
  s.add(c.get());
  SchedulerOutput out = s.schedule();
  EXPECT_EQ(plan(out), (Plan{{"a", 8}})) << "b does not fit whole; c behind it waits too (FCFS)";
  run_step(s, out);
  EXPECT_EQ(plan(s.schedule()), (Plan{{"a", 1}, {"b", 8}, {"c", 1}}));
}

TEST(Scheduler, PreemptsTheLastAdmittedRequestAndReadmitsItFirst) {
  KvCacheCoordinator cache(4, kBs, /*prefix=*/false);  // 16 tokens in all
  Scheduler s(scheduler_config(2, 1000), cache);
  auto a = make("a", 8), b = make("b", 7), c = make("c", 2);
  s.add(a.get());
  s.add(b.get());
  s.add(c.get());  // waits: two sequences at most
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(plan(out), (Plan{{"a", 8}, {"b", 7}}));
  run_step(s, out);  // a: 9 tokens, b: 8; each holds 2 blocks, none is free
  // a's 9th token needs a third block: b, admitted last, gives its blocks up.
  out = s.schedule();
  EXPECT_EQ(plan(out), (Plan{{"a", 1}}));
  ASSERT_EQ(out.preempted, std::vector<Request*>{b.get()});
  EXPECT_EQ(b->status, RequestStatus::kPreempted);
  EXPECT_EQ(b->num_preemptions, 1);
  EXPECT_TRUE(b->block_ids().empty());
  EXPECT_EQ(b->num_computed_tokens, 0) << "recomputed from its prompt and output";
  EXPECT_EQ(b->output.size(), 1u) << "the output so far is kept";
  EXPECT_EQ(s.num_preemptions(), 1u);
  EXPECT_EQ(s.num_waiting(), 2u);
  EXPECT_EQ(cache.pool().num_free(), 1);
  // A step that had to preempt admits nobody, though a block is free for c.
  EXPECT_EQ(out.scheduled.size(), 1u);
  run_step(s, out);
  // a finishes: b goes back in before c, which arrived earlier but was never running.
  s.remove(a.get());
  out = s.schedule();
  EXPECT_EQ(plan(out), (Plan{{"b", 8}, {"c", 2}}));
  EXPECT_EQ(b->status, RequestStatus::kRunning);
  EXPECT_EQ(b->num_cached_tokens, 0);
}

TEST(Scheduler, ARunningRequestWithoutRoomPreemptsItselfWhenItIsTheLast) {
  KvCacheCoordinator cache(4, kBs, /*prefix=*/false);
  Scheduler s(scheduler_config(4, 1000), cache);
  auto a = make("a", 6), b = make("b", 8);
  s.add(a.get());
  s.add(b.get());
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 2u);
  run_step(s, out);  // a: 7 tokens (2 blocks, room for one more), b: 9 (needs a third block)
  out = s.schedule();
  EXPECT_EQ(plan(out), (Plan{{"a", 1}})) << "a still fits; b, the last, preempts itself";
  EXPECT_EQ(out.preempted, std::vector<Request*>{b.get()});
  EXPECT_EQ(a->status, RequestStatus::kRunning);
  EXPECT_EQ(s.num_running(), 1u);
}

TEST(Scheduler, AdmissionStopsWhenBlocksRunOutWithoutPreempting) {
  KvCacheCoordinator cache(3, kBs, /*prefix=*/false);
  Scheduler s(scheduler_config(4, 1000), cache);
  auto a = make("a", 8), b = make("b", 8);
  s.add(a.get());
  s.add(b.get());
  SchedulerOutput out = s.schedule();
  EXPECT_EQ(plan(out), (Plan{{"a", 8}})) << "b needs two blocks, one is free";
  EXPECT_TRUE(out.preempted.empty()) << "a waiting request never preempts a running one";
  EXPECT_EQ(b->status, RequestStatus::kWaiting);
  EXPECT_TRUE(b->block_ids().empty());
}

TEST(Scheduler, APrefixHitIsComputedOnlyPastTheCachedBlocks) {
  KvCacheCoordinator cache(16, kBs, /*prefix=*/true);
  Scheduler s(scheduler_config(4, 1000), cache);
  auto a = make("a", 10);
  s.add(a.get());
  run_step(s, s.schedule());
  auto b = make("b", 11);  // a's 10 prompt tokens and one more
  s.add(b.get());
  SchedulerOutput out = s.schedule();
  EXPECT_EQ(plan(out), (Plan{{"a", 1}, {"b", 3}})) << "two full blocks of b are cached";
  EXPECT_EQ(b->num_cached_tokens, 8);
  EXPECT_EQ(b->num_computed_tokens, 8);
}

TEST(Scheduler, NoRequestIsScheduledPastMaxModelLen) {
  KvCacheCoordinator cache(64, kBs, /*prefix=*/false);
  Scheduler s(scheduler_config(4, 1000, true, /*max_model_len=*/10), cache);
  auto a = make("a", 9);
  s.add(a.get());
  run_step(s, s.schedule());  // 9 computed, 1 sampled: 10 tokens
  EXPECT_EQ(plan(s.schedule()), (Plan{{"a", 1}}));
  a->num_computed_tokens = 10;
  a->output.push_back(8);  // 11 tokens: the engine finishes a request at max_model_len first
  EXPECT_TRUE(s.schedule().scheduled.empty());
}

TEST(Scheduler, RemovingARequestFreesItsBlocksWhereverItIs) {
  KvCacheCoordinator cache(8, kBs, /*prefix=*/false);
  Scheduler s(scheduler_config(1, 1000), cache);
  auto a = make("a", 8), b = make("b", 8);
  s.add(a.get());
  s.add(b.get());
  run_step(s, s.schedule());
  EXPECT_EQ(cache.pool().num_free(), 6);  // a: 8 tokens in 2 blocks
  s.remove(b.get());                      // waiting
  EXPECT_EQ(s.num_waiting(), 0u);
  s.remove(a.get());  // running
  EXPECT_EQ(s.num_running(), 0u);
  EXPECT_TRUE(cache.pool().all_free());
  EXPECT_TRUE(s.schedule().scheduled.empty());
}

}  // namespace
}  // namespace tessera
