// The byte-level parser over the rule automata: a set of stacks, shared as a tree of immutable nodes
// (each node = a state of one rule + the node to return to). A configuration set is kept closed: every
// node in it is at a state with byte edges; rule calls are expanded and completed rules returned from.
#pragma once
#include <cstdint>
#include <vector>

#include "grammar/fsm.h"

namespace tessera::grammar {

constexpr int32_t kRootParent = -1;     // below the root rule: completing it ends the sentence
constexpr int32_t kUnknownParent = -2;  // compile-time tables: the stack below is not known

// Hash-consed stack nodes: one id per (state, parent), so equal stacks are equal ids. truncate() drops
// the newest nodes (scratch work, rollback).
class StackPool {
 public:
  struct Node {
    int32_t state;
    int32_t parent;
  };
  StackPool();
  int32_t get(int32_t state, int32_t parent);
  const Node& node(int32_t id) const { return nodes_[id]; }
  size_t size() const { return nodes_.size(); }
  void truncate(size_t size);
  void clear() { truncate(0); }

 private:
  static uint64_t key(int32_t state, int32_t parent) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | static_cast<uint32_t>(parent);
  }
  size_t slot_of(uint64_t k) const { return (k * 0x9E3779B97F4A7C15ull) >> shift_; }
  void grow();
  void erase(uint64_t k);

  std::vector<Node> nodes_;
  std::vector<int32_t> slots_;  // open addressing (linear probing), -1 empty
  int shift_ = 0;
};

// Steps configuration sets by one byte. `bottom_reached` reports that a path completed the bottom rule
// (the root, or the rule a compile-time table starts in) after this byte.
class Stepper {
 public:
  Stepper(const Fsm& fsm, StackPool& pool) : fsm_(fsm), pool_(pool) {}
  // The closed set of one node (e.g. the root's start).
  void close_one(int32_t node, std::vector<int32_t>& out, bool& bottom_reached);
  void step(const std::vector<int32_t>& in, uint8_t byte, std::vector<int32_t>& out, bool& bottom_reached);

 private:
  void close(int32_t node, std::vector<int32_t>& out, bool& bottom_reached);
  const Fsm& fsm_;
  StackPool& pool_;
  std::vector<uint32_t> stamp_;
  std::vector<int32_t> work_;
  uint32_t generation_ = 0;
};

}  // namespace tessera::grammar
