// The collectives a model calls, between threads of this process on host (CPU backend)
// tensors of f32: each rank publishes its tensor, waits for the others, then reads theirs.
// The bytes each rank sends to gather are counted (the logits-gather tests read them).
#pragma once
#include <barrier>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "distributed/communicator.h"

namespace tessera::testing {

struct Rendezvous {
  explicit Rendezvous(int n) : size(n), sync(n), tensors(static_cast<size_t>(n)), gathered(static_cast<size_t>(n)) {}
  int size;
  std::barrier<> sync;
  std::vector<Tensor> tensors;
  std::vector<size_t> gathered;  // bytes each rank sent to gather since the last reset
};

class ThreadComm : public dist::Communicator {
 public:
  ThreadComm(Rendezvous& r, int rank) : r_(r) {
    info_.name = "tp";
    for (int i = 0; i < r.size; ++i) info_.world_ranks.push_back(i);
    info_.rank = rank;
  }
  const dist::GroupInfo& group() const override { return info_; }
  std::string backend() const override { return "threads"; }
  void all_reduce(const Tensor& t, dist::ReduceOp) override {
    TESSERA_CHECK(t.dtype() == DType::kF32, "ThreadComm: f32 only");
    r_.tensors[static_cast<size_t>(rank())] = t;
    r_.sync.arrive_and_wait();
    std::vector<float> sum(static_cast<size_t>(t.numel()), 0.0f);
    for (const Tensor& o : r_.tensors)
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += o.data<float>()[i];
    r_.sync.arrive_and_wait();  // everyone has read every input
    std::memcpy(t.data<float>(), sum.data(), sum.size() * 4);
  }
  void gather(const Tensor& in, const Tensor& out, int root) override {
    r_.gathered[static_cast<size_t>(rank())] += in.nbytes();
    r_.tensors[static_cast<size_t>(rank())] = in;
    r_.sync.arrive_and_wait();
    if (rank() == root)
      for (int i = 0; i < size(); ++i)
        std::memcpy(out.data<char>() + static_cast<size_t>(i) * in.nbytes(),
                    r_.tensors[static_cast<size_t>(i)].data<char>(), in.nbytes());
    r_.sync.arrive_and_wait();
  }
  void all_gather(const Tensor&, const Tensor&) override { fail(ErrorKind::kInternal, "ThreadComm: all_gather"); }
  void broadcast(const Tensor&, int) override { fail(ErrorKind::kInternal, "ThreadComm: broadcast"); }
  void send(const Tensor&, int) override { fail(ErrorKind::kInternal, "ThreadComm: send"); }
  void recv(const Tensor&, int) override { fail(ErrorKind::kInternal, "ThreadComm: recv"); }
  void barrier() override { r_.sync.arrive_and_wait(); }

 private:
  Rendezvous& r_;
  dist::GroupInfo info_;
};

}  // namespace tessera::testing
