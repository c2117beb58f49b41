// The cache coordinator (vLLM v1's KVCacheCoordinator): one manager per cache type behind
// one interface, and a request's allocation is all-or-nothing across them.
// - Paged KV (attention layers): prefix-cache hits at admission, new blocks as tokens are
//   scheduled, full blocks registered for reuse as they complete.
// - State slots (linear-attention layers of hybrid models): one slot per running sequence,
//   taken at admission, kept across chunked-prefill steps and decode, given back on finish,
//   abort or preemption (a preempted sequence recomputes from scratch). With prefix caching,
//   a prompt's prefill stops at up to two block boundaries and the state there is copied into
//   a checkpoint slot keyed by that block's hash: where its KV match in the cache ended at
//   admission, past its last checkpointed block (the prefix it shares with earlier prompts,
//   SGLang/vLLM-style), and its last full-block boundary (a later identical prompt or
//   continuation). A later prefix hit is taken only up to a checkpointed block, whose state is
//   copied into the new sequence's slot.
// State copies are queued as (src, dst) slot pairs and applied by the ModelRunner before the
// next forward, in order.
#pragma once
#include <vector>

#include "engine/kv_block_pool.h"
#include "engine/request.h"
#include "engine/state_slot_pool.h"

namespace tessera {

class KvCacheManager {
 public:
  // num_state_slots > 0: the model has linear-attention layers (a hybrid model). A sequence
  // holds slots_per_seq of them (1 + k with speculative decoding: Request::draft_state_slots).
  KvCacheManager(int num_blocks, int block_size, bool enable_prefix_caching, int num_state_slots = 0,
                 int slots_per_seq = 1);

  int block_size() const { return block_size_; }
  KvBlockPool& pool() { return pool_; }
  const KvBlockPool& pool() const { return pool_; }
  bool has_state_slots() const { return slots_.num_slots() > 0; }
  const StateSlotPool& state_slots() const { return slots_; }

  // For a request not yet holding blocks: the cached blocks of its longest cached
  // prefix (never the whole prompt: the last token must be computed to get logits). With
  // state slots: only up to the last block that has a checkpoint; `kv_matched_tokens` (if
  // given) gets the tokens of the KV match before that cut.
  std::vector<int32_t> find_cached_prefix(const Request& r, int* kv_matched_tokens = nullptr) const;
  // Makes room for num_new_tokens more tokens after r.num_computed_tokens, first taking
  // `cached` (from find_cached_prefix) as already computed; gives r a state slot if it needs
  // one (and queues the restore of the checkpoint `cached` ends at). False if it does not
  // fit (nothing changes then).
  bool allocate(Request& r, int num_new_tokens, const std::vector<int32_t>& cached = {});
  // Hybrid models with prefix caching: the position where r's prefill stops for a checkpoint
  // (its prompt's last full-block boundary that a later prefix hit can end at); 0 = none.
  int checkpoint_boundary(const Request& r) const;
  // The first position after `start` where r's prefill stops for a checkpoint: its
  // shared_prefix_end or its checkpoint_boundary; 0 = none.
  int next_checkpoint(const Request& r, int start) const;
  // After a step: registers blocks that are now completely computed; a request that just
  // reached one of its checkpoint positions has its state saved (a queued copy).
  void commit_computed(Request& r);
  // Returns every block and the state slot of r.
  void free(Request& r);
  // Speculative decoding on hybrid models: the slot that keeps the state after token j of r's
  // verification chunk (j = 0: the last token, j >= 1: draft j - 1's position); and, once
  // `accepted` drafts were accepted, makes the slot holding the state after the last accepted
  // token r's state slot.
  int32_t draft_state_slot(const Request& r, int j) const;
  void accept_draft_states(Request& r, int accepted);
  // The state copies queued since the last call, (src, dst) pairs flattened.
  std::vector<int32_t> take_state_copies();

 private:
  uint64_t prefix_hash(const Request& r, int num_blocks) const;  // chained hash of the first blocks

  int block_size_;
  int slots_per_seq_;
  KvBlockPool pool_;
  StateSlotPool slots_;
  std::vector<int32_t> copies_;
};

}  // namespace tessera
