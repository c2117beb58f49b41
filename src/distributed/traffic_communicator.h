// A decorator that counts what a communicator carries: per operation, the calls, the bytes this
// rank hands it (its input; for gather and all_gather the piece it contributes) and the seconds
// the calls took on this thread (for a stream-ordered NCCL communicator that is the enqueue, not
// the transfer). `join_process_groups` wraps every group with it when TESSERA_STEP_TIMING=1, and
// each logs its totals when the process ends; a run of a known number of steps (tessera generate
// with --ignore-eos) gives the bytes and messages of a step, which `tessera plan --link` prices
// (plan/network_cost.h).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "distributed/communicator.h"

namespace tessera::dist {

struct TrafficTotals {
  enum Op { kAllReduce, kAllGather, kGather, kBroadcast, kSend, kRecv, kBarrier, kOps };
  std::array<uint64_t, kOps> calls{};
  std::array<uint64_t, kOps> bytes{};
  std::array<double, kOps> seconds{};
  static const char* name(int op);
  // "tp0 (rank 0 of 2, nccl): 1,230 all_reduce (8.1 MB), 12 broadcast (0.1 MB); 0.84 s inside the calls"
  std::string describe(const GroupInfo& g, const std::string& backend) const;
};

class TrafficCommunicator : public Communicator {
 public:
  explicit TrafficCommunicator(std::unique_ptr<Communicator> inner);
  ~TrafficCommunicator() override;  // logs the totals when any call was made
  const TrafficTotals& totals() const { return totals_; }

  const GroupInfo& group() const override { return inner_->group(); }
  std::string backend() const override { return inner_->backend(); }
  bool stream_ordered() const override { return inner_->stream_ordered(); }
  void raise_if_failed() const override { inner_->raise_if_failed(); }
  void watch_stream(const char* what) override { inner_->watch_stream(what); }
  void all_reduce(const Tensor& tensor, ReduceOp op) override;
  void all_gather(const Tensor& input, const Tensor& output) override;
  void gather(const Tensor& input, const Tensor& output, int root) override;
  void broadcast(const Tensor& tensor, int root) override;
  void send(const Tensor& tensor, int peer) override;
  void recv(const Tensor& tensor, int peer) override;
  void barrier() override;

 private:
  template <typename F>
  void count(TrafficTotals::Op op, size_t bytes, F&& call);
  std::unique_ptr<Communicator> inner_;
  TrafficTotals totals_;
};

// `inner` wrapped when TESSERA_STEP_TIMING=1, else `inner` itself.
std::unique_ptr<Communicator> with_traffic_count(std::unique_ptr<Communicator> inner);

}  // namespace tessera::dist
