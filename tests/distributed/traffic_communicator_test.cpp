// The traffic-counting decorator (distributed/traffic_communicator.h): every call forwarded and
// counted with the bytes this rank hands it; off unless TESSERA_STEP_TIMING=1.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

#include "core/error.h"
#include "distributed/meta_communicator.h"
#include "distributed/traffic_communicator.h"

namespace tessera::dist {
namespace {

// Counts the calls it gets; throws on a send to peer 7.
class Recorder : public MetaCommunicator {
 public:
  using MetaCommunicator::MetaCommunicator;
  void all_reduce(const Tensor&, ReduceOp) override { ++calls; }
  void all_gather(const Tensor&, const Tensor&) override { ++calls; }
  void broadcast(const Tensor&, int) override { ++calls; }
  void send(const Tensor&, int peer) override {
    if (peer == 7) fail(ErrorKind::kNetwork, "peer 7 is gone");
    ++calls;
  }
  void recv(const Tensor&, int) override { ++calls; }
  int calls = 0;
};

TEST(TrafficCommunicator, ForwardsAndCountsCallsAndBytes) {
  auto inner = std::make_unique<Recorder>("tp0", 2, 1);
  Recorder* rec = inner.get();
  TrafficCommunicator c(std::move(inner));
  EXPECT_EQ(c.group().name, "tp0");
  EXPECT_EQ(c.rank(), 1);
  EXPECT_EQ(c.backend(), "meta");
  EXPECT_TRUE(c.stream_ordered());
  Tensor a = host_empty({1000}, DType::kF32), b = host_empty({300}, DType::kBF16),
         g = host_empty({2, 300}, DType::kBF16);
  c.all_reduce(a, ReduceOp::kSum);
  c.all_reduce(b, ReduceOp::kSum);
  c.all_gather(b, g);
  c.broadcast(a, 0);
  c.send(b, 0);
  c.recv(b, 0);
  EXPECT_THROW(c.send(b, 7), Error);
  EXPECT_EQ(rec->calls, 6);
  const TrafficTotals& t = c.totals();
  EXPECT_EQ(t.calls[TrafficTotals::kAllReduce], 2u);
  EXPECT_EQ(t.bytes[TrafficTotals::kAllReduce], 4000u + 600u);
  EXPECT_EQ(t.calls[TrafficTotals::kAllGather], 1u);
  EXPECT_EQ(t.bytes[TrafficTotals::kAllGather], 600u) << "the piece this rank contributes";
  EXPECT_EQ(t.calls[TrafficTotals::kBroadcast], 1u);
  EXPECT_EQ(t.calls[TrafficTotals::kSend], 1u) << "a call that threw is not counted";
  EXPECT_EQ(t.bytes[TrafficTotals::kRecv], 600u);
  EXPECT_EQ(t.calls[TrafficTotals::kGather], 0u);
  const std::string d = t.describe(c.group(), c.backend());
  EXPECT_NE(d.find("tp0 (rank 1 of 2, meta): 2 all_reduce (0.00 MB), 1 all_gather"), std::string::npos) << d;
  EXPECT_EQ(d.find(" gather ("), std::string::npos) << "no entry for an operation never called: " << d;
}

TEST(TrafficCommunicator, WrapsOnlyWithStepTiming) {
  unsetenv("TESSERA_STEP_TIMING");
  auto plain = with_traffic_count(std::make_unique<MetaCommunicator>("pp0", 2, 0));
  EXPECT_EQ(dynamic_cast<TrafficCommunicator*>(plain.get()), nullptr);
  setenv("TESSERA_STEP_TIMING", "1", 1);
  auto counted = with_traffic_count(std::make_unique<MetaCommunicator>("pp0", 2, 0));
  EXPECT_NE(dynamic_cast<TrafficCommunicator*>(counted.get()), nullptr);
  unsetenv("TESSERA_STEP_TIMING");
  EXPECT_EQ(with_traffic_count(nullptr), nullptr);
}

}  // namespace
}  // namespace tessera::dist
