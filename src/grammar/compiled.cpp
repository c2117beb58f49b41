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
    const bool stop = std::find(info.stop_ids.begin(), info.stop_ids.end(), static_cast<int32_t>(i)) !=
                      info.stop_ids.end();
    if (special || stop || info.token_bytes[i].empty()) continue;
    ids.push_back(static_cast<int32_t>(i));
    index->valid_mask[i / 32] |= 1u << (i % 32);
  }
  std::sort(ids.begin(), ids.end(),
            [&](int32_t a, int32_t b) { return info.token_bytes[a] < info.token_bytes[b] || (info.token_bytes[a] == info.token_bytes[b] && a < b); });
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
    if (id >= 0 && static_cast<size_t>(id) < width &&
        (tokenizer_->vocab_size <= 0 || id < tokenizer_->vocab_size)) {
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
  std::vector<std::vector<int32_t>> tops(levels);
  std::vector<uint8_t> complete(levels, 0), inherited(levels, 0);
  tops[0] = {pool.get(state, kUnknownParent)};
  const ByteSet& follow = fsm_->follow[fsm_->state_rule[state]];
  std::vector<int32_t> accepted;
  auto add_ids = [&](int32_t node, std::vector<int32_t>& to) {
    for (int32_t id = v.token[node]; id >= 0; id = v.same_bytes_next[id]) to.push_back(id);
  };
  const auto num_nodes = static_cast<int32_t>(v.byte.size());
  for (int32_t i = 0; i < num_nodes;) {
    const int d = v.depth[i];
    const uint8_t b = v.byte[i];
    const std::vector<int32_t>& parent = tops[d - 1];
    std::vector<int32_t>& cur = tops[d];
    inherited[d] = inherited[d - 1] || (complete[d - 1] && follow.test(b));
    if (parent.empty()) {
      cur.clear();
      complete[d] = 0;
    } else {
      // A single node looping on this byte, with no calls or completion there, stays itself.
      const int32_t s = parent.size() == 1 ? pool.node(parent[0]).state : -1;
      if (s >= 0 && fsm_->next(s, b) == s && !fsm_->has_refs(s) && !fsm_->final[s]) {
        cur.assign(1, parent[0]);
        complete[d] = 0;
      } else {
        bool c = false;
        stepper.step(parent, b, cur, c);
        complete[d] = c;
      }
    }
    const bool alive = !cur.empty() || complete[d];
    if (!alive) {
      if (inherited[d]) {
        for (int32_t j = i; j < v.end[i]; ++j)
          if (v.token[j] >= 0) add_ids(j, out.uncertain);
      }
      i = v.end[i];
      continue;
    }
    if (v.token[i] >= 0) add_ids(i, accepted);
    ++i;
  }
  std::sort(accepted.begin(), accepted.end());
  size_t valid = 0;
  for (uint32_t w : v.valid_mask) valid += static_cast<size_t>(__builtin_popcount(w));
  const size_t excluded = valid - accepted.size();
  const size_t words = mask_words_;
  if (std::min(accepted.size(), excluded) > words) {
    out.kind = PositionTable::Kind::kAcceptedBits;
    out.bits.assign(words, 0);
    for (int32_t id : accepted) out.bits[id / 32] |= 1u << (id % 32);
  } else if (accepted.size() <= excluded) {
    out.kind = PositionTable::Kind::kAcceptedIds;
    out.ids = std::move(accepted);
  } else {
    out.kind = PositionTable::Kind::kExcludedIds;
    std::vector<uint32_t> bits = v.valid_mask;
    for (int32_t id : accepted) bits[id / 32] &= ~(1u << (id % 32));
    for (size_t w = 0; w < words; ++w) {
      for (uint32_t x = bits[w]; x; x &= x - 1) out.ids.push_back(static_cast<int32_t>(w * 32 + __builtin_ctz(x)));
    }
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
