// NCCL (CUDA tensors). Built only with TESSERA_CUDA. The unique id travels through our
// KeyValueStore (the authenticated control channel). Communicators are non-blocking
// (config.blocking = 0) so that every wait, including initialisation, is a poll with a
// deadline; on a timeout or an asynchronous error the communicator is aborted with
// ncclCommAbort, never destroyed with a blocking call. NCCL_NVLS_ENABLE=0 is forced:
// NVLink multicast is off on the machines we run on.
//
// Two modes:
// - NcclOptions::stream null: the communicator queues on a stream of its own and every call
//   waits for its result (stream_ordered() is false), with the deadline, as Gloo does.
// - NcclOptions::stream = the backend's stream: calls only enqueue on that stream and return
//   (stream_ordered() is true); kernels queued after them see the result. Liveness comes from
//   one watchdog thread per process: it records an event after each call and, when a call
//   has not completed within `timeout` of its start (counted from the later of its enqueue
//   and the latest completion of a watched call on the same stream) or NCCL reports an asynchronous
//   error, it aborts every stream-ordered NCCL communicator of the process (a rank whose data
//   plane failed is done), logs the failure naming the operation, group and peers, and every
//   later call throws Error(kNetwork) with it. After the abort the stream drains (the NCCL
//   kernels exit); if it has not drained within 10 s the watchdog ends the process (status 1).
//   While the stream is being captured into a CUDA graph, calls are enqueued (captured) but
//   not watched: the watchdog never queries a capturing stream. After launching such a graph,
//   watch_stream("...") puts the replay under the same timeout.
#pragma once
#include <chrono>
#include <memory>

#include "distributed/communicator.h"
#include "distributed/kv_store.h"
#include "distributed/process_groups.h"

namespace tessera::dist {

struct NcclOptions {
  std::shared_ptr<KeyValueStore> store;
  int device_index = 0;  // this rank's GPU
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  RankNamer namer;
  void* stream = nullptr;  // cudaStream_t to enqueue on (the backend's); null: a stream of our own
  // Stream-ordered mode only: after a failure, end the process (status 1, the failure on
  // stderr) if it is still running this long after the abort. A rank whose thread waits
  // elsewhere (on the next step plan) would otherwise never see the error. 0: never.
  std::chrono::milliseconds exit_after_failure{0};
};

class NcclCommunicatorFactory : public CommunicatorFactory {
 public:
  explicit NcclCommunicatorFactory(NcclOptions options);
  std::unique_ptr<Communicator> create(const GroupInfo& group) override;

 private:
  NcclOptions options_;
};

}  // namespace tessera::dist
