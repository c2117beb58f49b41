#include "engine/state_slot_pool.h"

#include "core/error.h"

namespace tessera {

StateSlotPool::StateSlotPool(int num_slots) : state_(static_cast<size_t>(std::max(0, num_slots)), State::kFree) {
  for (int32_t i = num_slots - 1; i >= 0; --i) free_.push_back(i);
}

int32_t StateSlotPool::evict_lru() {
  const uint64_t h = lru_.front();
  lru_.pop_front();
  auto it = checkpoints_.find(h);
  const int32_t slot = it->second.slot;
  checkpoints_.erase(it);
  ++evictions_;
  return slot;
}

std::optional<int32_t> StateSlotPool::take_slot(State as) {
  int32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    slot = evict_lru();
  } else {
    return std::nullopt;
  }
  state_[slot] = as;
  return slot;
}

std::optional<int32_t> StateSlotPool::allocate() { return take_slot(State::kHeld); }

void StateSlotPool::release(int32_t slot) {
  TESSERA_CHECK(slot >= 0 && slot < num_slots() && state_[slot] == State::kHeld,
                "state slot {} released but not held by a sequence", slot);
  state_[slot] = State::kFree;
  free_.push_back(slot);
}

std::optional<int32_t> StateSlotPool::checkpoint(uint64_t hash) const {
  auto it = checkpoints_.find(hash);
  if (it == checkpoints_.end()) return std::nullopt;
  return it->second.slot;
}

void StateSlotPool::touch_checkpoint(uint64_t hash) {
  auto it = checkpoints_.find(hash);
  if (it == checkpoints_.end()) return;
  lru_.splice(lru_.end(), lru_, it->second.pos);
}

std::optional<int32_t> StateSlotPool::add_checkpoint(uint64_t hash) {
  if (checkpoints_.count(hash)) return std::nullopt;
  auto slot = take_slot(State::kCheckpoint);
  if (!slot) return std::nullopt;
  lru_.push_back(hash);
  checkpoints_.emplace(hash, Checkpoint{*slot, std::prev(lru_.end())});
  return slot;
}

std::optional<int32_t> StateSlotPool::move_checkpoint(uint64_t from, uint64_t to) {
  auto it = checkpoints_.find(from);
  if (it == checkpoints_.end() || checkpoints_.count(to)) return std::nullopt;
  const Checkpoint moved = it->second;
  checkpoints_.erase(it);
  lru_.erase(moved.pos);
  lru_.push_back(to);
  checkpoints_.emplace(to, Checkpoint{moved.slot, std::prev(lru_.end())});
  return moved.slot;
}

}  // namespace tessera
