// Fixed pool of KV cache blocks with reference counts and a prefix cache, shared by every
// paged cache group (vLLM v1's BlockPool under its KVCacheCoordinator).
// A block that no request holds stays in the free queue with its hash, so a later
// request with the same prefix can take it back; eviction takes the least recently
// freed block first (vLLM v1's design).
#pragma once
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace tessera {

class KvBlockPool {
 public:
  KvBlockPool(int num_blocks, bool enable_prefix_caching);

  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  int num_free() const { return static_cast<int>(free_.size()); }  // includes evictable cached blocks
  double usage() const { return 1.0 - static_cast<double>(num_free()) / std::max(1, num_blocks()); }

  // Takes n blocks off the free queue (evicting their cached hashes); caller checks num_free.
  std::vector<int32_t> allocate(int n);
  // Increments reference counts of cached blocks found by lookup.
  void touch(const std::vector<int32_t>& blocks);
  // Decrements reference counts; blocks that reach zero go to the free queue's tail in the
  // order given (pass a request's blocks in reverse so its last blocks are evicted first).
  void release(const std::vector<int32_t>& blocks);

  // The cached block of cache group `group` (KvCacheCoordinator) holding the full block whose
  // chained hash is `hash`: groups share the pool, each caches its own blocks.
  std::optional<int32_t> lookup(uint64_t hash, int group = 0) const;
  // Records that `block` holds group `group`'s full block whose chained hash is `hash`.
  void register_full_block(int32_t block, uint64_t hash, int group = 0);

  int ref_count(int32_t block) const { return blocks_[block].refs; }
  bool prefix_caching() const { return prefix_caching_; }
  bool all_free() const { return num_free() == num_blocks(); }
  uint64_t evictions() const { return evictions_; }

 private:
  struct Block {
    int refs = 0;
    std::optional<uint64_t> hash;
    std::list<int32_t>::iterator free_pos;
    bool in_free = false;
  };
  std::vector<Block> blocks_;
  std::list<int32_t> free_;
  std::unordered_map<uint64_t, int32_t> cached_;
  bool prefix_caching_;
  uint64_t evictions_ = 0;
};

// Chained hash of one full block: depends on every token before it too.
uint64_t hash_block(uint64_t parent, const int32_t* tokens, int n);

}  // namespace tessera
