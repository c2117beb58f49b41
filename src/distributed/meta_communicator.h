// A communicator whose collectives do nothing, for a group of the right size and rank: what the
// planner hands a sharded model when it runs a step on the meta backend to measure activations
// (never to compute anything), and what tests use where only the group matters.
#pragma once
#include <string>
#include <utility>

#include "distributed/communicator.h"

namespace tessera::dist {

class MetaCommunicator : public Communicator {
 public:
  explicit MetaCommunicator(GroupInfo group) : info_(std::move(group)) {}
  // Group `name` of `size` ranks (world ranks 0..size-1), this process being `rank`.
  MetaCommunicator(std::string name, int size, int rank) {
    info_.name = std::move(name);
    for (int i = 0; i < size; ++i) info_.world_ranks.push_back(i);
    info_.rank = rank;
  }
  const GroupInfo& group() const override { return info_; }
  std::string backend() const override { return "meta"; }
  bool stream_ordered() const override { return true; }
  void all_reduce(const Tensor&, ReduceOp) override {}
  void all_gather(const Tensor&, const Tensor&) override {}
  void gather(const Tensor&, const Tensor&, int) override {}
  void broadcast(const Tensor&, int) override {}
  void send(const Tensor&, int) override {}
  void recv(const Tensor&, int) override {}
  void barrier() override {}

 private:
  GroupInfo info_;
};

}  // namespace tessera::dist
