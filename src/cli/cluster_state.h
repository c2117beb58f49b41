// Where a persistent cluster's head (`tessera node start --head`) can be found on its own
// machine: a small file the head writes (mode 0600: it holds the cluster token) and removes
// on exit, read by `tessera serve --distributed-executor-backend ray` and `tessera cluster
// status` on that machine, as Ray's `ray.init(address="auto")` finds its head.
// Path: $TESSERA_STATE_DIR/cluster, default /tmp/tessera-<uid>/cluster.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace tessera::cli {

struct ClusterState {
  std::string host;  // the head's control-channel address (its NIC IP)
  uint16_t port = 0;
  std::string token;
  std::string nic;  // the head's interface
  long pid = 0;     // the head process
};

std::string cluster_state_path();
// Throws Error when the file cannot be written.
void write_cluster_state(const ClusterState& s);
// nullopt when there is no file, or the process that wrote it is gone.
std::optional<ClusterState> read_cluster_state();
void remove_cluster_state();

}  // namespace tessera::cli
