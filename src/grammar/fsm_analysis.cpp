// Grammar analyses over the rule automata: live states (every state the matcher can be in can still
// complete its rule, so an accepted prefix never dead-ends), nullable rules, left recursion (a matcher over
// stacks cannot run it), reachability from the root, and the bytes that may follow each rule (used to
// settle many tokens at compile time).
#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "grammar/fsm.h"

namespace tessera::grammar {
namespace {

// Iterates `pass` (returns whether anything changed) until a fixpoint.
template <typename Pass>
void fixpoint(Pass pass) {
  while (pass()) {
  }
}

void trim_dead(Fsm& fsm, const RuleSet& rules) {
  const size_t n = fsm.num_states();
  std::vector<uint8_t> live(n, 0);
  fixpoint([&] {
    bool changed = false;
    for (size_t i = n; i-- > 0;) {
      if (live[i]) continue;
      bool ok = fsm.final[i];
      for (uint32_t e = fsm.byte_begin[i]; !ok && e < fsm.byte_begin[i + 1]; ++e) ok = live[fsm.byte_edges[e].target];
      for (uint32_t e = fsm.ref_begin[i]; !ok && e < fsm.ref_begin[i + 1]; ++e) {
        const RefEdge& r = fsm.ref_edges[e];
        ok = live[fsm.rule_start[r.rule]] && live[r.target];
      }
      if (ok) live[i] = 1, changed = true;
    }
    return changed;
  });
  if (!live[fsm.rule_start[fsm.root]]) {
    throw GrammarError(
        fmt::format("grammar matches no string (rule '{}' can never complete)", rules.rule_name(fsm.root)));
  }
  std::vector<ByteEdge> bytes;
  std::vector<RefEdge> refs;
  std::vector<uint32_t> byte_begin{0}, ref_begin{0};
  for (size_t i = 0; i < n; ++i) {
    if (live[i]) {
      for (uint32_t e = fsm.byte_begin[i]; e < fsm.byte_begin[i + 1]; ++e) {
        if (live[fsm.byte_edges[e].target]) bytes.push_back(fsm.byte_edges[e]);
      }
      for (uint32_t e = fsm.ref_begin[i]; e < fsm.ref_begin[i + 1]; ++e) {
        const RefEdge& r = fsm.ref_edges[e];
        if (live[fsm.rule_start[r.rule]] && live[r.target]) refs.push_back(r);
      }
    }
    byte_begin.push_back(static_cast<uint32_t>(bytes.size()));
    ref_begin.push_back(static_cast<uint32_t>(refs.size()));
  }
  fsm.byte_edges = std::move(bytes);
  fsm.ref_edges = std::move(refs);
  fsm.byte_begin = std::move(byte_begin);
  fsm.ref_begin = std::move(ref_begin);
}

std::vector<uint8_t> nullable_states(const Fsm& fsm) {
  const size_t n = fsm.num_states();
  std::vector<uint8_t> nullable(fsm.final.begin(), fsm.final.end());
  fixpoint([&] {
    bool changed = false;
    for (size_t i = n; i-- > 0;) {
      if (nullable[i]) continue;
      for (uint32_t e = fsm.ref_begin[i]; e < fsm.ref_begin[i + 1]; ++e) {
        const RefEdge& r = fsm.ref_edges[e];
        if (nullable[fsm.rule_start[r.rule]] && nullable[r.target]) {
          nullable[i] = 1, changed = true;
          break;
        }
      }
    }
    return changed;
  });
  return nullable;
}

// Rules a rule can call before consuming a byte; a cycle there is left recursion.
void reject_left_recursion(const Fsm& fsm, const RuleSet& rules, const std::vector<uint8_t>& nullable) {
  const size_t num_rules = fsm.rule_start.size();
  std::vector<std::vector<int>> calls(num_rules);
  std::vector<uint32_t> seen(fsm.num_states(), 0);
  for (size_t r = 0; r < num_rules; ++r) {
    if (!fsm.reachable[fsm.rule_start[r]]) continue;
    std::vector<int32_t> stack{fsm.rule_start[r]};
    seen[fsm.rule_start[r]] = static_cast<uint32_t>(r + 1);
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      for (uint32_t e = fsm.ref_begin[s]; e < fsm.ref_begin[s + 1]; ++e) {
        const RefEdge& ref = fsm.ref_edges[e];
        calls[r].push_back(ref.rule);
        if (nullable[fsm.rule_start[ref.rule]] && seen[ref.target] != r + 1) {
          seen[ref.target] = static_cast<uint32_t>(r + 1);
          stack.push_back(ref.target);
        }
      }
    }
  }
  std::vector<int> color(num_rules, 0), path;
  std::function<void(int)> visit = [&](int r) {
    color[r] = 1;
    path.push_back(r);
    for (int q : calls[r]) {
      if (color[q] == 1) {
        std::string chain;
        auto it = std::find(path.begin(), path.end(), q);
        for (; it != path.end(); ++it) chain += rules.rule_name(*it) + " -> ";
        chain += rules.rule_name(q);
        throw GrammarError(fmt::format("left recursion is not supported: {}", chain));
      }
      if (color[q] == 0) visit(q);
    }
    path.pop_back();
    color[r] = 2;
  };
  for (size_t r = 0; r < num_rules; ++r)
    if (color[r] == 0) visit(static_cast<int>(r));
}

void mark_reachable(Fsm& fsm) {
  fsm.reachable.assign(fsm.num_states(), 0);
  std::vector<int32_t> stack{fsm.rule_start[fsm.root]};
  fsm.reachable[stack[0]] = 1;
  auto push = [&](int32_t s) {
    if (!fsm.reachable[s]) fsm.reachable[s] = 1, stack.push_back(s);
  };
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    for (uint32_t e = fsm.byte_begin[s]; e < fsm.byte_begin[s + 1]; ++e) push(fsm.byte_edges[e].target);
    for (uint32_t e = fsm.ref_begin[s]; e < fsm.ref_begin[s + 1]; ++e) {
      push(fsm.ref_edges[e].target);
      push(fsm.rule_start[fsm.ref_edges[e].rule]);
    }
  }
}

void compute_follow(Fsm& fsm, const std::vector<uint8_t>& nullable) {
  const size_t n = fsm.num_states();
  std::vector<ByteSet> first(n);
  for (size_t i = 0; i < n; ++i) {
    for (uint32_t e = fsm.byte_begin[i]; e < fsm.byte_begin[i + 1]; ++e) {
      for (int b = fsm.byte_edges[e].lo; b <= fsm.byte_edges[e].hi; ++b) first[i].set(b);
    }
  }
  fixpoint([&] {
    bool changed = false;
    for (size_t i = n; i-- > 0;) {
      ByteSet f = first[i];
      for (uint32_t e = fsm.ref_begin[i]; e < fsm.ref_begin[i + 1]; ++e) {
        const RefEdge& r = fsm.ref_edges[e];
        f |= first[fsm.rule_start[r.rule]];
        if (nullable[fsm.rule_start[r.rule]]) f |= first[r.target];
      }
      if (f != first[i]) first[i] = f, changed = true;
    }
    return changed;
  });
  fsm.follow.assign(fsm.rule_start.size(), ByteSet());
  fixpoint([&] {
    bool changed = false;
    for (size_t i = 0; i < n; ++i) {
      if (!fsm.reachable[i]) continue;
      for (uint32_t e = fsm.ref_begin[i]; e < fsm.ref_begin[i + 1]; ++e) {
        const RefEdge& r = fsm.ref_edges[e];
        ByteSet f = fsm.follow[r.rule] | first[r.target];
        if (nullable[r.target]) f |= fsm.follow[fsm.state_rule[i]];
        if (f != fsm.follow[r.rule]) fsm.follow[r.rule] = f, changed = true;
      }
    }
    return changed;
  });
}

}  // namespace

void analyse_fsm(Fsm& fsm, const RuleSet& rules) {
  trim_dead(fsm, rules);
  const std::vector<uint8_t> nullable = nullable_states(fsm);
  mark_reachable(fsm);
  reject_left_recursion(fsm, rules, nullable);
  compute_follow(fsm, nullable);
}

}  // namespace tessera::grammar
