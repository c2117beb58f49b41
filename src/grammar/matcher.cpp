// Matcher: the closed configuration set of one sequence, its per-token history for rollback, and the
// mask: per configuration, the position table's accepted tokens plus its uncertain tokens checked
// against the real stack (walked in byte order so that shared prefixes are stepped once).
#include <algorithm>
#include <deque>
#include <stdexcept>
#include <unordered_map>

#include "grammar/compiled.h"
#include "grammar/parser.h"

namespace tessera::grammar {

namespace {
constexpr size_t kMaxHistory = 64;     // tokens that rollback can undo
constexpr size_t kMaxCachedTops = 64;  // configurations whose uncertain tokens are remembered
constexpr size_t kMaxCachedMasks = 4;  // configuration sets whose whole mask is remembered
}  // namespace

struct Matcher::Impl {
  struct Snapshot {
    std::vector<int32_t> tops;
    bool complete = false;
    bool terminated = false;
    size_t pool_size = 0;
  };

  explicit Impl(std::shared_ptr<const CompiledGrammar> g) : grammar(std::move(g)), stepper(grammar->fsm(), pool) {
    reset();
  }

  void reset() {
    pool.clear();
    history.clear();
    uncertain_cache.clear();
    mask_cache.clear();
    next_cached_mask = 0;
    terminated = false;
    const Fsm& fsm = grammar->fsm();
    stepper.close_one(pool.get(fsm.rule_start[fsm.root], kRootParent), tops, complete);
  }

  Snapshot snapshot() const { return {tops, complete, terminated, pool.size()}; }

  void push_history(Snapshot s) {
    history.push_back(std::move(s));
    if (history.size() > kMaxHistory) history.pop_front();
  }

  // Steps through `bytes`; on failure the state (and pool) is as before.
  bool advance(std::string_view bytes) {
    if (terminated || bytes.empty()) return false;
    const size_t pool_size = pool.size();
    std::vector<int32_t> cur = tops, next;
    bool done = false;
    for (char c : bytes) {
      if (cur.empty()) {
        pool.truncate(pool_size);
        return false;
      }
      stepper.step(cur, static_cast<uint8_t>(c), next, done);
      if (next.empty() && !done) {
        pool.truncate(pool_size);
        return false;
      }
      cur.swap(next);
    }
    tops = std::move(cur);
    complete = done;
    return true;
  }

  // Uncertain tokens of `top`'s position that the real stack accepts.
  const std::vector<int32_t>& resolve(int32_t top, const PositionTable& table) {
    auto it = uncertain_cache.find(top);
    if (it != uncertain_cache.end()) return it->second;
    if (uncertain_cache.size() >= kMaxCachedTops) uncertain_cache.clear();
    std::vector<int32_t>& accepted = uncertain_cache[top];
    const TokenizerInfo& info = grammar->tokenizer();
    const size_t pool_size = pool.size();
    if (levels.size() < grammar->vocab().max_depth + 1) levels.resize(grammar->vocab().max_depth + 1);
    levels[0].tops = {top};
    levels[0].complete = false;
    size_t valid = 0;  // levels[0..valid] hold the prefix of `prev`
    const std::string* prev = nullptr;
    for (int32_t id : table.uncertain) {
      const std::string& s = info.token_bytes[id];
      size_t d = 0;
      if (prev) {
        const size_t n = std::min({prev->size(), s.size(), valid});
        while (d < n && (*prev)[d] == s[d]) ++d;
      }
      bool alive = true;
      for (; d < s.size(); ++d) {
        Level& from = levels[d];
        Level& to = levels[d + 1];
        if (from.tops.empty()) {
          alive = false;
          break;
        }
        stepper.step(from.tops, static_cast<uint8_t>(s[d]), to.tops, to.complete);
        valid = d + 1;
        if (to.tops.empty() && !to.complete) {
          alive = false;
          break;
        }
      }
      if (alive && d == s.size()) alive = !levels[d].tops.empty() || levels[d].complete;
      if (alive) accepted.push_back(id);
      prev = &s;
    }
    pool.truncate(pool_size);
    return accepted;
  }

  // The mask of the current configurations into mask[0, words): the first configuration's table is
  // written (not OR-ed into zeros), the others OR-ed in, then the uncertain tokens and the stop ids.
  void compute(std::span<uint32_t> mask, size_t words) {
    const VocabIndex& v = grammar->vocab();
    bool first = true;
    for (int32_t top : tops) {
      const PositionTable& t = grammar->table(pool.node(top).state);
      switch (t.kind) {
        case PositionTable::Kind::kAcceptedIds:
          if (first) std::fill_n(mask.begin(), words, 0u);
          for (int32_t id : t.ids) mask[id / 32] |= 1u << (id % 32);
          break;
        case PositionTable::Kind::kAcceptedBits:
          if (first) {
            std::copy_n(t.bits.begin(), words, mask.begin());
          } else {
            for (size_t w = 0; w < words; ++w) mask[w] |= t.bits[w];
          }
          break;
        case PositionTable::Kind::kExcludedIds:
          if (first) {
            std::copy_n(v.valid_mask.begin(), words, mask.begin());
            for (int32_t id : t.ids) mask[id / 32] &= ~(1u << (id % 32));
          } else {
            scratch.assign(v.valid_mask.begin(), v.valid_mask.end());
            for (int32_t id : t.ids) scratch[id / 32] &= ~(1u << (id % 32));
            for (size_t w = 0; w < words; ++w) mask[w] |= scratch[w];
          }
          break;
      }
      first = false;
    }
    if (first) std::fill_n(mask.begin(), words, 0u);
    for (int32_t top : tops) {
      const PositionTable& t = grammar->table(pool.node(top).state);
      if (t.uncertain.empty()) continue;
      for (int32_t id : resolve(top, t)) mask[id / 32] |= 1u << (id % 32);
    }
    if (complete) {
      const auto& stop = grammar->stop_mask();
      for (size_t w = 0; w < words; ++w) mask[w] |= stop[w];
    }
  }

  void fill(std::span<uint32_t> mask) {
    const size_t words = grammar->mask_words();
    if (mask.size() < words) {
      std::fill(mask.begin(), mask.end(), 0u);
      throw std::invalid_argument("fill_next_token_bitmask: mask has fewer words than mask_words()");
    }
    std::fill(mask.begin() + static_cast<std::ptrdiff_t>(words), mask.end(), 0u);
    if (terminated) {
      std::copy_n(grammar->stop_mask().begin(), words, mask.begin());
      return;
    }
    for (const CachedMask& c : mask_cache) {
      if (c.complete == complete && c.tops == tops) {
        std::copy_n(c.bits.begin(), words, mask.begin());
        return;
      }
    }
    compute(mask, words);
    if (mask_cache.size() < kMaxCachedMasks) {
      mask_cache.emplace_back();
      next_cached_mask = mask_cache.size() - 1;
    }
    CachedMask& c = mask_cache[next_cached_mask];
    next_cached_mask = (next_cached_mask + 1) % kMaxCachedMasks;
    c.tops = tops;
    c.complete = complete;
    c.bits.assign(mask.begin(), mask.begin() + static_cast<std::ptrdiff_t>(words));
  }

  // After pool.truncate(size): cached results keyed by nodes that no longer exist are dropped (their ids
  // will name other stacks); the others still hold.
  void drop_cached_from(size_t size) {
    const auto gone = [size](int32_t top) { return static_cast<size_t>(top) >= size; };
    std::erase_if(mask_cache, [&](const CachedMask& c) { return std::any_of(c.tops.begin(), c.tops.end(), gone); });
    if (next_cached_mask > mask_cache.size()) next_cached_mask = mask_cache.size();
    if (next_cached_mask == kMaxCachedMasks) next_cached_mask = 0;
    std::erase_if(uncertain_cache, [&](const auto& entry) { return gone(entry.first); });
  }

  // A configuration set's whole mask (stop ids included), so that a repeated set (the inside of a
  // string, a number's digits) costs one copy.
  struct CachedMask {
    std::vector<int32_t> tops;
    bool complete = false;
    std::vector<uint32_t> bits;
  };

  struct Level {
    std::vector<int32_t> tops;
    bool complete = false;
  };

  std::shared_ptr<const CompiledGrammar> grammar;
  StackPool pool;
  Stepper stepper;
  std::vector<int32_t> tops;
  bool complete = false;  // the root rule can end here
  bool terminated = false;
  std::deque<Snapshot> history;
  std::unordered_map<int32_t, std::vector<int32_t>> uncertain_cache;
  std::vector<Level> levels;
  std::vector<uint32_t> scratch;
  std::vector<CachedMask> mask_cache;
  size_t next_cached_mask = 0;  // the entry replaced next once the cache is full
};

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar) {
  if (!grammar) throw std::invalid_argument("Matcher: no compiled grammar");
  impl_ = std::make_unique<Impl>(std::move(grammar));
}
Matcher::~Matcher() = default;
Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;

size_t Matcher::mask_words() const { return impl_->grammar->mask_words(); }

void Matcher::fill_next_token_bitmask(std::span<uint32_t> mask) const { impl_->fill(mask); }

bool Matcher::accept_token(int32_t id) {
  Impl& m = *impl_;
  const TokenizerInfo& info = m.grammar->tokenizer();
  if (m.terminated || id < 0 || static_cast<size_t>(id) >= m.grammar->mask_words() * 32) return false;
  if (info.vocab_size > 0 && id >= info.vocab_size) return false;
  if (m.grammar->is_stop(id)) {
    if (!m.complete) return false;
    m.push_history(m.snapshot());
    m.terminated = true;
    return true;
  }
  if (static_cast<size_t>(id) >= info.token_bytes.size()) return false;
  if (id < static_cast<int32_t>(info.special.size()) && info.special[id]) return false;
  Impl::Snapshot before = m.snapshot();
  if (!m.advance(info.token_bytes[id])) return false;
  m.push_history(std::move(before));
  return true;
}

bool Matcher::accept_bytes(std::string_view bytes) {
  Impl& m = *impl_;
  Impl::Snapshot before = m.snapshot();
  if (!m.advance(bytes)) return false;
  m.push_history(std::move(before));
  return true;
}

bool Matcher::can_terminate() const { return impl_->complete && !impl_->terminated; }

bool Matcher::is_terminated() const { return impl_->terminated || (impl_->complete && impl_->tops.empty()); }

void Matcher::rollback(int num_tokens) {
  Impl& m = *impl_;
  if (num_tokens < 0 || static_cast<size_t>(num_tokens) > m.history.size()) {
    throw std::out_of_range("Matcher::rollback: more tokens than the kept history (64)");
  }
  if (num_tokens == 0) return;
  for (int i = 1; i < num_tokens; ++i) m.history.pop_back();
  Impl::Snapshot s = std::move(m.history.back());
  m.history.pop_back();
  m.tops = std::move(s.tops);
  m.complete = s.complete;
  m.terminated = s.terminated;
  m.pool.truncate(s.pool_size);
  m.drop_cached_from(s.pool_size);
}

void Matcher::reset() { impl_->reset(); }

}  // namespace tessera::grammar
