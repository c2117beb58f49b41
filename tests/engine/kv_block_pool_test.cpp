// KvBlockPool: reference counts, the free queue's LRU order (which decides what a prefix-cache
// eviction takes), the prefix cache's hash map, and the chained block hash.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "engine/kv_block_pool.h"

namespace tessera {
namespace {

TEST(KvBlockPool, AllocatesInFreeQueueOrderWithOneReference) {
  KvBlockPool p(5, /*prefix=*/true);
  EXPECT_EQ(p.num_free(), 5);
  EXPECT_TRUE(p.all_free());
  const auto a = p.allocate(3);
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1, 2}));
  for (int32_t b : a) EXPECT_EQ(p.ref_count(b), 1);
  EXPECT_EQ(p.num_free(), 2);
  EXPECT_DOUBLE_EQ(p.usage(), 0.6);
  EXPECT_THROW(p.allocate(3), Error) << "more blocks than are free";
  EXPECT_EQ(p.num_free(), 2) << "a refused allocation takes nothing";
  EXPECT_EQ(p.allocate(0), std::vector<int32_t>{});
}

TEST(KvBlockPool, ReleasedBlocksAreReusedLeastRecentlyFreedFirst) {
  KvBlockPool p(4, /*prefix=*/false);
  ASSERT_EQ(p.allocate(4).size(), 4u);
  // Released in this order: 2, 0 (one call), then 3, then 1.
  p.release({2, 0});
  p.release({3});
  p.release({1});
  EXPECT_TRUE(p.all_free());
  EXPECT_EQ(p.allocate(4), (std::vector<int32_t>{2, 0, 3, 1}));
}

TEST(KvBlockPool, SharedBlocksCountReferencesAndFreeOnTheLast) {
  KvBlockPool p(4, /*prefix=*/true);
  const auto a = p.allocate(2);
  p.register_full_block(a[0], 100);
  p.touch({a[0]});  // a second request shares the first block
  EXPECT_EQ(p.ref_count(a[0]), 2);
  EXPECT_EQ(p.ref_count(a[1]), 1);
  p.release({a[1], a[0]});  // the first request finishes
  EXPECT_EQ(p.ref_count(a[0]), 1);
  EXPECT_EQ(p.ref_count(a[1]), 0);
  EXPECT_EQ(p.num_free(), 3) << "the shared block is still held";
  p.release({a[0]});
  EXPECT_TRUE(p.all_free());
  EXPECT_THROW(p.release({a[0]}), Error) << "released more often than taken";
}

TEST(KvBlockPool, AFreedCachedBlockIsFoundUntilItsReuseEvictsIt) {
  KvBlockPool p(2, /*prefix=*/true);
  const auto a = p.allocate(2);
  p.register_full_block(a[0], 111);
  p.register_full_block(a[1], 222);
  p.release({a[1], a[0]});  // reversed, as the cache manager does: the last block goes first
  ASSERT_EQ(p.lookup(111), a[0]);
  ASSERT_EQ(p.lookup(222), a[1]);
  EXPECT_EQ(p.evictions(), 0u);
  // Taking one block back from the free queue evicts the least recently freed: a[1].
  EXPECT_EQ(p.allocate(1), std::vector<int32_t>{a[1]});
  EXPECT_FALSE(p.lookup(222));
  EXPECT_EQ(p.lookup(111), a[0]);
  EXPECT_EQ(p.evictions(), 1u);
  // A cache hit on a free block takes it off the free queue: the next allocation cannot evict it.
  p.touch({a[0]});
  EXPECT_EQ(p.ref_count(a[0]), 1);
  EXPECT_EQ(p.num_free(), 0);
  EXPECT_THROW(p.allocate(1), Error);
  EXPECT_EQ(p.lookup(111), a[0]);
}

TEST(KvBlockPool, TheFirstBlockRegisteredForAHashKeepsIt) {
  KvBlockPool p(3, /*prefix=*/true);
  const auto a = p.allocate(3);
  p.register_full_block(a[0], 7);
  p.register_full_block(a[1], 7);  // same content prefilled twice in one step
  EXPECT_EQ(p.lookup(7), a[0]);
  p.register_full_block(a[0], 8);  // a block keeps the hash it was registered with
  EXPECT_FALSE(p.lookup(8));
  // Reusing the duplicate (never registered) must not drop the first block's entry.
  p.release({a[1]});
  p.allocate(1);
  EXPECT_EQ(p.lookup(7), a[0]);
  EXPECT_EQ(p.evictions(), 0u);
}

TEST(KvBlockPool, WithoutPrefixCachingNothingIsFound) {
  KvBlockPool p(2, /*prefix=*/false);
  const auto a = p.allocate(1);
  p.register_full_block(a[0], 5);
  EXPECT_FALSE(p.lookup(5));
  EXPECT_FALSE(p.prefix_caching());
}

TEST(KvBlockPool, TheBlockHashChainsOverEveryEarlierToken) {
  const std::vector<int32_t> x = {1, 2, 3, 4}, y = {1, 2, 4, 3};
  const uint64_t h = hash_block(0, x.data(), 4);
  EXPECT_EQ(h, hash_block(0, x.data(), 4));
  EXPECT_NE(h, hash_block(0, y.data(), 4)) << "token order matters";
  EXPECT_NE(hash_block(h, x.data(), 4), hash_block(hash_block(0, y.data(), 4), x.data(), 4))
      << "the same block after a different prefix hashes differently";
  EXPECT_NE(hash_block(0, x.data(), 3), hash_block(0, x.data(), 4));
}

}  // namespace
}  // namespace tessera
