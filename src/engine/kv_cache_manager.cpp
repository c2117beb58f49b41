#include "engine/kv_cache_manager.h"

#include <algorithm>

namespace tessera {

KvCacheManager::KvCacheManager(int num_blocks, int block_size, bool enable_prefix_caching)
    : block_size_(block_size), pool_(num_blocks, enable_prefix_caching) {}

std::vector<int32_t> KvCacheManager::find_cached_prefix(const Request& r) const {
  std::vector<int32_t> hits;
  const int max_blocks = (r.num_tokens() - 1) / block_size_;
  uint64_t h = 0;
  std::vector<int32_t> tokens(static_cast<size_t>(block_size_));
  for (int b = 0; b < max_blocks; ++b) {
    for (int i = 0; i < block_size_; ++i) tokens[i] = r.token_at(b * block_size_ + i);
    h = hash_block(h, tokens.data(), block_size_);
    auto hit = pool_.lookup(h);
    if (!hit) break;
    hits.push_back(*hit);
  }
  return hits;
}

bool KvCacheManager::allocate(Request& r, int num_new_tokens, const std::vector<int32_t>& cached) {
  const int cached_tokens = static_cast<int>(cached.size()) * block_size_;
  const int total = r.num_computed_tokens + cached_tokens + num_new_tokens;
  const int need_blocks = (total + block_size_ - 1) / block_size_;
  const int have = static_cast<int>(r.block_ids.size() + cached.size());
  const int new_blocks = std::max(0, need_blocks - have);
  // Cached blocks sitting in the free queue count as free until touched.
  int cached_in_free = 0;
  for (int32_t b : cached)
    if (pool_.ref_count(b) == 0) ++cached_in_free;
  if (new_blocks > pool_.num_free() - cached_in_free) return false;
  if (!cached.empty()) {
    pool_.touch(cached);
    r.block_ids.insert(r.block_ids.end(), cached.begin(), cached.end());
    r.num_computed_tokens += cached_tokens;
  }
  auto fresh = pool_.allocate(new_blocks);
  r.block_ids.insert(r.block_ids.end(), fresh.begin(), fresh.end());
  return true;
}

void KvCacheManager::commit_computed(Request& r) {
  const int full = r.num_computed_tokens / block_size_;
  std::vector<int32_t> tokens(static_cast<size_t>(block_size_));
  while (static_cast<int>(r.block_hashes.size()) < full) {
    const int b = static_cast<int>(r.block_hashes.size());
    for (int i = 0; i < block_size_; ++i) tokens[i] = r.token_at(b * block_size_ + i);
    uint64_t parent = b ? r.block_hashes.back() : 0;
    uint64_t h = hash_block(parent, tokens.data(), block_size_);
    r.block_hashes.push_back(h);
    pool_.register_full_block(r.block_ids[b], h);
  }
}

void KvCacheManager::free(Request& r) {
  std::vector<int32_t> rev(r.block_ids.rbegin(), r.block_ids.rend());
  pool_.release(rev);
  r.block_ids.clear();
  r.block_hashes.clear();
  r.num_computed_tokens = 0;
}

}  // namespace tessera
