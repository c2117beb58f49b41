#include "grammar/parser.h"

namespace tessera::grammar {

StackPool::StackPool() {
  shift_ = 64 - 10;
  slots_.assign(size_t{1} << 10, -1);
}

int32_t StackPool::get(int32_t state, int32_t parent) {
  const uint64_t k = key(state, parent);
  const size_t mask = slots_.size() - 1;
  size_t i = slot_of(k);
  while (true) {
    const int32_t id = slots_[i];
    if (id < 0) break;
    if (nodes_[id].state == state && nodes_[id].parent == parent) return id;
    i = (i + 1) & mask;
  }
  const auto id = static_cast<int32_t>(nodes_.size());
  nodes_.push_back({state, parent});
  slots_[i] = id;
  if (nodes_.size() * 2 > slots_.size()) grow();
  return id;
}

void StackPool::grow() {
  --shift_;
  slots_.assign(slots_.size() * 2, -1);
  const size_t mask = slots_.size() - 1;
  for (size_t id = 0; id < nodes_.size(); ++id) {
    size_t i = slot_of(key(nodes_[id].state, nodes_[id].parent));
    while (slots_[i] >= 0) i = (i + 1) & mask;
    slots_[i] = static_cast<int32_t>(id);
  }
}

// Linear-probing deletion with backward shift: later entries of the probe run move into the hole.
void StackPool::erase(uint64_t k) {
  const size_t mask = slots_.size() - 1;
  size_t i = slot_of(k);
  while (key(nodes_[slots_[i]].state, nodes_[slots_[i]].parent) != k) i = (i + 1) & mask;
  size_t hole = i;
  for (size_t j = (hole + 1) & mask; slots_[j] >= 0; j = (j + 1) & mask) {
    const Node& n = nodes_[slots_[j]];
    const size_t home = slot_of(key(n.state, n.parent));
    // Move j into the hole when its home is not in (hole, j] cyclically.
    const bool between = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (!between) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole] = -1;
}

void StackPool::truncate(size_t size) {
  if (size == 0 && nodes_.size() > 4096) {
    nodes_.clear();
    std::fill(slots_.begin(), slots_.end(), -1);
    return;
  }
  while (nodes_.size() > size) {
    erase(key(nodes_.back().state, nodes_.back().parent));
    nodes_.pop_back();
  }
}

void Stepper::close(int32_t node, std::vector<int32_t>& out, bool& bottom_reached) {
  work_.push_back(node);
  while (!work_.empty()) {
    const int32_t n = work_.back();
    work_.pop_back();
    if (static_cast<size_t>(n) >= stamp_.size()) stamp_.resize(pool_.size() + 1024, 0);
    if (stamp_[n] == generation_) continue;
    stamp_[n] = generation_;
    const StackPool::Node nd = pool_.node(n);
    const int32_t s = nd.state;
    if (fsm_.has_bytes(s)) out.push_back(n);
    for (uint32_t e = fsm_.ref_begin[s], end = fsm_.ref_begin[s + 1]; e < end; ++e) {
      const RefEdge ref = fsm_.ref_edges[e];
      const int32_t ret = pool_.get(ref.target, nd.parent);
      work_.push_back(pool_.get(fsm_.rule_start[ref.rule], ret));
    }
    if (fsm_.final[s]) {
      if (nd.parent < 0) {
        bottom_reached = true;
      } else {
        work_.push_back(nd.parent);
      }
    }
  }
}

void Stepper::close_one(int32_t node, std::vector<int32_t>& out, bool& bottom_reached) {
  if (++generation_ == 0) std::fill(stamp_.begin(), stamp_.end(), 0), generation_ = 1;
  out.clear();
  bottom_reached = false;
  close(node, out, bottom_reached);
}

void Stepper::step(const std::vector<int32_t>& in, uint8_t byte, std::vector<int32_t>& out, bool& bottom_reached) {
  if (++generation_ == 0) std::fill(stamp_.begin(), stamp_.end(), 0), generation_ = 1;
  out.clear();
  bottom_reached = false;
  for (int32_t n : in) {
    const StackPool::Node nd = pool_.node(n);
    const int32_t t = fsm_.next(nd.state, byte);
    if (t < 0) continue;
    close(t == nd.state ? n : pool_.get(t, nd.parent), out, bottom_reached);
  }
}

}  // namespace tessera::grammar
