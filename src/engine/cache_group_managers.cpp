#include "engine/cache_group_managers.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace tessera {

// --- full attention ---

int FullAttentionManager::longest_hit(const std::vector<uint64_t>& hashes, int max_blocks) const {
  int n = 0;
  while (n < max_blocks && pool_.lookup(hashes[static_cast<size_t>(n)], group())) ++n;
  return n;
}

std::vector<int32_t> FullAttentionManager::hit_blocks(const std::vector<uint64_t>& hashes, int n) const {
  return cached_blocks(hashes, 0, n);
}

std::vector<int32_t> FullAttentionManager::cached_blocks(const std::vector<uint64_t>& hashes, int first, int n) const {
  std::vector<int32_t> blocks(static_cast<size_t>(first), kNullBlock);
  for (int b = first; b < n; ++b) {
    auto hit = pool_.lookup(hashes[static_cast<size_t>(b)], group());
    TESSERA_CHECK(hit.has_value(), "cache group {}: prefix hit of {} blocks without block {}", group(), n, b);
    blocks.push_back(*hit);
  }
  return blocks;
}

int FullAttentionManager::blocks_to_take(const Request& r, const CacheHit& hit, int total) const {
  const int need = (total + block_size() - 1) / block_size();
  const int have = static_cast<int>(table(r).blocks.size() + hit.group_blocks(group()).size());
  return std::max(0, need - have);
}

void FullAttentionManager::take(Request& r, const CacheHit& hit, int total) {
  const int fresh = blocks_to_take(r, hit, total);
  std::vector<int32_t>& blocks = table(r).blocks;
  const std::vector<int32_t>& cached = hit.group_blocks(group());
  std::vector<int32_t> held;
  for (int32_t b : cached)
    if (b != kNullBlock) held.push_back(b);
  pool_.touch(held);
  blocks.insert(blocks.end(), cached.begin(), cached.end());
  auto taken = pool_.allocate(fresh);
  blocks.insert(blocks.end(), taken.begin(), taken.end());
}

void FullAttentionManager::commit(Request& r, int first_new) {
  const std::vector<int32_t>& blocks = table(r).blocks;
  for (size_t b = static_cast<size_t>(first_new); b < r.block_hashes.size(); ++b)
    if (blocks[b] != kNullBlock) pool_.register_full_block(blocks[b], r.block_hashes[b], group());
}

void FullAttentionManager::free(Request& r) {
  // Last blocks first, so that they are evicted first and the longest prefix stays cached.
  std::vector<int32_t> rev;
  const std::vector<int32_t>& blocks = table(r).blocks;
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it)
    if (*it != kNullBlock) rev.push_back(*it);
  pool_.release(rev);
  table(r).blocks.clear();
}

// --- sliding window ---

SlidingWindowManager::SlidingWindowManager(int group, CacheGroupSpec spec, KvBlockPool& pool)
    : FullAttentionManager(group, spec, pool) {
  TESSERA_CHECK(spec.kind == CacheGroupKind::kSlidingWindow && spec.sliding_window > 0,
                "a sliding-window cache group needs a window (got {})", spec.sliding_window);
}

int SlidingWindowManager::first_needed_block(int pos) const {
  return std::max(0, pos - spec().sliding_window + 1) / block_size();
}

int SlidingWindowManager::longest_hit(const std::vector<uint64_t>& hashes, int max_blocks) const {
  // run[i]: the cached blocks in a row that end at block i.
  std::vector<int> run(static_cast<size_t>(max_blocks));
  for (int i = 0; i < max_blocks; ++i) {
    const bool cached = pool_.lookup(hashes[static_cast<size_t>(i)], group()).has_value();
    run[static_cast<size_t>(i)] = cached ? (i > 0 ? run[static_cast<size_t>(i - 1)] : 0) + 1 : 0;
  }
  for (int n = max_blocks; n > 0; --n)
    if (run[static_cast<size_t>(n - 1)] >= n - first_needed_block(n * block_size())) return n;
  return 0;
}

std::vector<int32_t> SlidingWindowManager::hit_blocks(const std::vector<uint64_t>& hashes, int n) const {
  return cached_blocks(hashes, std::min(n, first_needed_block(n * block_size())), n);
}

void SlidingWindowManager::remove_skipped(Request& r) {
  std::vector<int32_t>& blocks = table(r).blocks;
  const int first = std::min(first_needed_block(r.num_computed_tokens), static_cast<int>(blocks.size()));
  // The freed entries are a prefix of the table: walk back from the window to the last one freed.
  std::vector<int32_t> freed;  // last first, as free() gives them back
  for (int b = first - 1; b >= 0 && blocks[static_cast<size_t>(b)] != kNullBlock; --b) {
    freed.push_back(blocks[static_cast<size_t>(b)]);
    blocks[static_cast<size_t>(b)] = kNullBlock;
  }
  pool_.release(freed);
}

// --- state slots ---

StateSlotManager::StateSlotManager(int group, CacheGroupSpec spec, int num_slots, int slots_per_seq,
                                   bool prefix_caching)
    : CacheGroupManager(group, spec),
      slots_per_seq_(std::max(1, slots_per_seq)),
      prefix_caching_(prefix_caching),
      rolling_interval_(std::max(1, (spec.checkpoint_interval + spec.block_size - 1) / spec.block_size) *
                        spec.block_size),
      slots_(num_slots) {
  TESSERA_CHECK(spec.kind == CacheGroupKind::kStateSlot && num_slots > 0, "a state cache group needs slots (got {})",
                num_slots);
}

int StateSlotManager::longest_hit(const std::vector<uint64_t>& hashes, int max_blocks) const {
  for (int n = max_blocks; n > 0; --n)
    if (slots_.checkpoint(hashes[static_cast<size_t>(n - 1)])) return n;
  return 0;
}

std::vector<int32_t> StateSlotManager::hit_blocks(const std::vector<uint64_t>&, int) const { return {}; }

int StateSlotManager::blocks_to_take(const Request&, const CacheHit&, int) const { return 0; }

bool StateSlotManager::fits(const Request& r) const {
  return table(r).state_slot >= 0 || slots_.num_available() >= slots_per_seq_;
}

void StateSlotManager::take(Request& r, const CacheHit& hit, int) {
  CacheGroupTable& t = table(r);
  if (t.state_slot >= 0) return;  // a running sequence keeps its slots
  std::optional<int32_t> restore;
  if (hit.num_blocks() > 0) {
    const uint64_t h = hit.hashes.back();
    restore = slots_.checkpoint(h);
    TESSERA_CHECK(restore.has_value(), "prefix hit of {} blocks without a state checkpoint", hit.num_blocks());
    // Most recently used first, so the slot taken below evicts another checkpoint (or, when
    // it is the only one, takes this one over: its state is then already in place).
    slots_.touch_checkpoint(h);
  }
  t.state_slot = *slots_.allocate();
  if (restore && *restore != t.state_slot) {
    copies_.push_back(*restore);
    copies_.push_back(t.state_slot);
  }
  // (A draft slot may evict the restored checkpoint: the copy above runs before any step
  // writes a draft slot.)
  for (int i = 1; i < slots_per_seq_; ++i) t.draft_state_slots.push_back(*slots_.allocate());
  t.shared_prefix_end = hit.kv_matched_tokens > hit.num_tokens ? hit.kv_matched_tokens : 0;
}

int StateSlotManager::checkpoint_boundary(const Request& r) const {
  if (!prefix_caching_ || r.prompt.empty()) return 0;
  const int bs = spec().block_size;
  return (static_cast<int>(r.prompt.size()) - 1) / bs * bs;
}

int StateSlotManager::next_checkpoint(const Request& r, int start, const CacheHit& hit) const {
  const int last = checkpoint_boundary(r);
  if (last == 0) return 0;
  const bool held = static_cast<size_t>(group()) < r.cache_tables.size() && table(r).state_slot >= 0;
  const int shared = held                                     ? table(r).shared_prefix_end
                     : hit.kv_matched_tokens > hit.num_tokens ? hit.kv_matched_tokens
                                                              : 0;
  if (shared > start && shared < last) return shared;
  return last > start ? last : 0;
}

void StateSlotManager::commit(Request& r, int) {
  CacheGroupTable& t = table(r);
  const int computed = r.num_computed_tokens, bs = spec().block_size;
  const int32_t boundary_slot = std::exchange(t.boundary_state_slot, -1);
  if (!prefix_caching_ || computed <= 0 || t.state_slot < 0) return;
  const int prompt_boundary = checkpoint_boundary(r);
  if (computed == prompt_boundary || computed == t.shared_prefix_end) {
    if (auto slot = slots_.add_checkpoint(r.block_hashes[static_cast<size_t>(computed / bs - 1)])) {
      copies_.push_back(t.state_slot);
      copies_.push_back(*slot);
    }
    return;
  }
  // Past the prompt's last checkpoint (its output, or its end when that is a block boundary): the
  // rolling checkpoint follows the sequence's last full block, where a continuation of it hits.
  const int boundary = computed / bs * bs;
  if (boundary <= prompt_boundary || boundary < std::max(prompt_boundary, t.rolling_checkpoint_end) + rolling_interval_)
    return;
  const int32_t src = boundary == computed ? t.state_slot : boundary == t.boundary_state_pos ? boundary_slot : -1;
  if (src >= 0) save_rolling_checkpoint(t, boundary, r.block_hashes[static_cast<size_t>(boundary / bs - 1)], src);
}

void StateSlotManager::save_rolling_checkpoint(CacheGroupTable& t, int boundary, uint64_t hash, int32_t src) {
  std::optional<int32_t> slot;
  if (t.rolling_checkpoint_end > 0) slot = slots_.move_checkpoint(t.rolling_checkpoint_hash, hash);
  if (!slot) slot = slots_.add_checkpoint(hash);
  t.rolling_checkpoint_end = boundary;
  // (No slot: another sequence saved this block's state already, or every slot holds a sequence. An
  // earlier rolling checkpoint, if any, stays under its own hash and is moved at the next boundary.)
  if (!slot) return;
  t.rolling_checkpoint_hash = hash;
  copies_.push_back(src);
  copies_.push_back(*slot);
}

void StateSlotManager::free(Request& r) {
  CacheGroupTable& t = table(r);
  if (t.state_slot >= 0) slots_.release(t.state_slot);
  for (int32_t s : t.draft_state_slots) slots_.release(s);
  t = CacheGroupTable{};
}

int32_t StateSlotManager::draft_state_slot(const Request& r, int j) const {
  const CacheGroupTable& t = table(r);
  TESSERA_CHECK(j >= 0 && j <= static_cast<int>(t.draft_state_slots.size()) && t.state_slot >= 0,
                "draft state slot {} of a request holding {}", j, t.draft_state_slots.size());
  return j == 0 ? t.state_slot : t.draft_state_slots[static_cast<size_t>(j - 1)];
}

void StateSlotManager::accept_drafts(Request& r, int accepted) {
  CacheGroupTable& t = table(r);
  if (accepted <= 0 || t.state_slot < 0) return;
  // The state after the j-th accepted draft is in draft slot j - 1; a block boundary the drafts
  // passed without ending there keeps its slot for commit's rolling checkpoint.
  const int end = r.num_computed_tokens, start = end - accepted, boundary = end / spec().block_size * spec().block_size;
  if (prefix_caching_ && boundary > start && boundary < end) {
    t.boundary_state_slot = t.draft_state_slots.at(static_cast<size_t>(boundary - start - 1));
    t.boundary_state_pos = boundary;
  }
  std::swap(t.state_slot, t.draft_state_slots.at(static_cast<size_t>(accepted - 1)));
}

}  // namespace tessera
