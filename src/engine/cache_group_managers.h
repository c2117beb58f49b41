// One manager per cache group (vLLM v1's SingleTypeKVCacheManager: FullAttentionManager,
// SlidingWindowManager, MambaManager), each keeping its group's table of every request
// (Request::cache_tables[group]). The KvCacheCoordinator drives them through this one
// interface and makes a request's allocation all-or-nothing across them; paged managers take
// blocks from the one KvBlockPool the coordinator owns, the state manager takes slots from its
// StateSlotPool.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/cache_groups.h"
#include "engine/kv_block_pool.h"
#include "engine/request.h"
#include "engine/state_slot_pool.h"

namespace tessera {

// A prefix-cache hit for a request being admitted (KvCacheCoordinator::find_cached_prefix).
struct CacheHit {
  int num_tokens = 0;  // a multiple of the block size; never the whole prompt
  // Where the paged groups' match ended before the state group cut it back to a checkpoint.
  int kv_matched_tokens = 0;
  std::vector<uint64_t> hashes;              // chained hashes of the hit's blocks
  std::vector<std::vector<int32_t>> blocks;  // per group: the blocks taken (kNullBlock where not needed)
  int num_blocks() const { return static_cast<int>(hashes.size()); }
  bool empty() const { return num_tokens == 0; }
  const std::vector<int32_t>& group_blocks(int group) const {
    static const std::vector<int32_t> kNone;
    return static_cast<size_t>(group) < blocks.size() ? blocks[static_cast<size_t>(group)] : kNone;
  }
};

class CacheGroupManager {
 public:
  CacheGroupManager(int group, CacheGroupSpec spec) : group_(group), spec_(spec) {}
  virtual ~CacheGroupManager() = default;
  int group() const { return group_; }
  const CacheGroupSpec& spec() const { return spec_; }

  // Prefix caching: the largest n <= max_blocks such that this group holds, in its cache, what a
  // request whose first blocks have the chained `hashes` needs to go on computing at position
  // n * block_size (n = 0 always qualifies).
  virtual int longest_hit(const std::vector<uint64_t>& hashes, int max_blocks) const = 0;
  // This group's part of a hit of the first n blocks (paged: block ids; the state group: none).
  virtual std::vector<int32_t> hit_blocks(const std::vector<uint64_t>& hashes, int n) const = 0;
  // Gives back what r, with r.num_computed_tokens computed, never reads again (a sliding
  // window's blocks before the next token's window).
  virtual void remove_skipped(Request& r) { (void)r; }
  // Pool blocks r must take to hold `total` tokens once `hit` is taken.
  virtual int blocks_to_take(const Request& r, const CacheHit& hit, int total) const = 0;
  // Whatever else the allocation needs besides pool blocks is there (the state group: slots).
  virtual bool fits(const Request& r) const {
    (void)r;
    return true;
  }
  // Takes `hit` and the new blocks (or slots); the coordinator checked that they fit.
  virtual void take(Request& r, const CacheHit& hit, int total) = 0;
  // After r.block_hashes grew from `first_new` to the blocks now complete.
  virtual void commit(Request& r, int first_new) = 0;
  virtual void free(Request& r) = 0;
  // Speculative decoding: `accepted` drafts of the step were accepted (r.num_computed_tokens
  // counts them already); the rest is rolled back. Paged groups keep their blocks (a rejected
  // draft's KV is overwritten by a later token); the state group keeps the state after the last
  // accepted token.
  virtual void accept_drafts(Request& r, int accepted) { (void)r, (void)accepted; }

 protected:
  CacheGroupTable& table(Request& r) const { return r.cache_tables[static_cast<size_t>(group_)]; }
  const CacheGroupTable& table(const Request& r) const { return r.cache_tables[static_cast<size_t>(group_)]; }

 private:
  int group_;
  CacheGroupSpec spec_;
};

// Paged KV, every block of the sequence kept.
class FullAttentionManager : public CacheGroupManager {
 public:
  FullAttentionManager(int group, CacheGroupSpec spec, KvBlockPool& pool)
      : CacheGroupManager(group, spec), pool_(pool) {}
  int longest_hit(const std::vector<uint64_t>& hashes, int max_blocks) const override;
  std::vector<int32_t> hit_blocks(const std::vector<uint64_t>& hashes, int n) const override;
  int blocks_to_take(const Request& r, const CacheHit& hit, int total) const override;
  void take(Request& r, const CacheHit& hit, int total) override;
  void commit(Request& r, int first_new) override;
  void free(Request& r) override;

 protected:
  int block_size() const { return spec().block_size; }
  // The cached blocks of hashes [first, n), after `first` kNullBlock entries.
  std::vector<int32_t> cached_blocks(const std::vector<uint64_t>& hashes, int first, int n) const;
  KvBlockPool& pool_;
};

// Paged KV of sliding-window layers: the next token, at position p, reads [p - W + 1, p - 1]
// besides itself, so the blocks wholly before p - W + 1 are given back to the pool (their
// table entries become kNullBlock; with prefix caching they stay cached until evicted). A
// prefix hit ending at block n needs only the blocks holding the W - 1 positions before
// n * block_size.
class SlidingWindowManager : public FullAttentionManager {
 public:
  SlidingWindowManager(int group, CacheGroupSpec spec, KvBlockPool& pool);
  int longest_hit(const std::vector<uint64_t>& hashes, int max_blocks) const override;
  std::vector<int32_t> hit_blocks(const std::vector<uint64_t>& hashes, int n) const override;
  void remove_skipped(Request& r) override;
  // The first block the token at position `pos` (and every later one) may read.
  int first_needed_block(int pos) const;
};

// Linear-attention state slots of hybrid models (one state group over every kStateSlot layer).
// A sequence holds slots_per_seq slots (1 + k with speculative decoding). With prefix caching,
// a prompt's prefill stops at up to two block boundaries and the state there is copied into a
// checkpoint slot keyed by that block's hash: where its paged match ended at admission, past its
// last checkpointed block (shared_prefix_end), and its last full-block boundary. Past that, each
// block boundary the sequence reaches at least `checkpoint_interval` tokens (the spec's, 256) after
// its previous checkpoint moves its one rolling checkpoint there, so a finished sequence leaves the
// state after a block of its output at most that far from its end: the next turn of a conversation
// recomputes its new tokens and fewer than checkpoint_interval tokens before them. A prefix hit ends only at a
// checkpointed block, whose state is copied into the new sequence's slot. Copies are queued as (src, dst) slot pairs,
// applied by the ModelRunner before the next forward, in order.
class StateSlotManager : public CacheGroupManager {
 public:
  StateSlotManager(int group, CacheGroupSpec spec, int num_slots, int slots_per_seq, bool prefix_caching);
  int longest_hit(const std::vector<uint64_t>& hashes, int max_blocks) const override;
  std::vector<int32_t> hit_blocks(const std::vector<uint64_t>& hashes, int n) const override;
  int blocks_to_take(const Request& r, const CacheHit& hit, int total) const override;
  bool fits(const Request& r) const override;
  void take(Request& r, const CacheHit& hit, int total) override;
  void commit(Request& r, int first_new) override;
  void free(Request& r) override;
  void accept_drafts(Request& r, int accepted) override;

  const StateSlotPool& slots() const { return slots_; }
  // The prompt's last full-block boundary that a later prefix hit can end at; 0 = none.
  int checkpoint_boundary(const Request& r) const;
  // The first position after `start` where r's prefill stops for a checkpoint; 0 = none. A
  // request not admitted yet takes its shared prefix end from `hit`.
  int next_checkpoint(const Request& r, int start, const CacheHit& hit) const;
  int32_t draft_state_slot(const Request& r, int j) const;
  std::vector<int32_t> take_copies() { return std::exchange(copies_, {}); }

 private:
  // Saves the state in `src` (after `boundary` tokens, the block keyed `hash`) as t's rolling
  // checkpoint: into the slot of its previous one, else a free or least recently used one.
  void save_rolling_checkpoint(CacheGroupTable& t, int boundary, uint64_t hash, int32_t src);

  int slots_per_seq_;
  bool prefix_caching_;
  int rolling_interval_;  // the spec's checkpoint_interval rounded up to whole blocks
  StateSlotPool slots_;
  std::vector<int32_t> copies_;
};

}  // namespace tessera
