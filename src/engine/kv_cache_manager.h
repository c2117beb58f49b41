// Maps requests to KV blocks: prefix-cache hits at admission, new blocks as tokens
// are scheduled, full blocks registered for reuse as they complete.
#pragma once
#include <vector>

#include "engine/kv_block_pool.h"
#include "engine/request.h"

namespace tessera {

class KvCacheManager {
 public:
  KvCacheManager(int num_blocks, int block_size, bool enable_prefix_caching);

  int block_size() const { return block_size_; }
  KvBlockPool& pool() { return pool_; }
  const KvBlockPool& pool() const { return pool_; }

  // For a request not yet holding blocks: the cached blocks of its longest cached
  // prefix (never the whole prompt: the last token must be computed to get logits).
  std::vector<int32_t> find_cached_prefix(const Request& r) const;
  // Makes room for num_new_tokens more tokens after r.num_computed_tokens, first taking
  // `cached` (from find_cached_prefix) as already computed. False if it does not fit
  // (nothing changes then).
  bool allocate(Request& r, int num_new_tokens, const std::vector<int32_t>& cached = {});
  // After a step: registers blocks that are now completely computed.
  void commit_computed(Request& r);
  // Returns every block of r to the pool.
  void free(Request& r);

 private:
  int block_size_;
  KvBlockPool pool_;
};

}  // namespace tessera
