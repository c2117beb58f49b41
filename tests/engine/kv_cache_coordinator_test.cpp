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
  KvCacheCoordinator m(16, kBs, /*prefix=*/true, /*num_state_slots=*/3);
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

}  // namespace
}  // namespace tessera
