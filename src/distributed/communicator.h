// The data plane: collectives and point-to-point transfers over tessera::Tensor buffers
// among the ranks of one group (the world, a TP group or a PP group).
//
// Contract (see docs/distributed.md):
// - Every rank of a group calls the same collectives in the same order (SPMD).
// - Calls are blocking: when one returns, the tensor holds the result. NCCL ops are
//   enqueued on the communicator's stream and waited for with the same deadline; except
//   when stream_ordered() (NCCL on the backend's stream): then a call returns once enqueued,
//   its deadline is enforced by a watchdog, and a failure surfaces in raise_if_failed() and
//   the next call.
// - Every call is bounded by `timeout`. On a timeout, a dead peer or a cut link the call
//   throws Error(kNetwork) naming the operation, the group and the peer ranks at fault
//   when they can be told; after that the communicator is broken and every later call
//   throws the same error at once (a failed collective cannot be resumed).
// - A communicator is used by one thread at a time (the rank's executor thread).
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tessera::dist {

enum class ReduceOp { kSum };

// Identity of a group inside the world.
struct GroupInfo {
  std::string name;              // "world", "tp0", "pp1": unique per group in the world
  std::vector<int> world_ranks;  // world rank of each group rank, in group-rank order
  int rank = 0;                  // this process's rank inside the group
  int size() const { return static_cast<int>(world_ranks.size()); }
};

// world rank -> "rank 5 (node 1, 10.0.0.2)"; defaults to "rank 5".
using RankNamer = std::function<std::string(int world_rank)>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual const GroupInfo& group() const = 0;
  int rank() const { return group().rank; }
  int size() const { return group().size(); }
  virtual std::string backend() const = 0;  // "gloo", "nccl"
  // True when calls take tensors on the rank's GPU and are ordered on the backend's stream
  // (NCCL built with NcclOptions::stream): the caller need not synchronize the backend
  // first, and a call may return before the data has arrived (later work on that stream
  // sees it). False: host-visible tensors, the call returns with the result (Gloo).
  virtual bool stream_ordered() const { return false; }
  // A stream-ordered communicator fails asynchronously (its watchdog aborts it when a call
  // times out or NCCL reports an error, and the stream then drains with unfinished data):
  // after synchronizing the stream, call this before trusting what the collectives produced
  // (e.g. logits copied to the host); it throws the failure as Error(kNetwork). No-op for
  // the others, whose calls throw themselves.
  virtual void raise_if_failed() const {}
  // Stream-ordered communicators: puts the work queued on the stream so far under the
  // watchdog's timeout as if it were one call named `what`. Calls captured into a CUDA graph
  // are not watched when they are captured; call this after launching the graph (e.g.
  // watch_stream("decode graph replay")) so that a peer stuck during a replay still ends in
  // an abort and an error. No-op for the others and while the stream is being captured.
  // Wrappers (e.g. the custom all-reduce decorator) must forward it.
  virtual void watch_stream(const char* what) { (void)what; }

  // In place, every rank ends with the elementwise sum. f32 and bf16 (bf16 is summed in
  // f32 per pair and rounded, as NCCL does).
  virtual void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum) = 0;
  // output = concat over group ranks of each rank's input, along dimension 0
  // (output.nbytes() == size() * input.nbytes()).
  virtual void all_gather(const Tensor& input, const Tensor& output) = 0;
  // Like all_gather, but only `root` receives; other ranks may pass an undefined output.
  virtual void gather(const Tensor& input, const Tensor& output, int root) = 0;
  // In place from `root` to every rank.
  virtual void broadcast(const Tensor& tensor, int root) = 0;
  // Point-to-point (pipeline stages). Sends and receives between two ranks match in order.
  virtual void send(const Tensor& tensor, int peer) = 0;
  virtual void recv(const Tensor& tensor, int peer) = 0;
  virtual void barrier() = 0;
};

}  // namespace tessera::dist
