#include "engine/kv_cache_manager.h"

#include <algorithm>

#include "core/error.h"

namespace tessera {

KvCacheManager::KvCacheManager(int num_blocks, int block_size, bool enable_prefix_caching, int num_state_slots,
                               int slots_per_seq)
    : block_size_(block_size),
      slots_per_seq_(std::max(1, slots_per_seq)),
      pool_(num_blocks, enable_prefix_caching),
      slots_(num_state_slots) {}

uint64_t KvCacheManager::prefix_hash(const Request& r, int num_blocks) const {
  uint64_t h = 0;
  std::vector<int32_t> tokens(static_cast<size_t>(block_size_));
  for (int b = 0; b < num_blocks; ++b) {
    for (int i = 0; i < block_size_; ++i) tokens[i] = r.token_at(b * block_size_ + i);
    h = hash_block(h, tokens.data(), block_size_);
  }
  return h;
}

std::vector<int32_t> KvCacheManager::find_cached_prefix(const Request& r, int* kv_matched_tokens) const {
  std::vector<int32_t> hits;
  const int max_blocks = (r.num_tokens() - 1) / block_size_;
  uint64_t h = 0;
  size_t with_state = 0;  // hybrid: hits up to the last checkpointed block
  std::vector<int32_t> tokens(static_cast<size_t>(block_size_));
  for (int b = 0; b < max_blocks; ++b) {
    for (int i = 0; i < block_size_; ++i) tokens[i] = r.token_at(b * block_size_ + i);
    h = hash_block(h, tokens.data(), block_size_);
    auto hit = pool_.lookup(h);
    if (!hit) break;
    hits.push_back(*hit);
    if (has_state_slots() && slots_.checkpoint(h)) with_state = hits.size();
  }
  if (kv_matched_tokens) *kv_matched_tokens = static_cast<int>(hits.size()) * block_size_;
  if (has_state_slots()) hits.resize(with_state);
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
  const bool need_slot = has_state_slots() && r.state_slot < 0;
  if (need_slot && slots_.num_available() < slots_per_seq_) return false;
  std::optional<int32_t> restore;
  uint64_t restore_hash = 0;
  if (has_state_slots() && !cached.empty()) {
    restore_hash = prefix_hash(r, static_cast<int>(cached.size()));
    restore = slots_.checkpoint(restore_hash);
    TESSERA_CHECK(restore.has_value(), "prefix hit of {} blocks without a state checkpoint", cached.size());
    // Most recently used first, so the slot taken below evicts another checkpoint (or, when
    // it is the only one, takes this one over: its state is then already in place).
    slots_.touch_checkpoint(restore_hash);
  }
  if (need_slot) r.state_slot = *slots_.allocate();
  if (restore && *restore != r.state_slot) {
    copies_.push_back(*restore);
    copies_.push_back(r.state_slot);
  }
  // (A draft slot may evict the restored checkpoint: the copy above runs before any step
  // writes a draft slot.)
  if (need_slot)
    for (int i = 1; i < slots_per_seq_; ++i) r.draft_state_slots.push_back(*slots_.allocate());
  if (!cached.empty()) {
    pool_.touch(cached);
    r.block_ids.insert(r.block_ids.end(), cached.begin(), cached.end());
    r.num_computed_tokens += cached_tokens;
  }
  auto fresh = pool_.allocate(new_blocks);
  r.block_ids.insert(r.block_ids.end(), fresh.begin(), fresh.end());
  return true;
}

int KvCacheManager::checkpoint_boundary(const Request& r) const {
  if (!has_state_slots() || !pool_.prefix_caching() || r.prompt.empty()) return 0;
  return (static_cast<int>(r.prompt.size()) - 1) / block_size_ * block_size_;
}

int KvCacheManager::next_checkpoint(const Request& r, int start) const {
  const int last = checkpoint_boundary(r);
  if (last == 0) return 0;
  if (r.shared_prefix_end > start && r.shared_prefix_end < last) return r.shared_prefix_end;
  return last > start ? last : 0;
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
  const int boundary = r.num_computed_tokens;
  const bool at_checkpoint = boundary == checkpoint_boundary(r) || boundary == r.shared_prefix_end;
  if (boundary > 0 && at_checkpoint && r.state_slot >= 0) {
    const uint64_t h = r.block_hashes[static_cast<size_t>(boundary / block_size_ - 1)];
    if (auto slot = slots_.add_checkpoint(h)) {
      copies_.push_back(r.state_slot);
      copies_.push_back(*slot);
    }
  }
}

void KvCacheManager::free(Request& r) {
  std::vector<int32_t> rev(r.block_ids.rbegin(), r.block_ids.rend());
  pool_.release(rev);
  r.block_ids.clear();
  r.block_hashes.clear();
  r.num_computed_tokens = 0;
  r.shared_prefix_end = 0;
  if (r.state_slot >= 0) slots_.release(r.state_slot);
  r.state_slot = -1;
  for (int32_t s : r.draft_state_slots) slots_.release(s);
  r.draft_state_slots.clear();
}

int32_t KvCacheManager::draft_state_slot(const Request& r, int j) const {
  TESSERA_CHECK(j >= 0 && j <= static_cast<int>(r.draft_state_slots.size()) && r.state_slot >= 0,
                "draft state slot {} of a request holding {}", j, r.draft_state_slots.size());
  return j == 0 ? r.state_slot : r.draft_state_slots[static_cast<size_t>(j - 1)];
}

void KvCacheManager::accept_draft_states(Request& r, int accepted) {
  if (accepted <= 0 || r.state_slot < 0) return;
  std::swap(r.state_slot, r.draft_state_slots.at(static_cast<size_t>(accepted - 1)));
}

std::vector<int32_t> KvCacheManager::take_state_copies() { return std::exchange(copies_, {}); }

}  // namespace tessera
