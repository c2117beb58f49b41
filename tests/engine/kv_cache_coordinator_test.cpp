// KvCacheCoordinator with the groups of every model before sliding windows (one full-attention
// group, and a state group for hybrids): blocks per request, prefix-cache lookup and sharing
// (reference counts), all-or-nothing allocation across the KV pool and the state-slot pool, the
// order in which a finished request's blocks are evicted, and state-slot reuse on hybrid models.
#include <gtest/gtest.h>

#include <numeric>

#include "engine/kv_cache_coordinator.h"

namespace tessera {
namespace {

constexpr int kBs = 4;  // tokens per block

// A hybrid model's groups (full attention, then the state slots) whose rolling checkpoint moves
// at most every `interval` tokens.
std::vector<CacheGroup> hybrid_groups(int interval) {
  CacheGroupSpec state{CacheGroupKind::kStateSlot, kBs, 0};
  state.checkpoint_interval = interval;
  return {{{CacheGroupKind::kFullAttention, kBs, 0}, {}}, {state, {}}};
}

Request request(const std::string& id, std::vector<int32_t> prompt) {
  Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  return r;
}

std::vector<int32_t> iota(int n, int first) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Allocates and "computes" the whole prompt of r in one step, as the scheduler and engine do.
void prefill(KvCacheCoordinator& m, Request& r) {
  const auto cached = m.find_cached_prefix(r);
  const int cached_tokens = cached.num_blocks() * kBs;
  ASSERT_TRUE(m.allocate(r, r.num_tokens() - cached_tokens, cached));
  r.num_computed_tokens = r.num_tokens();
  m.commit_computed(r);
}

TEST(KvCacheCoordinator, AllocatesBlocksForTheTokensAndRegistersFullOnes) {
  KvCacheCoordinator m(8, kBs, /*prefix=*/true);
  Request r = request("r", iota(6, 1));
  ASSERT_TRUE(m.allocate(r, 6));
  EXPECT_EQ(r.block_ids().size(), 2u);  // 6 tokens of 4 per block
  r.num_computed_tokens = 6;
  m.commit_computed(r);
  EXPECT_EQ(r.block_hashes.size(), 1u) << "only the full block is registered";
  EXPECT_EQ(m.pool().lookup(r.block_hashes[0]), r.block_ids()[0]);
  // Decode: the 7th and 8th tokens fit the second block, the 9th takes a third.
  r.output = {7, 8};
  ASSERT_TRUE(m.allocate(r, 2));
  EXPECT_EQ(r.block_ids().size(), 2u);
  r.num_computed_tokens = 8;
  m.commit_computed(r);
  EXPECT_EQ(r.block_hashes.size(), 2u);
  r.output.push_back(9);
  ASSERT_TRUE(m.allocate(r, 1));
  EXPECT_EQ(r.block_ids().size(), 3u);
  m.free(r);
  EXPECT_TRUE(m.pool().all_free());
  EXPECT_TRUE(r.block_ids().empty());
  EXPECT_EQ(r.num_computed_tokens, 0);
}

TEST(KvCacheCoordinator, APrefixHitNeverCoversTheWholePrompt) {
  KvCacheCoordinator m(8, kBs, /*prefix=*/true);
  Request a = request("a", iota(8, 1));  // exactly two blocks
  prefill(m, a);
  Request b = request("b", iota(8, 1));
  // The last token must be computed again to get its logits: one block of the two is a hit.
  EXPECT_EQ(m.find_cached_prefix(b).group_blocks(0), std::vector<int32_t>{a.block_ids()[0]});
  Request c = request("c", iota(9, 1));
  EXPECT_EQ(m.find_cached_prefix(c).group_blocks(0), (std::vector<int32_t>{a.block_ids()[0], a.block_ids()[1]}));
}

TEST(KvCacheCoordinator, SharedPrefixBlocksAreCountedOncePerHolder) {
  KvCacheCoordinator m(10, kBs, /*prefix=*/true);
  Request a = request("a", iota(12, 1));
  prefill(m, a);
  // b shares a's first two blocks and then diverges.
  Request b = request("b", concat(iota(8, 1), {50, 51, 52, 53, 54}));
  const auto cached = m.find_cached_prefix(b);
  ASSERT_EQ(cached.group_blocks(0), (std::vector<int32_t>{a.block_ids()[0], a.block_ids()[1]}));
  const int free_before = m.pool().num_free();
  ASSERT_TRUE(m.allocate(b, 5, cached));
  EXPECT_EQ(b.num_computed_tokens, 8) << "the hit counts as computed";
  ASSERT_EQ(b.block_ids().size(), 4u);  // 13 tokens
  EXPECT_EQ(b.block_ids()[0], a.block_ids()[0]);
  EXPECT_EQ(b.block_ids()[1], a.block_ids()[1]);
  EXPECT_EQ(m.pool().num_free(), free_before - 2) << "only b's own blocks are taken";
  EXPECT_EQ(m.pool().ref_count(a.block_ids()[0]), 2);
  EXPECT_EQ(m.pool().ref_count(a.block_ids()[1]), 2);
  EXPECT_EQ(m.pool().ref_count(a.block_ids()[2]), 1);
  m.free(a);
  EXPECT_EQ(m.pool().ref_count(b.block_ids()[0]), 1) << "still held by b";
  EXPECT_EQ(m.pool().ref_count(b.block_ids()[1]), 1);
  m.free(b);
  EXPECT_TRUE(m.pool().all_free());
  // Freed, the blocks stay cached: a third request with a's prompt hits all it can.
  Request c = request("c", iota(12, 1));
  EXPECT_EQ(m.find_cached_prefix(c).num_blocks(), 2);
}

TEST(KvCacheCoordinator, AnAllocationThatDoesNotFitChangesNothing) {
  KvCacheCoordinator m(3, kBs, /*prefix=*/true);
  Request a = request("a", iota(8, 1));
  prefill(m, a);
  m.free(a);  // its two blocks are free but cached
  // b hits both cached blocks and needs two more: only one block is free besides the cached ones
  // (which count as free until taken), so it does not fit.
  Request b = request("b", concat(iota(8, 1), iota(5, 100)));
  const auto cached = m.find_cached_prefix(b);
  ASSERT_EQ(cached.num_blocks(), 2);
  EXPECT_FALSE(m.allocate(b, 5, cached));
  EXPECT_TRUE(b.block_ids().empty());
  EXPECT_EQ(b.num_computed_tokens, 0);
  EXPECT_EQ(m.pool().num_free(), 3);
  EXPECT_EQ(m.pool().ref_count(cached.group_blocks(0)[0]), 0);
  EXPECT_EQ(m.find_cached_prefix(b).group_blocks(0), cached.group_blocks(0)) << "the cache is intact";
  // One token fewer fits: two cached blocks and one new.
  Request c = request("c", concat(iota(8, 1), iota(4, 100)));
  EXPECT_TRUE(m.allocate(c, 4, m.find_cached_prefix(c)));
  EXPECT_EQ(m.pool().num_free(), 0);
}

TEST(KvCacheCoordinator, AFinishedRequestsLastBlocksAreEvictedFirst) {
  KvCacheCoordinator m(3, kBs, /*prefix=*/true);
  Request a = request("a", iota(12, 1));
  prefill(m, a);
  const auto blocks = a.block_ids();
  m.free(a);
  // An unrelated request takes one block: a's last, so a's longest prefix survives.
  Request x = request("x", iota(3, 500));
  ASSERT_TRUE(m.allocate(x, 3));
  EXPECT_EQ(x.block_ids(), std::vector<int32_t>{blocks[2]});
  EXPECT_EQ(m.pool().evictions(), 1u);
  Request b = request("b", iota(13, 1));
  EXPECT_EQ(m.find_cached_prefix(b).group_blocks(0), (std::vector<int32_t>{blocks[0], blocks[1]}));
}

TEST(KvCacheCoordinator, WithoutPrefixCachingNothingIsShared) {
  KvCacheCoordinator m(8, kBs, /*prefix=*/false);
  Request a = request("a", iota(12, 1));
  prefill(m, a);
  Request b = request("b", iota(12, 1));
  EXPECT_TRUE(m.find_cached_prefix(b).empty());
  EXPECT_EQ(m.checkpoint_boundary(b), 0);
}

TEST(KvCacheCoordinator, HybridAllocationIsAllOrNothingAcrossBlocksAndSlots) {
  KvCacheCoordinator m(4, kBs, /*prefix=*/false, /*num_state_slots=*/1);
  Request a = request("a", iota(4, 1)), b = request("b", iota(4, 1));
  ASSERT_TRUE(m.allocate(a, 4));
  EXPECT_EQ(a.state_slot(), 0);
  // Blocks are free but the only slot is held: b gets neither.
  const int free_blocks = m.pool().num_free();
  EXPECT_FALSE(m.allocate(b, 4));
  EXPECT_TRUE(b.block_ids().empty());
  EXPECT_EQ(b.state_slot(), -1);
  EXPECT_EQ(m.pool().num_free(), free_blocks);
  // The slot is free but the blocks are not: b again gets neither.
  m.free(a);
  Request big = request("big", iota(20, 1));
  EXPECT_FALSE(m.allocate(big, 20));
  EXPECT_EQ(big.state_slot(), -1);
  EXPECT_EQ(m.state_slots().num_free(), 1);
  // A later allocation of a running sequence keeps its slot; a finished one's slot is reused.
  ASSERT_TRUE(m.allocate(b, 4));
  const int32_t slot = b.state_slot();
  b.num_computed_tokens = 4;
  b.output = {5};
  ASSERT_TRUE(m.allocate(b, 1));
  EXPECT_EQ(b.state_slot(), slot);
  EXPECT_EQ(m.state_slots().num_held(), 1);
  m.free(b);
  EXPECT_EQ(b.state_slot(), -1);
  EXPECT_TRUE(m.state_slots().all_free());
  Request c = request("c", iota(4, 9));
  ASSERT_TRUE(m.allocate(c, 4));
  EXPECT_EQ(c.state_slot(), slot);
  EXPECT_TRUE(m.take_state_copies().empty()) << "no prefix caching: no checkpoints";
}

TEST(KvCacheCoordinator, HybridCheckpointIsSavedAtTheLastFullBlockAndRestoredOnAHit) {
  // (Four slots: a and b hold one each, the prompt's checkpoint one, a's rolling checkpoint at 16 one.)
  KvCacheCoordinator m(16, kBs, /*prefix=*/true, /*num_state_slots=*/4);
  Request a = request("a", iota(10, 1));
  EXPECT_EQ(m.checkpoint_boundary(a), 8);  // (10 - 1) / 4 * 4
  EXPECT_EQ(m.next_checkpoint(a, 0), 8);
  EXPECT_EQ(m.next_checkpoint(a, 8), 0);
  ASSERT_TRUE(m.allocate(a, 8));
  a.num_computed_tokens = 8;
  m.commit_computed(a);
  const auto save = m.take_state_copies();
  ASSERT_EQ(save.size(), 2u);
  EXPECT_EQ(save[0], a.state_slot()) << "copied from the sequence's slot";
  const int32_t checkpoint = save[1];
  EXPECT_NE(checkpoint, a.state_slot());
  EXPECT_EQ(m.state_slots().num_checkpoints(), 1);
  // The same prompt again: its KV hit is taken up to the checkpointed block, and the
  // checkpoint is copied into its own slot first.
  Request b = request("b", iota(10, 1));
  const auto cached = m.find_cached_prefix(b);
  const int kv_matched = cached.kv_matched_tokens;
  EXPECT_EQ(cached.num_blocks(), 2);
  EXPECT_EQ(kv_matched, 8);
  ASSERT_TRUE(m.allocate(b, 2, cached));
  EXPECT_EQ(b.num_computed_tokens, 8);
  EXPECT_EQ(m.take_state_copies(), (std::vector<int32_t>{checkpoint, b.state_slot()}));
  // Once a has generated past its prompt, a prompt of a's first 14 tokens matches three of a's KV
  // blocks; the hit is cut back to the checkpointed second one.
  Request c = request("c", iota(14, 1));
  a.output = {11, 12, 13, 14, 15, 16};
  ASSERT_TRUE(m.allocate(a, 8));
  a.num_computed_tokens = 16;
  m.commit_computed(a);
  m.take_state_copies();
  const auto hit_c = m.find_cached_prefix(c);
  EXPECT_EQ(hit_c.num_blocks(), 2);
  EXPECT_EQ(hit_c.kv_matched_tokens, 12) << "three blocks of c match a's KV, only two have a state checkpoint";
}

// Decoding past the prompt's last checkpoint (8), each block boundary the sequence reaches moves its
// one rolling checkpoint there (the same slot); when it finishes, a continuation of its prompt and
// output (the next turn of a conversation) hits that last full block.
TEST(KvCacheCoordinator, HybridRollingCheckpointFollowsTheOutputAndOutlivesTheSequence) {
  KvCacheCoordinator m(hybrid_groups(kBs), 16, /*prefix=*/true, /*num_state_slots=*/3);
  Request a = request("a", iota(10, 1));
  ASSERT_TRUE(m.allocate(a, 8));
  a.num_computed_tokens = 8;
  m.commit_computed(a);
  ASSERT_EQ(m.take_state_copies().size(), 2u) << "the prompt's checkpoint at 8";
  ASSERT_TRUE(m.allocate(a, 2));
  a.num_computed_tokens = 10;
  m.commit_computed(a);
  EXPECT_TRUE(m.take_state_copies().empty()) << "10 is no block boundary";
  int32_t rolling = -1;
  for (int token = 11; token <= 19; ++token) {  // decode: one token a step
    a.output.push_back(token);
    ASSERT_TRUE(m.allocate(a, 1));
    ++a.num_computed_tokens;
    m.commit_computed(a);
    const auto copies = m.take_state_copies();
    if (a.num_computed_tokens % kBs != 0) {
      EXPECT_TRUE(copies.empty()) << a.num_computed_tokens;
      continue;
    }
    ASSERT_EQ(copies.size(), 2u) << a.num_computed_tokens;
    EXPECT_EQ(copies[0], a.state_slot());
    if (rolling >= 0) EXPECT_EQ(copies[1], rolling) << "the rolling checkpoint keeps its slot";
    rolling = copies[1];
    EXPECT_EQ(m.state_slots().num_checkpoints(), 2) << "the prompt's and one rolling checkpoint";
  }
  EXPECT_EQ(a.num_computed_tokens, 19);  // boundaries 12 and 16 were saved
  Request next = request("next", concat(concat(a.prompt, a.output), iota(5, 100)));
  m.free(a);
  const auto hit = m.find_cached_prefix(next);
  EXPECT_EQ(hit.num_tokens, 16) << "the last full block of a's prompt and output";
  ASSERT_TRUE(m.allocate(next, next.num_tokens() - 16, hit));
  EXPECT_EQ(m.take_state_copies(), (std::vector<int32_t>{rolling, next.state_slot()}));
}

// Speculative decoding: a verification step whose accepted drafts pass a block boundary without
// ending there saves the state kept after that draft.
TEST(KvCacheCoordinator, HybridRollingCheckpointOfABoundaryPassedByAcceptedDrafts) {
  KvCacheCoordinator m(hybrid_groups(kBs), 16, /*prefix=*/true, /*num_state_slots=*/8, /*slots_per_seq=*/4);
  Request a = request("a", iota(10, 1));
  ASSERT_TRUE(m.allocate(a, 8));
  a.num_computed_tokens = 8;
  m.commit_computed(a);
  ASSERT_TRUE(m.allocate(a, 2));
  a.num_computed_tokens = 10;
  m.commit_computed(a);
  m.take_state_copies();
  // Last token 11 and drafts 12, 13, 14 verified: positions 10..13, the state after each in draft
  // state slot j (j = 0: the sequence's own). Two drafts are accepted: computed 10 -> 11 -> 13.
  a.output = {11};
  a.spec_tokens = {12, 13, 14};
  ASSERT_TRUE(m.allocate(a, 4));
  const int32_t after_12 = m.draft_state_slot(a, 1);  // after position 11: 12 tokens computed
  a.num_computed_tokens = 11;
  m.commit_computed(a);
  EXPECT_TRUE(m.take_state_copies().empty());
  a.output = {11, 12, 13};
  a.spec_tokens.clear();
  a.num_computed_tokens = 13;
  m.accept_drafts(a, 2);
  const auto copies = m.take_state_copies();
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0], after_12) << "saved from the slot holding the state at 12";
  EXPECT_EQ(m.state_slots().num_checkpoints(), 2) << "the prompt's at 8, the rolling one at 12";
  Request next = request("next", concat(iota(10, 1), {11, 12, 13, 50}));
  EXPECT_EQ(m.find_cached_prefix(next).num_tokens, 12);
}

// The rolling checkpoint moves at most every checkpoint_interval tokens (here 3 blocks; the
// default, 256, keeps a decoding sequence from copying its state every block): past the prompt's
// checkpoint at 8 it moves at 20 and 32, never at the boundaries between.
TEST(KvCacheCoordinator, HybridRollingCheckpointMovesEveryIntervalOnly) {
  EXPECT_EQ(CacheGroupSpec{}.checkpoint_interval, 256);
  KvCacheCoordinator m(hybrid_groups(3 * kBs), 16, /*prefix=*/true, /*num_state_slots=*/3);
  Request a = request("a", iota(10, 1));
  ASSERT_TRUE(m.allocate(a, 10));
  a.num_computed_tokens = 8;
  m.commit_computed(a);
  a.num_computed_tokens = 10;
  m.commit_computed(a);
  m.take_state_copies();
  std::vector<int> moved_at;
  for (int token = 11; token <= 34; ++token) {
    a.output.push_back(token);
    ASSERT_TRUE(m.allocate(a, 1));
    ++a.num_computed_tokens;
    m.commit_computed(a);
    if (!m.take_state_copies().empty()) moved_at.push_back(a.num_computed_tokens);
  }
  EXPECT_EQ(moved_at, (std::vector<int>{20, 32}));
  Request next = request("next", concat(concat(a.prompt, a.output), iota(5, 100)));
  m.free(a);
  EXPECT_EQ(m.find_cached_prefix(next).num_tokens, 32);
}

}  // namespace
}  // namespace tessera
