#include "grammar/fsm.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace tessera::grammar {
namespace {

// A Thompson NFA for one rule: byte-range, rule-reference and epsilon edges.
struct Nfa {
  struct Range {
    uint8_t lo, hi;
    int target;
  };
  std::vector<std::vector<Range>> bytes;
  std::vector<std::vector<RefEdge>> refs;
  std::vector<std::vector<int>> eps;

  int add_state() {
    bytes.emplace_back();
    refs.emplace_back();
    eps.emplace_back();
    return static_cast<int>(bytes.size()) - 1;
  }
};

// The Aho-Corasick automaton of a set of strings over their codepoints: node 0 is the start; next[node *
// alphabet.size() + i] is the node after codepoint alphabet[i] (any other codepoint leads to node 0);
// outputs[node] lists the strings that end at that node (its own and its suffixes').
struct TriggerAutomaton {
  std::vector<uint32_t> alphabet;  // sorted
  std::vector<int> next;
  std::vector<std::vector<int>> outputs;
};

TriggerAutomaton build_trigger_automaton(const std::vector<std::string>& triggers, const CompileLimits& limits,
                                         const std::string& rule_name) {
  TriggerAutomaton ac;
  std::vector<std::map<uint32_t, int>> go(1);
  ac.outputs.resize(1);
  for (size_t t = 0; t < triggers.size(); ++t) {
    if (triggers[t].empty()) throw GrammarError(fmt::format("rule '{}': a trigger or stop string is empty", rule_name));
    int node = 0;
    for (size_t pos = 0; pos < triggers[t].size();) {
      const uint32_t c = decode_utf8(triggers[t], pos);
      ac.alphabet.push_back(c);
      auto [it, inserted] = go[node].emplace(c, static_cast<int>(go.size()));
      if (inserted) go.emplace_back(), ac.outputs.emplace_back();
      node = it->second;
    }
    ac.outputs[node].push_back(static_cast<int>(t));
  }
  std::sort(ac.alphabet.begin(), ac.alphabet.end());
  ac.alphabet.erase(std::unique(ac.alphabet.begin(), ac.alphabet.end()), ac.alphabet.end());
  const size_t width = ac.alphabet.size();
  if (go.size() * width > limits.max_states * 8) {
    throw GrammarError(
        fmt::format("rule '{}': the triggers have {} characters, {} of them distinct: too many for "
                    "the automaton limit; use fewer or shorter triggers",
                    rule_name, go.size() - 1, width));
  }
  ac.next.assign(go.size() * width, 0);
  std::vector<int> fail(go.size(), 0), order{0};
  for (size_t i = 0; i < order.size(); ++i) {  // breadth first: a node's suffix link is complete before it
    const int u = order[i];
    for (size_t c = 0; c < width; ++c) {
      auto it = go[u].find(ac.alphabet[c]);
      if (it == go[u].end()) {
        ac.next[u * width + c] = u == 0 ? 0 : ac.next[fail[u] * width + c];
        continue;
      }
      const int v = it->second;
      fail[v] = u == 0 ? 0 : ac.next[fail[u] * width + c];
      for (int t : ac.outputs[fail[v]]) ac.outputs[v].push_back(t);
      ac.next[u * width + c] = v;
      order.push_back(v);
    }
  }
  return ac;
}

class NfaBuilder {
 public:
  NfaBuilder(const RuleSet& rules, Budget& budget, size_t& total_states, const std::string& rule_name)
      : rules_(rules), budget_(budget), total_(total_states), rule_name_(rule_name) {}

  Nfa nfa;

  int state() {
    if (++total_ > budget_.limits().max_states) {
      throw GrammarError(
          fmt::format("rule '{}' needs more than {} automaton states (a large repetition bound, or a "
                      "regex that expands exponentially)",
                      rule_name_, budget_.limits().max_states));
    }
    return nfa.add_state();
  }

  void build(int expr_id, int from, int to, int depth) {
    budget_.check_depth(depth, fmt::format("rule '{}'", rule_name_));
    budget_.check_time(fmt::format("rule '{}'", rule_name_));
    const Expr& e = rules_.expr(expr_id);
    switch (e.kind) {
      case ExprKind::kEmpty:
        nfa.eps[from].push_back(to);
        return;
      case ExprKind::kBytes: {
        int cur = from;
        for (size_t i = 0; i < e.bytes.size(); ++i) {
          const int next = i + 1 == e.bytes.size() ? to : state();
          const auto b = static_cast<uint8_t>(e.bytes[i]);
          nfa.bytes[cur].push_back({b, b, next});
          cur = next;
        }
        return;
      }
      case ExprKind::kClass:
        class_paths(e.ranges, from, to);
        return;
      case ExprKind::kRuleRef:
        nfa.refs[from].push_back({e.rule, to});
        return;
      case ExprKind::kSequence: {
        int cur = from;
        for (size_t i = 0; i < e.items.size(); ++i) {
          const int next = i + 1 == e.items.size() ? to : state();
          build(e.items[i], cur, next, depth + 1);
          cur = next;
        }
        return;
      }
      case ExprKind::kChoice:
        for (int item : e.items) {
          const int s = state();
          nfa.eps[from].push_back(s);
          build(item, s, to, depth + 1);
        }
        return;
      case ExprKind::kRepeat: {
        int cur = from;
        for (int i = 0; i < e.min; ++i) {
          const int next = state();
          build(e.items[0], cur, next, depth + 1);
          cur = next;
        }
        if (e.max == kUnbounded) {
          const int loop = state(), body_end = state();
          nfa.eps[cur].push_back(loop);
          build(e.items[0], loop, body_end, depth + 1);
          nfa.eps[body_end].push_back(loop);
          nfa.eps[loop].push_back(to);
          return;
        }
        for (int i = e.min; i < e.max; ++i) {
          nfa.eps[cur].push_back(to);
          const int next = state();
          build(e.items[0], cur, next, depth + 1);
          cur = next;
        }
        nfa.eps[cur].push_back(to);
        return;
      }
      case ExprKind::kTagDispatch:
        tag_dispatch(e, from, to, depth);
        return;
    }
  }

 private:
  // Byte paths from `from` to `to` for the UTF-8 encodings of the codepoints in `ranges`.
  void class_paths(const CodepointRanges& ranges, int from, int to) {
    std::vector<ByteRangeSeq> seqs;
    for (auto [lo, hi] : ranges) utf8_sequences(lo, hi, seqs);
    for (const auto& seq : seqs) {
      int cur = from;
      for (size_t i = 0; i < seq.size(); ++i) {
        const int next = i + 1 == seq.size() ? to : state();
        nfa.bytes[cur].push_back({seq[i].first, seq[i].second, next});
        cur = next;
      }
    }
  }

  // Free text as the Aho-Corasick automaton of the triggers and stop strings (one NFA state per automaton
  // node): a node where a trigger has just occurred continues with that trigger's expression and then returns
  // to the start node (or, without loop, leaves the dispatch); a node where a stop string has just occurred
  // leaves it; without stop strings every other node may end the text.
  void tag_dispatch(const Expr& e, int from, int to, int depth) {
    std::vector<std::string> patterns = e.strings;
    patterns.insert(patterns.end(), e.stops.begin(), e.stops.end());
    const TriggerAutomaton ac = build_trigger_automaton(patterns, budget_.limits(), rule_name_);
    std::vector<int> node_state(ac.outputs.size());
    for (int& s : node_state) s = state();
    nfa.eps[from].push_back(node_state[0]);
    // After a tag without loop: the end, or (with stop strings) one of them first.
    int after = node_state[0];
    if (!e.loop) {
      after = e.stops.empty() ? to : state();
      for (const std::string& stop : e.stops) literal_path(stop, after, to);
    }
    // Codepoints in no pattern lead back to the start node from every node: one shared set of paths.
    const int others = state();
    CodepointRanges alphabet;
    for (uint32_t c : ac.alphabet) alphabet.push_back({c, c});
    class_paths(complement_ranges(alphabet), others, node_state[0]);
    const size_t num_triggers = e.strings.size();
    for (size_t u = 0; u < ac.outputs.size(); ++u) {
      budget_.check_time(fmt::format("rule '{}'", rule_name_));
      if (!ac.outputs[u].empty()) {
        for (int p : ac.outputs[u]) {
          if (static_cast<size_t>(p) < num_triggers) {
            build(e.items[p], node_state[u], after, depth + 1);
          } else {
            nfa.eps[node_state[u]].push_back(to);
          }
        }
        continue;
      }
      if (e.stops.empty()) nfa.eps[node_state[u]].push_back(to);
      nfa.eps[node_state[u]].push_back(others);
      std::map<int, CodepointRanges> by_target;
      for (size_t c = 0; c < ac.alphabet.size(); ++c)
        by_target[ac.next[u * ac.alphabet.size() + c]].push_back({ac.alphabet[c], ac.alphabet[c]});
      for (auto& [target, ranges] : by_target) class_paths(normalize_ranges(ranges), node_state[u], node_state[target]);
    }
  }

  void literal_path(const std::string& text, int from, int to) {
    int cur = from;
    for (size_t i = 0; i < text.size(); ++i) {
      const int next = i + 1 == text.size() ? to : state();
      const auto b = static_cast<uint8_t>(text[i]);
      nfa.bytes[cur].push_back({b, b, next});
      cur = next;
    }
  }

  const RuleSet& rules_;
  Budget& budget_;
  size_t& total_;
  const std::string& rule_name_;
};

struct RuleDfa {
  std::vector<std::vector<ByteEdge>> bytes;  // targets are local state ids
  std::vector<std::vector<RefEdge>> refs;
  std::vector<uint8_t> final;
};

void closure(const Nfa& nfa, std::vector<int>& set) {
  std::vector<int> stack = set;
  std::vector<char> seen(nfa.eps.size(), 0);
  for (int s : set) seen[s] = 1;
  while (!stack.empty()) {
    const int s = stack.back();
    stack.pop_back();
    for (int t : nfa.eps[s]) {
      if (!seen[t]) seen[t] = 1, set.push_back(t), stack.push_back(t);
    }
  }
  std::sort(set.begin(), set.end());
}

RuleDfa determinize(const Nfa& nfa, int start, int accept, Budget& budget, size_t& total, const std::string& name) {
  RuleDfa dfa;
  std::map<std::vector<int>, int> ids;
  std::vector<std::vector<int>> sets;
  auto intern = [&](std::vector<int> set) {
    closure(nfa, set);
    auto [it, inserted] = ids.emplace(set, static_cast<int>(sets.size()));
    if (inserted) {
      if (++total > budget.limits().max_states) {
        throw GrammarError(
            fmt::format("rule '{}' needs more than {} automaton states (a large repetition bound, or "
                        "a regex that expands exponentially)",
                        name, budget.limits().max_states));
      }
      sets.push_back(it->first);
      dfa.bytes.emplace_back();
      dfa.refs.emplace_back();
      dfa.final.push_back(std::binary_search(it->first.begin(), it->first.end(), accept));
    }
    return it->second;
  };
  intern({start});
  for (size_t d = 0; d < sets.size(); ++d) {
    budget.check_time(fmt::format("rule '{}'", name));
    const std::vector<int> set = sets[d];
    // Byte edges: split the ranges of all members into disjoint intervals.
    std::vector<int> points;
    for (int s : set) {
      for (const auto& r : nfa.bytes[s]) points.push_back(r.lo), points.push_back(r.hi + 1);
    }
    std::sort(points.begin(), points.end());
    points.erase(std::unique(points.begin(), points.end()), points.end());
    std::vector<std::vector<int>> targets(points.empty() ? 0 : points.size() - 1);
    for (int s : set) {
      for (const auto& r : nfa.bytes[s]) {
        size_t i = std::lower_bound(points.begin(), points.end(), r.lo) - points.begin();
        for (; i + 1 < points.size() && points[i] <= r.hi; ++i) targets[i].push_back(r.target);
      }
    }
    std::vector<ByteEdge> edges;
    for (size_t i = 0; i < targets.size(); ++i) {
      if (targets[i].empty()) continue;
      std::sort(targets[i].begin(), targets[i].end());
      targets[i].erase(std::unique(targets[i].begin(), targets[i].end()), targets[i].end());
      const int t = intern(targets[i]);
      const auto lo = static_cast<uint8_t>(points[i]), hi = static_cast<uint8_t>(points[i + 1] - 1);
      if (!edges.empty() && edges.back().target == t && edges.back().hi + 1 == lo) {
        edges.back().hi = hi;
      } else {
        edges.push_back({lo, hi, t});
      }
    }
    dfa.bytes[d] = std::move(edges);
    std::map<int, std::vector<int>> by_rule;
    for (int s : set)
      for (const auto& r : nfa.refs[s]) by_rule[r.rule].push_back(r.target);
    for (auto& [rule, ts] : by_rule) {
      std::sort(ts.begin(), ts.end());
      ts.erase(std::unique(ts.begin(), ts.end()), ts.end());
      const int t = intern(ts);
      dfa.refs[d].push_back({rule, t});
    }
  }
  return dfa;
}

}  // namespace

Fsm build_fsm(const Grammar& grammar, Budget& budget) {
  const RuleSet& rules = grammar.rules;
  const size_t num_rules = rules.rules().size();
  for (size_t r = 0; r < num_rules; ++r) {
    if (!rules.defined(static_cast<int>(r))) {
      throw GrammarError(fmt::format("rule '{}' is referenced but not defined", rules.rule_name(static_cast<int>(r))));
    }
  }
  if (num_rules > budget.limits().max_rules) {
    throw GrammarError(
        fmt::format("grammar has {} rules, more than the limit of {}", num_rules, budget.limits().max_rules));
  }
  Fsm fsm;
  fsm.root = grammar.root;
  size_t nfa_total = 0, dfa_total = 0;
  std::vector<RuleDfa> dfas;
  for (size_t r = 0; r < num_rules; ++r) {
    const std::string& name = rules.rule_name(static_cast<int>(r));
    NfaBuilder builder(rules, budget, nfa_total, name);
    const int start = builder.state(), accept = builder.state();
    builder.build(rules.rules()[r].body, start, accept, 0);
    dfas.push_back(determinize(builder.nfa, start, accept, budget, dfa_total, name));
  }
  // Number all states globally.
  fsm.rule_start.resize(num_rules);
  int32_t offset = 0;
  for (size_t r = 0; r < num_rules; ++r) {
    fsm.rule_start[r] = offset;
    offset += static_cast<int32_t>(dfas[r].final.size());
  }
  fsm.byte_begin.push_back(0);
  fsm.ref_begin.push_back(0);
  for (size_t r = 0; r < num_rules; ++r) {
    const int32_t base = fsm.rule_start[r];
    for (size_t s = 0; s < dfas[r].final.size(); ++s) {
      fsm.state_rule.push_back(static_cast<int32_t>(r));
      fsm.final.push_back(dfas[r].final[s]);
      for (auto e : dfas[r].bytes[s]) fsm.byte_edges.push_back({e.lo, e.hi, e.target + base});
      for (auto e : dfas[r].refs[s]) fsm.ref_edges.push_back({e.rule, e.target + base});
      fsm.byte_begin.push_back(static_cast<uint32_t>(fsm.byte_edges.size()));
      fsm.ref_begin.push_back(static_cast<uint32_t>(fsm.ref_edges.size()));
    }
  }
  analyse_fsm(fsm, rules);
  return fsm;
}

}  // namespace tessera::grammar
