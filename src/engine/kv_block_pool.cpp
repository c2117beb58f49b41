#include "engine/kv_block_pool.h"

#include "core/error.h"

namespace tessera {

uint64_t hash_block(uint64_t parent, const int32_t* tokens, int n) {
  // 64-bit mixing (splitmix-style) over the parent hash and the token ids.
  uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
  auto mix = [](uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
  };
  for (int i = 0; i < n; ++i)
    h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) + 0x100000000ull * i));
  return mix(h + static_cast<uint64_t>(n));
}

KvBlockPool::KvBlockPool(int num_blocks, bool enable_prefix_caching)
    : blocks_(static_cast<size_t>(num_blocks)), prefix_caching_(enable_prefix_caching) {
  for (int32_t i = 0; i < num_blocks; ++i) {
    free_.push_back(i);
    blocks_[i].free_pos = std::prev(free_.end());
    blocks_[i].in_free = true;
  }
}

std::vector<int32_t> KvBlockPool::allocate(int n) {
  TESSERA_CHECK(n <= num_free(), "KV block pool: {} blocks asked, {} free", n, num_free());
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    int32_t b = free_.front();
    free_.pop_front();
    Block& blk = blocks_[b];
    blk.in_free = false;
    if (blk.hash) {
      auto it = cached_.find(*blk.hash);
      if (it != cached_.end() && it->second == b) cached_.erase(it);
      blk.hash.reset();
      ++evictions_;
    }
    blk.refs = 1;
    out.push_back(b);
  }
  return out;
}

void KvBlockPool::touch(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    Block& blk = blocks_[b];
    if (blk.in_free) {
      free_.erase(blk.free_pos);
      blk.in_free = false;
    }
    ++blk.refs;
  }
}

void KvBlockPool::release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    Block& blk = blocks_[b];
    TESSERA_CHECK(blk.refs > 0, "KV block {} released more often than taken", b);
    if (--blk.refs == 0) {
      free_.push_back(b);
      blk.free_pos = std::prev(free_.end());
      blk.in_free = true;
    }
  }
}

namespace {

// The prefix cache's key of group `group`'s block with chained hash `hash` (group 0: the hash).
uint64_t cache_key(uint64_t hash, int group) {
  if (group == 0) return hash;
  const int32_t g = group;
  return hash_block(hash, &g, 1);
}

}  // namespace

std::optional<int32_t> KvBlockPool::lookup(uint64_t hash, int group) const {
  if (!prefix_caching_) return std::nullopt;
  auto it = cached_.find(cache_key(hash, group));
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

void KvBlockPool::register_full_block(int32_t block, uint64_t hash_in, int group) {
  if (!prefix_caching_) return;
  const uint64_t hash = cache_key(hash_in, group);
  Block& blk = blocks_[block];
  if (blk.hash) return;
  // Another block may already hold the same content (two requests prefilled it in one
  // step); keep the first, this one is then simply not shared.
  if (cached_.count(hash)) return;
  blk.hash = hash;
  cached_.emplace(hash, block);
}

}  // namespace tessera
