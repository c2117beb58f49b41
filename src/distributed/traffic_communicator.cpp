#include "distributed/traffic_communicator.h"

#include <fmt/format.h>

#include <chrono>

#include "core/env.h"
#include "core/logging.h"

namespace tessera::dist {

const char* TrafficTotals::name(int op) {
  static const char* const kNames[kOps] = {"all_reduce", "all_gather", "gather", "broadcast",
                                           "send",       "recv",       "barrier"};
  return op >= 0 && op < kOps ? kNames[op] : "?";
}

std::string TrafficTotals::describe(const GroupInfo& g, const std::string& backend) const {
  std::string parts;
  double secs = 0;
  for (int op = 0; op < kOps; ++op) {
    secs += seconds[op];
    if (calls[op] == 0) continue;
    parts += fmt::format("{}{} {} ({:.2f} MB)", parts.empty() ? "" : ", ", calls[op], name(op), bytes[op] / 1e6);
  }
  return fmt::format("{} (rank {} of {}, {}): {}; {:.3f} s inside the calls", g.name, g.rank, g.size(), backend,
                     parts.empty() ? "no calls" : parts, secs);
}

TrafficCommunicator::TrafficCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

TrafficCommunicator::~TrafficCommunicator() {
  uint64_t calls = 0;
  for (uint64_t c : totals_.calls) calls += c;
  if (calls > 0) TLOG_INFO("Traffic of group {}", totals_.describe(inner_->group(), inner_->backend()));
}

template <typename F>
void TrafficCommunicator::count(TrafficTotals::Op op, size_t bytes, F&& call) {
  const auto start = std::chrono::steady_clock::now();
  call();  // counted only once it returned: a call that throws carried nothing countable
  totals_.seconds[op] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++totals_.calls[op];
  totals_.bytes[op] += bytes;
}

void TrafficCommunicator::all_reduce(const Tensor& tensor, ReduceOp op) {
  count(TrafficTotals::kAllReduce, tensor.nbytes(), [&] { inner_->all_reduce(tensor, op); });
}
void TrafficCommunicator::all_gather(const Tensor& input, const Tensor& output) {
  count(TrafficTotals::kAllGather, input.nbytes(), [&] { inner_->all_gather(input, output); });
}
void TrafficCommunicator::gather(const Tensor& input, const Tensor& output, int root) {
  count(TrafficTotals::kGather, input.nbytes(), [&] { inner_->gather(input, output, root); });
}
void TrafficCommunicator::broadcast(const Tensor& tensor, int root) {
  count(TrafficTotals::kBroadcast, tensor.nbytes(), [&] { inner_->broadcast(tensor, root); });
}
void TrafficCommunicator::send(const Tensor& tensor, int peer) {
  count(TrafficTotals::kSend, tensor.nbytes(), [&] { inner_->send(tensor, peer); });
}
void TrafficCommunicator::recv(const Tensor& tensor, int peer) {
  count(TrafficTotals::kRecv, tensor.nbytes(), [&] { inner_->recv(tensor, peer); });
}
void TrafficCommunicator::barrier() {
  count(TrafficTotals::kBarrier, 0, [&] { inner_->barrier(); });
}

std::unique_ptr<Communicator> with_traffic_count(std::unique_ptr<Communicator> inner) {
  if (!inner || !env_switch("TESSERA_STEP_TIMING", false)) return inner;
  return std::make_unique<TrafficCommunicator>(std::move(inner));
}

}  // namespace tessera::dist
