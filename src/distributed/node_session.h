// The whole node-level bring-up in one call, in the order docs/distributed.md gives:
// NIC choice (and NCCL/Gloo env vars), fingerprint, then the rendezvous, as the head
// (node rank 0) or as a worker. What the engine's launcher calls before it starts the
// node's rank processes; each rank process then opens its own ControlStoreClient to `head`.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/connect.h"
#include "distributed/fingerprint.h"
#include "distributed/launch_env.h"
#include "distributed/nic.h"
#include "distributed/rendezvous_client.h"
#include "distributed/rendezvous_server.h"

namespace tessera::dist {

struct NodeSessionOptions {
  LaunchFacts launch;             // from resolve_launch
  std::string nic;                // --nic (NCCL_SOCKET_IFNAME syntax); empty = automatic
  std::string node_ip_address;    // --node-ip-address
  std::string token;              // --cluster-token / TESSERA_CLUSTER_TOKEN
  std::string model_dir;          // fingerprinted; empty = version-only fingerprint
  std::string dtype;              // --dtype when given (overrides config.json's)
  int local_ranks = 1;            // rank processes this node will run
  std::vector<std::string> gpus;  // this node's GPU names (empty on CPU)
  std::chrono::milliseconds join_timeout{std::chrono::seconds(300)};
  std::chrono::milliseconds heartbeat_interval{std::chrono::seconds(1)};
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(10)};
};

class NodeSession {
 public:
  // Throws Error with the user-facing reason (wrong NIC, refused fingerprint, timeout...).
  explicit NodeSession(const NodeSessionOptions& options);

  const NicChoice& nic() const { return nic_; }
  const NodeFingerprint& fingerprint() const { return fingerprint_; }
  const ClusterTable& cluster() const { return cluster_; }
  const HeadAddress& head() const { return head_; }  // for the ranks' ControlStoreClient
  int node_rank() const { return node_rank_; }
  int first_rank() const;  // this node's first world rank
  RankNamer rank_namer() const;
  bool is_head() const { return server_ != nullptr; }
  RendezvousServer* server() { return server_.get(); }  // head only
  RendezvousClient* client() { return client_.get(); }  // workers only

 private:
  NicChoice nic_;
  NodeFingerprint fingerprint_;
  ClusterTable cluster_;
  HeadAddress head_;
  int node_rank_ = 0;
  std::unique_ptr<RendezvousServer> server_;
  std::unique_ptr<RendezvousClient> client_;
};

}  // namespace tessera::dist
