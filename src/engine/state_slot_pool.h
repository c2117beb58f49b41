// Fixed pool of linear-attention state slots (the state cache group's, beside the paged groups'
// KvBlockPool; the KvCacheCoordinator coordinates both). A running sequence of a hybrid model
// holds one slot: row `slot` of every kStateSlot layer's conv and recurrent state tensors. A
// slot can also hold a prefix-cache checkpoint: the state after the full block whose chained
// hash it is keyed by, copied from a sequence that stopped a prefill chunk there. Checkpoints
// are evictable: a sequence (or a newer checkpoint) that finds no free slot takes the least
// recently used one.
#pragma once
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace tessera {

class StateSlotPool {
 public:
  explicit StateSlotPool(int num_slots);

  int num_slots() const { return static_cast<int>(state_.size()); }
  int num_free() const { return static_cast<int>(free_.size()); }  // excludes checkpoints
  int num_checkpoints() const { return static_cast<int>(lru_.size()); }
  int num_held() const { return num_slots() - num_free() - num_checkpoints(); }  // by sequences
  // Free or evictable: what allocate() can hand out.
  int num_available() const { return num_free() + num_checkpoints(); }
  bool all_free() const { return num_free() == num_slots(); }

  // A slot for a sequence: a free one, else the least recently used checkpoint's (evicting it).
  std::optional<int32_t> allocate();
  // Gives a sequence's slot back.
  void release(int32_t slot);

  // The checkpoint saved for `hash`, if any (no LRU change).
  std::optional<int32_t> checkpoint(uint64_t hash) const;
  // Marks the checkpoint most recently used (a prefix hit restores from it).
  void touch_checkpoint(uint64_t hash);
  // A slot to save the checkpoint of `hash` into: a free one, else the least recently used
  // other checkpoint's. nullopt when `hash` already has one or every slot holds a sequence.
  std::optional<int32_t> add_checkpoint(uint64_t hash);
  // Re-keys the checkpoint of `from` to `to`, most recently used: a sequence's rolling checkpoint
  // moving to its next block boundary, saved into the same slot (returned). nullopt when `from` has
  // no checkpoint (evicted) or `to` already has one.
  std::optional<int32_t> move_checkpoint(uint64_t from, uint64_t to);
  uint64_t checkpoint_evictions() const { return evictions_; }

 private:
  enum class State : uint8_t { kFree, kHeld, kCheckpoint };
  int32_t evict_lru();
  // A free slot, else the least recently used checkpoint's; marked `as`.
  std::optional<int32_t> take_slot(State as);
  std::vector<State> state_;
  std::vector<int32_t> free_;  // a stack: the most recently freed slot is reused first
  std::list<uint64_t> lru_;    // checkpoint hashes, least recently used first
  struct Checkpoint {
    int32_t slot;
    std::list<uint64_t>::iterator pos;
  };
  std::unordered_map<uint64_t, Checkpoint> checkpoints_;
  uint64_t evictions_ = 0;
};

}  // namespace tessera
