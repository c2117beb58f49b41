// A Communicator decorator that sends small all-reduces of a stream-ordered (NCCL) TP group
// to the custom all-reduce (src/backend/cuda/custom_all_reduce.h: one kernel over CUDA IPC
// buffers, as vLLM's custom_all_reduce) and everything else to the wrapped communicator.
//
//   auto tp = factory.create(layout.tp_group(rank));              // NcclCommunicator on the backend stream
//   tp = with_custom_all_reduce(std::move(tp), {.disable = disable_custom_all_reduce, .store = store,
//                                               .device_index = gpu, .stream = backend_stream,
//                                               .timeout = timeout});
//
// with_custom_all_reduce is collective over the group (every rank calls it at the same point,
// after the group's creation): it returns the inner communicator unchanged on every rank when
// the feature is disabled, the group is not stream-ordered or has one rank, its ranks span job
// nodes or NCCL_P2P_DISABLE is set (custom_all_reduce_off_reason, dist/node_locality.h), it is
// not built (CPU build), or any rank cannot use it (no P2P, IPC failure...). Group rank 0 logs
// why it is off ("custom all-reduce off on group tp0: its ranks span nodes").
//
// The decorator is used like the communicator it wraps (one thread, SPMD order). all_reduce
// goes to the custom kernel when the tensor is a CUDA f32/bf16 tensor of at most the policy's
// size (default 8 MiB); it is queued on `stream`, which must be the stream the inner
// communicator enqueues on (NcclOptions::stream), so the two paths stay ordered. Not
// thread-safe, like every Communicator.
//
// Layering: tessera_dist links tessera_custom_all_reduce (a leaf library under
// src/backend/cuda on core, cudart and this header's interfaces) in CUDA builds; it defines
// make_device_all_reduce, and no file of this layer includes a CUDA header.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/kv_store.h"

namespace tessera::dist {

// What the decorator needs from the fast path (the CUDA implementation adapts
// CustomAllReduce; tests substitute a fake).
class InPlaceAllReduce {
 public:
  virtual ~InPlaceAllReduce() = default;
  // True when a tensor of this dtype and size should take the fast path.
  virtual bool should_use(DType dtype, size_t bytes) const = 0;
  // In place on the stream fixed at creation; stream-ordered (returns before the data is there).
  virtual void all_reduce(void* data, DType dtype, int64_t n) = 0;
  virtual std::string describe() const = 0;
  // Set once a kernel gave up waiting for a peer (the CUDA context is then unusable).
  virtual std::optional<std::string> failure() const { return std::nullopt; }
};

class CustomAllReduceCommunicator : public Communicator {
 public:
  CustomAllReduceCommunicator(std::unique_ptr<Communicator> inner, std::unique_ptr<InPlaceAllReduce> fast);

  const GroupInfo& group() const override { return inner_->group(); }
  std::string backend() const override { return inner_->backend(); }
  bool stream_ordered() const override { return inner_->stream_ordered(); }
  // The custom kernel's failure (a peer that never arrived) first, then the inner one's.
  void raise_if_failed() const override;
  void watch_stream(const char* what) override { inner_->watch_stream(what); }

  void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum) override;
  void all_gather(const Tensor& input, const Tensor& output) override { inner_->all_gather(input, output); }
  void gather(const Tensor& input, const Tensor& output, int root) override { inner_->gather(input, output, root); }
  void broadcast(const Tensor& tensor, int root) override { inner_->broadcast(tensor, root); }
  void send(const Tensor& tensor, int peer) override { inner_->send(tensor, peer); }
  void recv(const Tensor& tensor, int peer) override { inner_->recv(tensor, peer); }
  void barrier() override { inner_->barrier(); }

  Communicator& inner() { return *inner_; }
  const InPlaceAllReduce& fast() const { return *fast_; }
  // Calls that took each path (for logs and tests).
  int64_t fast_calls() const { return fast_calls_; }
  int64_t inner_calls() const { return inner_calls_; }

 private:
  std::unique_ptr<Communicator> inner_;
  std::unique_ptr<InPlaceAllReduce> fast_;
  int64_t fast_calls_ = 0;
  int64_t inner_calls_ = 0;
};

using AllGatherBytes = std::function<std::vector<std::vector<uint8_t>>(const std::vector<uint8_t>&)>;

// An all-gather of byte strings among a group's ranks through the bootstrap store: each call
// sets "<prefix>/<call>/<rank>" and waits (up to `timeout`) for every rank's key. Every rank
// must make the same calls in the same order; `prefix` must be unique per use in the job.
AllGatherBytes store_all_gather(std::shared_ptr<KeyValueStore> store, const GroupInfo& group, std::string prefix,
                                std::chrono::milliseconds timeout, RankNamer namer = {});

struct CustomAllReduceConfig {
  bool disable = false;                  // --disable-custom-all-reduce
  std::shared_ptr<KeyValueStore> store;  // for the IPC handle exchange (the NCCL factory's store)
  AllGatherBytes all_gather;             // instead of the store, e.g. over a Gloo group of the same ranks
  int device_index = 0;                  // this rank's GPU (NcclOptions::device_index)
  void* stream = nullptr;                // cudaStream_t: the inner communicator's (NcclOptions::stream)
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};  // handle exchange, and a barrier's wait in the kernel
  size_t max_bytes = size_t{8} << 20;                           // larger all-reduces go to the inner communicator
  size_t one_shot_max_bytes = 0;                                // 0: by world size (see CarPolicy)
  RankNamer namer;
  // Where the group's ranks are: `ranks_per_node` consecutive world ranks on each job node (0:
  // every rank on this node), and NCCL_P2P_DISABLE's value (nullopt: unset). The fast path is
  // tried only when every rank of the group is on this node and the variable is not true.
  int ranks_per_node = 0;
  std::optional<std::string> nccl_p2p_disable;
};

// True when this build has the custom all-reduce (TESSERA_CUDA).
bool custom_all_reduce_built();

// The device fast path for `group` (collective: every rank of the group calls it), or null on
// every rank where any rank cannot use it (no P2P, an IPC failure: the reason is logged).
// Defined by the CUDA build's custom all-reduce library (src/backend/cuda/
// custom_all_reduce_path.cpp), so this layer names no CUDA type; with_custom_all_reduce calls it.
std::unique_ptr<InPlaceAllReduce> make_device_all_reduce(const GroupInfo& group, const CustomAllReduceConfig& config,
                                                         const AllGatherBytes& all_gather);

// See the top of this file. Collective over inner's group.
std::unique_ptr<Communicator> with_custom_all_reduce(std::unique_ptr<Communicator> inner,
                                                     const CustomAllReduceConfig& config);

}  // namespace tessera::dist
