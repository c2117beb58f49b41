// Gloo (CPU tensors over TCP). Bootstraps through our KeyValueStore, binds its sockets to
// the chosen NIC's address only, and turns every Gloo exception into an Error naming the
// operation, the group and, when the head knows it, the peer whose process is gone.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "distributed/communicator.h"
#include "distributed/kv_store.h"
#include "distributed/process_groups.h"

namespace tessera::dist {

struct GlooOptions {
  std::shared_ptr<KeyValueStore> store;                         // usually a ControlStoreClient
  std::string ip = "127.0.0.1";                                 // this rank's NIC address (NicChoice::ip)
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};  // per operation and for the bootstrap
  RankNamer namer;                                              // optional: "rank 5 (node 1, 10.0.0.2)"
};

class GlooCommunicatorFactory : public CommunicatorFactory {
 public:
  explicit GlooCommunicatorFactory(GlooOptions options);
  // Connects the group's full mesh; throws Error naming the group ranks that never showed up.
  std::unique_ptr<Communicator> create(const GroupInfo& group) override;

 private:
  GlooOptions options_;
};

}  // namespace tessera::dist
