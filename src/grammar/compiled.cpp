#include "grammar/compiled.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <numeric>

#include "grammar/parser.h"

namespace tessera::grammar {
namespace {

std::shared_ptr<VocabIndex> build_vocab_index(const TokenizerInfo& info) {
  auto index = std::make_shared<VocabIndex>();
  const size_t width = info.vocab_size > 0 ? static_cast<size_t>(info.vocab_size) : info.token_bytes.size();
  index->mask_words = (width + 31) / 32;
  index->valid_mask.assign(index->mask_words, 0);
  index->same_bytes_next.assign(info.token_bytes.size(), -1);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < info.token_bytes.size() && i < width; ++i) {
    const bool special = i < info.special.size() && info.special[i];
    const bool stop =
        std::find(info.stop_ids.begin(), info.stop_ids.end(), static_cast<int32_t>(i)) != info.stop_ids.end();
    if (special || stop || info.token_bytes[i].empty()) continue;
    ids.push_back(static_cast<int32_t>(i));
    index->valid_mask[i / 32] |= 1u << (i % 32);
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return info.token_bytes[a] < info.token_bytes[b] || (info.token_bytes[a] == info.token_bytes[b] && a < b);
  });
  // Preorder trie: open[d] is the node at depth d + 1 on the current path.
  std::vector<int32_t> open;
  const std::string* prev = nullptr;
  int32_t prev_id = -1;
  for (int32_t id : ids) {
    const std::string& s = info.token_bytes[id];
    size_t lcp = 0;
    if (prev) {
      const size_t n = std::min(prev->size(), s.size());
      while (lcp < n && (*prev)[lcp] == s[lcp]) ++lcp;
    }
    if (prev && lcp == s.size() && lcp == prev->size()) {
      // Same bytes as the previous id: chain it.
      int32_t last = prev_id;
      while (index->same_bytes_next[last] >= 0) last = index->same_bytes_next[last];
      index->same_bytes_next[last] = id;
      index->has_duplicates[open.back()] = 1;
      continue;
    }
    while (open.size() > lcp) {
      index->end[open.back()] = static_cast<int32_t>(index->byte.size());
      open.pop_back();
    }
    for (size_t d = lcp; d < s.size(); ++d) {
      open.push_back(static_cast<int32_t>(index->byte.size()));
      index->byte.push_back(static_cast<uint8_t>(s[d]));
      index->depth.push_back(static_cast<uint16_t>(std::min<size_t>(d + 1, 65535)));
      index->end.push_back(0);
      index->token.push_back(-1);
      index->has_duplicates.push_back(0);
    }
    index->token[open.back()] = id;
    index->max_depth = std::max(index->max_depth, s.size());
    prev = &s;
    prev_id = id;
  }
  while (!open.empty()) {
    index->end[open.back()] = static_cast<int32_t>(index->byte.size());
    open.pop_back();
  }
  return index;
}

}  // namespace

std::shared_ptr<const VocabIndex> vocab_index(const std::shared_ptr<const TokenizerInfo>& tokenizer) {
  static std::mutex mutex;
  static std::vector<std::pair<std::weak_ptr<const TokenizerInfo>, std::shared_ptr<const VocabIndex>>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  std::erase_if(cache, [](const auto& entry) { return entry.first.expired(); });
  for (const auto& [owner, index] : cache) {
    if (owner.lock() == tokenizer) return index;
  }
  auto index = build_vocab_index(*tokenizer);
  cache.emplace_back(tokenizer, index);
  return index;
}

CompiledGrammar::CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenizerInfo> tokenizer,
                                 const CompileLimits& limits)
    : grammar_(std::move(grammar)), tokenizer_(std::move(tokenizer)) {
  const auto start = std::chrono::steady_clock::now();
  Budget budget(limits);
  fsm_ = grammar_->fsm ? grammar_->fsm : std::make_shared<const Fsm>(build_fsm(*grammar_, budget));
  vocab_ = vocab_index(tokenizer_);
  mask_words_ = vocab_->mask_words;
  stop_mask_.assign(mask_words_, 0);
  const size_t width = mask_words_ * 32;
  for (int32_t id : tokenizer_->stop_ids) {
    if (id >= 0 && static_cast<size_t>(id) < width && (tokenizer_->vocab_size <= 0 || id < tokenizer_->vocab_size)) {
      stop_mask_[id / 32] |= 1u << (id % 32);
      stop_ids_.push_back(id);
    }
  }
  const size_t n = fsm_->num_states();
  tables_.resize(n);
  once_ = std::make_unique<std::once_flag[]>(n);
  // Tables for the positions nearest the start first (breadth-first), while the eager time lasts.
  const auto eager_deadline = start + limits.eager_table_time;
  std::vector<uint8_t> seen(n, 0);
  std::deque<int32_t> queue{fsm_->rule_start[fsm_->root]};
  seen[queue.front()] = 1;
  while (!queue.empty()) {
    if (std::chrono::steady_clock::now() > eager_deadline) break;
    const int32_t s = queue.front();
    queue.pop_front();
    if (fsm_->has_bytes(s)) table(s), ++eager_tables_;
    auto push = [&](int32_t t) {
      if (!seen[t]) seen[t] = 1, queue.push_back(t);
    };
    for (uint32_t e = fsm_->byte_begin[s]; e < fsm_->byte_begin[s + 1]; ++e) push(fsm_->byte_edges[e].target);
    for (uint32_t e = fsm_->ref_begin[s]; e < fsm_->ref_begin[s + 1]; ++e) {
      push(fsm_->rule_start[fsm_->ref_edges[e].rule]);
      push(fsm_->ref_edges[e].target);
    }
  }
}

bool CompiledGrammar::is_stop(int32_t id) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
}

const PositionTable& CompiledGrammar::table(int32_t state) const {
  std::call_once(once_[state], [&] {
    auto t = std::make_unique<PositionTable>();
    build_table(state, *t);
    tables_[state] = std::move(t);
  });
  return *tables_[state];
}

// Walks the vocabulary trie from `state` with the stack below unknown. A token is accepted when some
// path consumes all its bytes inside the rule (or completes the rule exactly at its end); it is
// uncertain when a path completes the rule with bytes left whose next byte may follow the rule;
// otherwise rejected.
void CompiledGrammar::build_table(int32_t state, PositionTable& out) const {
  const VocabIndex& v = *vocab_;
  StackPool pool;
  Stepper stepper(*fsm_, pool);
  const size_t levels = v.max_depth + 1;
  // Per depth: a single configuration not yet in the pool (pure_state >= 0: a state with no calls and
  // no completion, the common case inside literals, strings and numbers), or a closed set in `tops`.
  std::vector<std::vector<int32_t>> tops(levels);
  std::vector<int32_t> pure_state(levels, -1), pure_parent(levels, kUnknownParent);
  std::vector<uint8_t> complete(levels, 0), inherited(levels, 0);
  pure_state[0] = state;
  const Fsm& fsm = *fsm_;
  const ByteSet& follow = fsm.follow[fsm.state_rule[state]];
  std::vector<uint32_t> accepted(mask_words_, 0);
  size_t num_accepted = 0;
  auto add_uncertain = [&](int32_t node) {
    out.uncertain.push_back(v.token[node]);
    if (v.has_duplicates[node])
      for (int32_t id = v.same_bytes_next[v.token[node]]; id >= 0; id = v.same_bytes_next[id])
        out.uncertain.push_back(id);
  };
  auto add_accepted = [&](int32_t node) {
    const int32_t first = v.token[node];
    accepted[first / 32] |= 1u << (first % 32);
    ++num_accepted;
    if (!v.has_duplicates[node]) return;
    for (int32_t id = v.same_bytes_next[first]; id >= 0; id = v.same_bytes_next[id]) {
      accepted[id / 32] |= 1u << (id % 32);
      ++num_accepted;
    }
  };
  const auto num_nodes = static_cast<int32_t>(v.byte.size());
  for (int32_t i = 0; i < num_nodes;) {
    const int d = v.depth[i];
    const uint8_t b = v.byte[i];
    std::vector<int32_t>& cur = tops[d];
    inherited[d] = inherited[d - 1] || (complete[d - 1] && follow.test(b));
    complete[d] = 0;
    pure_state[d] = -1;
    cur.clear();
    int32_t single_state = pure_state[d - 1], single_parent = pure_parent[d - 1];
    if (single_state < 0 && tops[d - 1].size() == 1) {
      const StackPool::Node& n = pool.node(tops[d - 1][0]);
      single_state = n.state, single_parent = n.parent;
    }
    if (single_state >= 0) {
      const int32_t t = fsm.next(single_state, b);
      if (t >= 0 && !fsm.has_refs(t) && !fsm.final[t]) {
        pure_state[d] = t, pure_parent[d] = single_parent;
      } else if (t >= 0) {
        bool c = false;
        stepper.close_one(pool.get(t, single_parent), cur, c);
        complete[d] = c;
      }
    } else if (!tops[d - 1].empty()) {
      bool c = false;
      stepper.step(tops[d - 1], b, cur, c);
      complete[d] = c;
    }
    const bool alive = pure_state[d] >= 0 || !cur.empty() || complete[d];
    if (!alive) {
      if (inherited[d]) {
        for (int32_t j = i; j < v.end[i]; ++j)
          if (v.token[j] >= 0) add_uncertain(j);
      }
      i = v.end[i];
      continue;
    }
    if (v.token[i] >= 0) add_accepted(i);
    ++i;
  }
  size_t valid = 0;
  for (uint32_t w : v.valid_mask) valid += static_cast<size_t>(__builtin_popcount(w));
  const size_t excluded = valid - num_accepted;
  const size_t words = mask_words_;
  if (std::min(num_accepted, excluded) > words) {
    out.kind = PositionTable::Kind::kAcceptedBits;
    out.bits = std::move(accepted);
    return;
  }
  const bool keep_accepted = num_accepted <= excluded;
  out.kind = keep_accepted ? PositionTable::Kind::kAcceptedIds : PositionTable::Kind::kExcludedIds;
  out.ids.reserve(keep_accepted ? num_accepted : excluded);
  for (size_t w = 0; w < words; ++w) {
    const uint32_t bits = keep_accepted ? accepted[w] : v.valid_mask[w] & ~accepted[w];
    for (uint32_t x = bits; x; x &= x - 1) out.ids.push_back(static_cast<int32_t>(w * 32 + __builtin_ctz(x)));
  }
}

std::shared_ptr<const CompiledGrammar> compile(std::shared_ptr<const Grammar> grammar,
                                               std::shared_ptr<const TokenizerInfo> tokenizer,
                                               const CompileLimits& limits) {
  if (!grammar || !tokenizer) throw GrammarError("compile: no grammar or no tokenizer");
  if (tokenizer->special.size() != tokenizer->token_bytes.size() && !tokenizer->special.empty()) {
    throw GrammarError("compile: TokenizerInfo::special and token_bytes differ in size");
  }
  return std::make_shared<CompiledGrammar>(std::move(grammar), std::move(tokenizer), limits);
}

}  // namespace tessera::grammar
