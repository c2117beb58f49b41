#include "engine/kv_cache_coordinator.h"

#include <algorithm>

#include "core/error.h"

namespace tessera {

namespace {

std::vector<CacheGroup> default_groups(int block_size, int num_state_slots) {
  std::vector<CacheGroup> groups{{{CacheGroupKind::kFullAttention, block_size, 0}, {}}};
  if (num_state_slots > 0) groups.push_back({{CacheGroupKind::kStateSlot, block_size, 0}, {}});
  return groups;
}

}  // namespace

KvCacheCoordinator::KvCacheCoordinator(int num_blocks, int block_size, bool enable_prefix_caching, int num_state_slots,
                                       int slots_per_seq)
    : KvCacheCoordinator(default_groups(block_size, num_state_slots), num_blocks, enable_prefix_caching,
                         num_state_slots, slots_per_seq) {}

KvCacheCoordinator::KvCacheCoordinator(std::vector<CacheGroup> groups, int num_blocks, bool enable_prefix_caching,
                                       int num_state_slots, int slots_per_seq)
    : groups_(std::move(groups)),
      block_size_(groups_.empty() ? 0 : groups_.front().spec.block_size),
      pool_(num_blocks, enable_prefix_caching) {
  TESSERA_CHECK(!groups_.empty() && block_size_ > 0, "a cache needs a group and a block size");
  for (size_t g = 0; g < groups_.size(); ++g) {
    const CacheGroupSpec& spec = groups_[g].spec;
    const int gi = static_cast<int>(g);
    TESSERA_CHECK(spec.block_size == block_size_, "cache group {}: block size {}, the pool's is {}", g, spec.block_size,
                  block_size_);
    TESSERA_CHECK(spec.paged() || g + 1 == groups_.size(), "cache group {}: the state group must come last", g);
    switch (spec.kind) {
      case CacheGroupKind::kFullAttention:
        managers_.push_back(std::make_unique<FullAttentionManager>(gi, spec, pool_));
        break;
      case CacheGroupKind::kSlidingWindow:
        managers_.push_back(std::make_unique<SlidingWindowManager>(gi, spec, pool_));
        break;
      case CacheGroupKind::kStateSlot: {
        auto m = std::make_unique<StateSlotManager>(gi, spec, num_state_slots, slots_per_seq, enable_prefix_caching);
        state_ = m.get();
        managers_.push_back(std::move(m));
        break;
      }
    }
  }
  TESSERA_CHECK(state_ || num_state_slots == 0, "{} state slots without a state cache group", num_state_slots);
}

const StateSlotPool& KvCacheCoordinator::state_slots() const {
  static const StateSlotPool kNone(0);
  return state_ ? state_->slots() : kNone;
}

bool KvCacheCoordinator::holds_cache(const Request& r) const {
  return std::any_of(r.cache_tables.begin(), r.cache_tables.end(),
                     [](const CacheGroupTable& t) { return !t.blocks.empty() || t.state_slot >= 0; });
}

void KvCacheCoordinator::append_block_hashes(const Request& r, int num_blocks, std::vector<uint64_t>& hashes) const {
  std::vector<int32_t> tokens(static_cast<size_t>(block_size_));
  for (int b = static_cast<int>(hashes.size()); b < num_blocks; ++b) {
    for (int i = 0; i < block_size_; ++i) tokens[static_cast<size_t>(i)] = r.token_at(b * block_size_ + i);
    hashes.push_back(hash_block(b ? hashes.back() : 0, tokens.data(), block_size_));
  }
}

int KvCacheCoordinator::common_hit(const std::vector<uint64_t>& hashes, int max_blocks, bool with_state) const {
  // Each manager answers the longest hit it can serve up to n; a window or a checkpoint can
  // make a shorter one unservable for another group, so go round until every group agrees.
  int n = max_blocks;
  for (bool changed = true; changed && n > 0;) {
    changed = false;
    for (const auto& m : managers_) {
      if (!with_state && !m->spec().paged()) continue;
      const int k = m->longest_hit(hashes, n);
      if (k < n) n = k, changed = true;
    }
  }
  return n;
}

CacheHit KvCacheCoordinator::find_cached_prefix(const Request& r) const {
  CacheHit hit;
  if (!pool_.prefix_caching()) return hit;
  std::vector<uint64_t> hashes;
  append_block_hashes(r, (r.num_tokens() - 1) / block_size_, hashes);
  const int max_blocks = static_cast<int>(hashes.size());
  const int kv = common_hit(hashes, max_blocks, false);
  const int n = state_ ? common_hit(hashes, kv, true) : kv;
  hit.kv_matched_tokens = kv * block_size_;
  hit.num_tokens = n * block_size_;
  hashes.resize(static_cast<size_t>(n));
  for (const auto& m : managers_) hit.blocks.push_back(m->hit_blocks(hashes, n));
  hit.hashes = std::move(hashes);
  return hit;
}

bool KvCacheCoordinator::allocate(Request& r, int num_new_tokens, const CacheHit& hit) {
  if (r.cache_tables.size() != managers_.size()) {
    TESSERA_CHECK(!holds_cache(r), "request {} holds cache of {} groups, this cache has {}", r.id,
                  r.cache_tables.size(), managers_.size());
    r.cache_tables.assign(managers_.size(), CacheGroupTable{});
  }
  for (const auto& m : managers_) m->remove_skipped(r);
  const int total = r.num_computed_tokens + hit.num_tokens + num_new_tokens;
  int new_blocks = 0;
  for (const auto& m : managers_) new_blocks += m->blocks_to_take(r, hit, total);
  // Cached blocks sitting in the free queue count as free until touched.
  int cached_in_free = 0;
  for (const auto& blocks : hit.blocks)
    for (int32_t b : blocks)
      if (b != kNullBlock && pool_.ref_count(b) == 0) ++cached_in_free;
  if (new_blocks > pool_.num_free() - cached_in_free) return false;
  for (const auto& m : managers_)
    if (!m->fits(r)) return false;
  for (const auto& m : managers_) m->take(r, hit, total);
  r.num_computed_tokens += hit.num_tokens;
  return true;
}

int KvCacheCoordinator::checkpoint_boundary(const Request& r) const {
  return state_ ? state_->checkpoint_boundary(r) : 0;
}

int KvCacheCoordinator::next_checkpoint(const Request& r, int start, const CacheHit& hit) const {
  return state_ ? state_->next_checkpoint(r, start, hit) : 0;
}

void KvCacheCoordinator::commit_computed(Request& r) {
  const int first_new = static_cast<int>(r.block_hashes.size());
  append_block_hashes(r, r.num_computed_tokens / block_size_, r.block_hashes);
  if (r.cache_tables.size() != managers_.size()) return;  // holds nothing (computed nothing)
  for (const auto& m : managers_) m->commit(r, first_new);
}

void KvCacheCoordinator::free(Request& r) {
  if (r.cache_tables.size() == managers_.size())
    for (const auto& m : managers_) m->free(r);
  r.cache_tables.clear();
  r.block_hashes.clear();
  r.num_computed_tokens = 0;
}

void KvCacheCoordinator::accept_drafts(Request& r, int accepted) {
  if (accepted <= 0 || r.cache_tables.size() != managers_.size()) return;
  for (const auto& m : managers_) m->accept_drafts(r, accepted);
  commit_computed(r);
}

int32_t KvCacheCoordinator::draft_state_slot(const Request& r, int j) const {
  TESSERA_CHECK(state_ && r.cache_tables.size() == managers_.size(), "draft state slot {} of a request without one", j);
  return state_->draft_state_slot(r, j);
}

std::vector<int32_t> KvCacheCoordinator::take_state_copies() {
  return state_ ? state_->take_copies() : std::vector<int32_t>{};
}

}  // namespace tessera
