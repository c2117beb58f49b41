// NCCL (CUDA tensors). Built only with TESSERA_CUDA. The unique id travels through our
// KeyValueStore (the authenticated control channel). Communicators are non-blocking
// (config.blocking = 0) so that every wait, including initialisation, is a poll with a
// deadline; on a timeout or an asynchronous error the communicator is aborted with
// ncclCommAbort, never destroyed with a blocking call. NCCL_NVLS_ENABLE=0 is forced:
// NVLink multicast is off on the machines we run on.
#pragma once
#include <chrono>
#include <memory>

#include "dist/communicator.h"
#include "dist/kv_store.h"
#include "dist/process_groups.h"

namespace tessera::dist {

struct NcclOptions {
  std::shared_ptr<KeyValueStore> store;
  int device_index = 0;  // this rank's GPU
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  RankNamer namer;
  void* stream = nullptr;  // cudaStream_t to enqueue on (the backend's); null: a stream of our own
};

class NcclCommunicatorFactory : public CommunicatorFactory {
 public:
  explicit NcclCommunicatorFactory(NcclOptions options);
  std::unique_ptr<Communicator> create(const GroupInfo& group) override;

 private:
  NcclOptions options_;
};

}  // namespace tessera::dist
