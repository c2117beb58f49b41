// Each rule as a deterministic automaton over bytes and rule references (subset construction from a
// Thompson NFA), all rules' states numbered in one space, plus the analyses the matcher relies on:
// dead states removed (every live state can still finish its rule), left recursion rejected, and for each
// rule the bytes that can follow it.
#pragma once
#include <bitset>
#include <cstdint>
#include <vector>

#include "grammar/ir.h"

namespace tessera::grammar {

struct ByteEdge {
  uint8_t lo, hi;
  int32_t target;
};

struct RefEdge {
  int32_t rule;
  int32_t target;  // the state to return to after the rule completes
};

using ByteSet = std::bitset<256>;

struct Fsm {
  int root = -1;
  std::vector<int32_t> rule_start;   // per rule
  std::vector<int32_t> state_rule;   // per state
  std::vector<uint8_t> final;        // per state: the rule may complete here
  std::vector<uint32_t> byte_begin;  // per state + 1: its edges in byte_edges, sorted by lo
  std::vector<ByteEdge> byte_edges;
  std::vector<uint32_t> ref_begin;  // per state + 1
  std::vector<RefEdge> ref_edges;
  std::vector<uint8_t> reachable;  // per state: reachable from the root's start
  std::vector<ByteSet> follow;     // per rule: bytes that may come right after it completes

  size_t num_states() const { return state_rule.size(); }
  bool has_bytes(int32_t s) const { return byte_begin[s] != byte_begin[s + 1]; }
  bool has_refs(int32_t s) const { return ref_begin[s] != ref_begin[s + 1]; }
  int32_t next(int32_t s, uint8_t b) const {
    for (uint32_t i = byte_begin[s], e = byte_begin[s + 1]; i < e; ++i) {
      const ByteEdge& edge = byte_edges[i];
      if (b < edge.lo) return -1;
      if (b <= edge.hi) return edge.target;
    }
    return -1;
  }
};

// Throws GrammarError: undefined rules, left recursion, a root that matches nothing, limits.
Fsm build_fsm(const Grammar& grammar, Budget& budget);
// The analyses (fsm_analysis.cpp): trims dead states, rejects left recursion and a root that matches
// nothing, fills reachable and follow.
void analyse_fsm(Fsm& fsm, const RuleSet& rules);

}  // namespace tessera::grammar
