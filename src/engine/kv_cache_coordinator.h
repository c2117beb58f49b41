// The cache coordinator (vLLM v1's KVCacheCoordinator, the hybrid one): one manager per cache
// group (engine/cache_group_managers.h: full attention, sliding window, state slots) over one
// KV block pool and, for hybrid models, one state-slot pool, behind the one interface the
// scheduler uses. A request's allocation is all-or-nothing across the groups; a prefix hit is
// the longest one every group can serve; speculative rollback and freeing go to every group.
// - Paged groups: prefix-cache hits at admission, new blocks as tokens are scheduled, full
//   blocks registered for reuse as they complete (each group caches its own blocks, keyed by
//   the same chained block hashes); a sliding-window group gives back the blocks before the
//   next token's window.
// - The state group (linear-attention layers of hybrid models): one slot per running sequence,
//   taken at admission, kept across chunked-prefill steps and decode, given back on finish,
//   abort or preemption (a preempted sequence recomputes from scratch); prefix-cache
//   checkpoints (StateSlotManager).
#pragma once
#include <memory>
#include <vector>

#include "engine/cache_group_managers.h"

namespace tessera {

class KvCacheCoordinator {
 public:
  // `groups` as make_cache_groups orders them (paged groups, one block size, then at most one
  // state group, which needs num_state_slots > 0). A sequence holds slots_per_seq state slots
  // (1 + k with speculative decoding: CacheGroupTable::draft_state_slots).
  KvCacheCoordinator(std::vector<CacheGroup> groups, int num_blocks, bool enable_prefix_caching,
                     int num_state_slots = 0, int slots_per_seq = 1);
  // One full-attention group, and a state group when num_state_slots > 0.
  KvCacheCoordinator(int num_blocks, int block_size, bool enable_prefix_caching, int num_state_slots = 0,
                     int slots_per_seq = 1);

  const std::vector<CacheGroup>& groups() const { return groups_; }
  int block_size() const { return block_size_; }
  KvBlockPool& pool() { return pool_; }
  const KvBlockPool& pool() const { return pool_; }
  bool has_state_slots() const { return state_ != nullptr; }
  const StateSlotPool& state_slots() const;
  // Whether r holds anything in any group.
  bool holds_cache(const Request& r) const;

  // For a request not yet holding cache: its longest prefix every group can serve from the
  // cache (never the whole prompt: the last token must be computed to get logits). With a state
  // group: only up to the last block that has a checkpoint (kv_matched_tokens: where the paged
  // groups' match ended before that cut).
  CacheHit find_cached_prefix(const Request& r) const;
  // Makes room for num_new_tokens more tokens after r.num_computed_tokens, first taking `hit`
  // (from find_cached_prefix) as computed; gives r a state slot if it needs one (and queues the
  // restore of the checkpoint `hit` ends at). False if it does not fit (nothing is taken then;
  // a sliding-window group may have given back blocks r no longer reads).
  bool allocate(Request& r, int num_new_tokens, const CacheHit& hit = {});
  // Hybrid models with prefix caching: the position where r's prefill stops for a checkpoint
  // (its prompt's last full-block boundary that a later prefix hit can end at); 0 = none.
  int checkpoint_boundary(const Request& r) const;
  // The first position after `start` where r's prefill stops for a checkpoint: its shared prefix
  // end (from `hit` for a request being admitted) or its checkpoint_boundary; 0 = none.
  int next_checkpoint(const Request& r, int start, const CacheHit& hit = {}) const;
  // After a step: registers blocks that are now completely computed; a request that just
  // reached one of its checkpoint positions has its state saved (a queued copy).
  void commit_computed(Request& r);
  // Gives back everything r holds in every group.
  void free(Request& r);
  // Speculative decoding: after verification accepted `accepted` drafts (r.num_computed_tokens
  // counts them), every group rolls back the rest (the state group keeps the slot holding the
  // state after the last accepted token), then the newly complete blocks are committed.
  void accept_drafts(Request& r, int accepted);
  // Hybrid models with speculative decoding: the slot that keeps the state after token j of r's
  // verification chunk (j = 0: the last token, j >= 1: draft j - 1's position).
  int32_t draft_state_slot(const Request& r, int j) const;
  // The state copies queued since the last call, (src, dst) pairs flattened.
  std::vector<int32_t> take_state_copies();

 private:
  // Extends `hashes` (the chained hashes of r's first blocks) to r's first num_blocks blocks.
  void append_block_hashes(const Request& r, int num_blocks, std::vector<uint64_t>& hashes) const;
  // The largest n <= max_blocks that every manager (the state group's too, or not) can serve.
  int common_hit(const std::vector<uint64_t>& hashes, int max_blocks, bool with_state) const;

  std::vector<CacheGroup> groups_;
  int block_size_;
  KvBlockPool pool_;
  std::vector<std::unique_ptr<CacheGroupManager>> managers_;  // one per group, in group order
  StateSlotManager* state_ = nullptr;                         // the state group's, if any
};

}  // namespace tessera
