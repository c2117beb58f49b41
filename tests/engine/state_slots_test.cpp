// State slots of hybrid (linear-attention) models: the slot pool, the cache manager's
// all-or-nothing allocation and checkpoints, and the scheduler's slot behaviour (admission
// limited by slots, kept across chunked prefill, freed by preemption and finish).
#include <gtest/gtest.h>

#include <numeric>

#include "engine/kv_cache_coordinator.h"
#include "engine/scheduler.h"
#include "engine/state_slot_pool.h"
#include "scheduler_util.h"

namespace tessera {
namespace {

TEST(StateSlotPool, SequencesTakeFreeSlotsThenEvictTheOldestCheckpoint) {
  StateSlotPool p(3);
  auto a = p.allocate(), b = p.allocate();
  ASSERT_TRUE(a && b);
  EXPECT_NE(*a, *b);
  auto c1 = p.add_checkpoint(111);
  ASSERT_TRUE(c1);
  EXPECT_FALSE(p.add_checkpoint(111)) << "one checkpoint per block hash";
  EXPECT_EQ(p.num_free(), 0);
  EXPECT_EQ(p.num_available(), 1);
  // Every slot held by a sequence or a checkpoint: a new checkpoint replaces the oldest one.
  p.release(*b);
  auto c2 = p.add_checkpoint(222);
  ASSERT_TRUE(c2);
  EXPECT_EQ(*c2, *b);
  p.touch_checkpoint(111);  // 222 is now the least recently used
  auto d = p.allocate();
  ASSERT_TRUE(d);
  EXPECT_EQ(*d, *c2);
  EXPECT_FALSE(p.checkpoint(222));
  EXPECT_EQ(p.checkpoint(111), c1);
  auto e = p.allocate();
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, *c1);
  EXPECT_FALSE(p.allocate()) << "all three slots are held by sequences";
  EXPECT_FALSE(p.add_checkpoint(333));
  EXPECT_EQ(p.checkpoint_evictions(), 2u);
  EXPECT_THROW(p.release(99), Error);
  p.release(*a);
  EXPECT_THROW(p.release(*a), Error) << "released twice";
}

TEST(StateSlotPool, AMovedCheckpointKeepsItsSlotUnderTheNewHashAsMostRecentlyUsed) {
  StateSlotPool p(3);
  auto seq = p.allocate();
  auto old_one = p.add_checkpoint(111), rolling = p.add_checkpoint(222);
  ASSERT_TRUE(seq && old_one && rolling);
  p.touch_checkpoint(111);  // 222 is now the least recently used
  EXPECT_EQ(p.move_checkpoint(222, 333), rolling);
  EXPECT_FALSE(p.checkpoint(222));
  EXPECT_EQ(p.checkpoint(333), rolling);
  EXPECT_EQ(p.num_checkpoints(), 2);
  EXPECT_EQ(p.allocate(), old_one) << "the moved checkpoint became the most recently used";
  EXPECT_FALSE(p.move_checkpoint(111, 444)) << "111 was evicted";
  p.release(*seq);
  auto other = p.add_checkpoint(555);
  ASSERT_TRUE(other);
  EXPECT_EQ(*other, *seq) << "a free slot before an eviction";
  EXPECT_FALSE(p.move_checkpoint(333, 555)) << "555 has its own checkpoint";
  EXPECT_EQ(p.checkpoint(333), rolling);
  EXPECT_EQ(p.checkpoint(555), other);
}

using testing::make_request;
SchedulerConfig config(int max_num_seqs, int budget) { return testing::scheduler_config(max_num_seqs, budget); }

TEST(StateSlotScheduler, AdmissionIsLimitedBySlotsAndFinishingFreesOne) {
  KvCacheCoordinator cache(64, 4, /*prefix=*/false, /*num_state_slots=*/2);
  Scheduler s(config(8, 100), cache);
  auto a = make_request("a", 5), b = make_request("b", 6), c = make_request("c", 7);
  s.add(a.get());
  s.add(b.get());
  s.add(c.get());
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 2u) << "two slots: the third request waits";
  EXPECT_EQ(s.num_waiting(), 1u);
  EXPECT_NE(out.scheduled[0].state_slot, out.scheduled[1].state_slot);
  for (const auto& sr : out.scheduled) {
    EXPECT_GE(sr.state_slot, 0);
    EXPECT_EQ(sr.state_slot, sr.request->state_slot());
    EXPECT_FALSE(sr.has_initial_state) << "a fresh prompt starts from a zero state";
  }
  EXPECT_TRUE(out.state_copies.empty());
  s.on_step_done(out);
  const int32_t freed = a->state_slot();
  s.remove(a.get());  // finished
  EXPECT_EQ(a->state_slot(), -1);
  b->output.push_back(9);  // b decodes
  out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[0].request, b.get());
  EXPECT_TRUE(out.scheduled[0].has_initial_state) << "decode continues from the slot";
  EXPECT_EQ(out.scheduled[1].request, c.get());
  EXPECT_EQ(out.scheduled[1].state_slot, freed);
  EXPECT_FALSE(out.scheduled[1].has_initial_state);
  s.remove(b.get());
  s.remove(c.get());
  EXPECT_TRUE(cache.state_slots().all_free());
  EXPECT_TRUE(cache.pool().all_free());
}

TEST(StateSlotScheduler, ChunkedPrefillKeepsTheSlotAndContinuesFromIt) {
  KvCacheCoordinator cache(64, 4, /*prefix=*/false, 4);
  Scheduler s(config(8, 4), cache);  // 4 tokens a step: a 10-token prompt takes 3 steps
  auto r = make_request("r", 10);
  s.add(r.get());
  std::vector<bool> initial;
  std::vector<int32_t> slots;
  for (int step = 0; step < 3; ++step) {
    SchedulerOutput out = s.schedule();
    ASSERT_EQ(out.scheduled.size(), 1u);
    initial.push_back(out.scheduled[0].has_initial_state);
    slots.push_back(out.scheduled[0].state_slot);
    s.on_step_done(out);
  }
  EXPECT_EQ(r->num_computed_tokens, 10);
  EXPECT_EQ(initial, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(slots[0], slots[1]);
  EXPECT_EQ(slots[1], slots[2]);
  EXPECT_EQ(cache.state_slots().num_held(), 1);
  s.remove(r.get());
}

TEST(StateSlotScheduler, PreemptionFreesTheSlotAndTheSequenceRecomputesFromZero) {
  KvCacheCoordinator cache(4, 4, /*prefix=*/false, 2);  // 16 tokens of KV for two sequences
  Scheduler s(config(8, 100), cache);
  auto a = make_request("a", 7), b = make_request("b", 7);
  s.add(a.get());
  s.add(b.get());
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 2u);
  s.on_step_done(out);
  // Both decode until the blocks run out: the later one is preempted.
  for (int i = 0; i < 3 && s.num_preemptions() == 0; ++i) {
    a->output.push_back(1);
    b->output.push_back(1);
    out = s.schedule();
    if (!out.preempted.empty()) break;
    s.on_step_done(out);
  }
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], b.get());
  EXPECT_EQ(b->state_slot(), -1);
  EXPECT_EQ(cache.state_slots().num_held(), 1);
  s.on_step_done(out);
  s.remove(a.get());
  out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].request, b.get());
  EXPECT_EQ(out.scheduled[0].num_new_tokens, b->num_tokens()) << "recomputed from scratch";
  EXPECT_FALSE(out.scheduled[0].has_initial_state);
  EXPECT_GE(out.scheduled[0].state_slot, 0);
  s.remove(b.get());
}

TEST(StateSlotScheduler, PrefixHitsOnlyAtCheckpointsAndRestoreTheState) {
  KvCacheCoordinator cache(64, 4, /*prefix=*/true, 4);
  Scheduler s(config(8, 100), cache);
  auto a = make_request("a", 11);  // last full-block boundary a later hit can end at: 8
  EXPECT_EQ(cache.checkpoint_boundary(*a), 8);
  s.add(a.get());
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 8) << "the prefill chunk ends at the checkpoint boundary";
  s.on_step_done(out);
  out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 3);
  EXPECT_TRUE(out.scheduled[0].has_initial_state);
  ASSERT_EQ(out.state_copies.size(), 2u) << "the state at token 8 is saved before the next forward";
  EXPECT_EQ(out.state_copies[0], a->state_slot());
  const int32_t checkpoint = out.state_copies[1];
  EXPECT_NE(checkpoint, a->state_slot());
  s.on_step_done(out);
  s.remove(a.get());

  // Same first 8 tokens, another tail: a hit of two blocks, restored from the checkpoint.
  auto b = make_request("b", 14);
  for (int i = 8; i < 14; ++i) b->prompt[i] = 100 + i;
  s.add(b.get());
  out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(b->num_cached_tokens, 8);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 4) << "to b's own boundary (12)";
  EXPECT_TRUE(out.scheduled[0].has_initial_state);
  ASSERT_NE(b->state_slot(), checkpoint) << "a free slot is taken before a checkpoint is evicted";
  EXPECT_EQ(out.state_copies, (std::vector<int32_t>{checkpoint, b->state_slot()}));
  s.on_step_done(out);

  // The same first block only: that block has no checkpoint, so no hit at all.
  auto c = make_request("c", 9);
  for (int i = 4; i < 9; ++i) c->prompt[i] = 200 + i;
  EXPECT_TRUE(cache.find_cached_prefix(*c).empty());
  s.add(c.get());
  out = s.schedule();
  EXPECT_EQ(c->num_cached_tokens, 0);
  s.remove(b.get());
  s.remove(c.get());
  EXPECT_EQ(cache.state_slots().num_held(), 0);
}

// b shares only a's first block: its KV matches there but a checkpointed only its last full
// block (8), so b gets no hit; its prefill stops at 4 (the shared prefix's end) and at 8 (its
// own last full block), saving the state at both. c, sharing the same first block, hits it.
TEST(StateSlotScheduler, APrefixSharedWithAnEarlierPromptIsCheckpointedWhereItEnds) {
  KvCacheCoordinator cache(64, 4, /*prefix=*/true, 6);
  Scheduler s(config(8, 100), cache);
  auto a = make_request("a", 11);
  s.add(a.get());
  while (a->num_computed_tokens < 11) {
    SchedulerOutput out = s.schedule();
    s.on_step_done(out);
  }
  EXPECT_EQ(cache.state_slots().num_checkpoints(), 1);

  auto b = make_request("b", 11);
  for (int i = 4; i < 11; ++i) b->prompt[i] = 100 + i;
  const CacheHit hit = cache.find_cached_prefix(*b);
  EXPECT_TRUE(hit.empty()) << "no checkpoint at block 1";
  EXPECT_EQ(hit.kv_matched_tokens, 4);
  s.add(b.get());
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(b->num_cached_tokens, 0);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 4) << "the first chunk ends where the KV match ended";
  s.on_step_done(out);
  out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 4) << "then at b's last full-block boundary (8)";
  ASSERT_EQ(out.state_copies.size(), 2u) << "the state at token 4 is saved";
  EXPECT_EQ(out.state_copies[0], b->state_slot());
  const int32_t shared_checkpoint = out.state_copies[1];
  s.on_step_done(out);
  out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 3);
  EXPECT_EQ(out.state_copies.size(), 2u) << "the state at token 8 is saved";
  s.on_step_done(out);
  EXPECT_EQ(cache.state_slots().num_checkpoints(), 3);

  auto c = make_request("c", 9);
  for (int i = 4; i < 9; ++i) c->prompt[i] = 200 + i;
  s.add(c.get());
  out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(c->num_cached_tokens, 4);
  EXPECT_EQ(c->cache_tables.back().shared_prefix_end, 0) << "the KV match ends at the checkpoint";
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 4) << "from the hit to c's last full block (8)";
  EXPECT_EQ(out.state_copies, (std::vector<int32_t>{shared_checkpoint, c->state_slot()}));
  s.remove(a.get());
  s.remove(b.get());
  s.remove(c.get());
  EXPECT_EQ(cache.state_slots().num_held(), 0);
}

TEST(StateSlotScheduler, ModelsWithoutStateLayersGetNoSlots) {
  KvCacheCoordinator cache(16, 4, true);
  Scheduler s(config(8, 100), cache);
  auto a = make_request("a", 11);
  s.add(a.get());
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 11) << "no checkpoint boundary without state slots";
  EXPECT_EQ(out.scheduled[0].state_slot, -1);
  EXPECT_EQ(cache.checkpoint_boundary(*a), 0);
  s.remove(a.get());
}

}  // namespace
}  // namespace tessera
