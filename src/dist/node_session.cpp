#include "dist/node_session.h"

#include <unistd.h>

#include "core/error.h"
#include "core/logging.h"

namespace tessera::dist {

NodeSession::NodeSession(const NodeSessionOptions& o) : node_rank_(o.launch.node_rank) {
  bool single = o.launch.nnodes == 1;
  // One node: the control channel (bootstrap store) stays on loopback, whatever the NICs.
  std::string master = single && o.launch.master_addr.empty() ? "127.0.0.1" : o.launch.master_addr;
  nic_ = single && o.nic.empty() && o.node_ip_address.empty() ? NicChoice{"lo", "127.0.0.1", "single node"}
                                                              : choose_nic({master, o.nic, o.node_ip_address});
  apply_nic_env(nic_);

  fingerprint_ = o.model_dir.empty() ? NodeFingerprint{} : compute_fingerprint(o.model_dir);
  if (o.model_dir.empty()) fingerprint_.version = this_version();
  if (!o.dtype.empty()) fingerprint_.dtype = o.dtype;
  fingerprint_.gpus = o.gpus;
  fingerprint_.num_ranks = o.local_ranks;
  fingerprint_.nic = nic_.interface_name;
  fingerprint_.ip = nic_.ip;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  fingerprint_.hostname = host;

  head_ = {single ? nic_.ip : master, static_cast<uint16_t>(o.launch.master_port), o.token, nic_.ip};
  if (o.launch.is_head()) {
    RendezvousServerOptions so;
    so.bind_ip = nic_.ip;
    so.port = static_cast<uint16_t>(o.launch.master_port);
    so.token = o.token;
    so.nnodes = o.launch.nnodes;
    so.head_fingerprint = fingerprint_;
    so.join_timeout = o.join_timeout;
    so.heartbeat_timeout = o.heartbeat_timeout;
    server_ = std::make_unique<RendezvousServer>(so);
    cluster_ = server_->wait_for_nodes();
  } else {
    RendezvousClientOptions co;
    co.head = head_;
    co.node_rank = o.launch.node_rank;
    co.nnodes = o.launch.nnodes;
    co.fingerprint = fingerprint_;
    co.join_timeout = o.join_timeout;
    co.heartbeat_interval = o.heartbeat_interval;
    co.heartbeat_timeout = o.heartbeat_timeout;
    client_ = std::make_unique<RendezvousClient>(co);
    cluster_ = client_->cluster();
  }
  TLOG_INFO("node {} of {}: NIC {} ({}), world ranks {}..{} of {}", node_rank_, o.launch.nnodes, nic_.interface_name,
            nic_.ip, first_rank(), first_rank() + o.local_ranks - 1, cluster_.world_size);
}

int NodeSession::first_rank() const {
  for (const ClusterNode& n : cluster_.nodes)
    if (n.node_rank == node_rank_) return n.first_rank;
  return 0;
}

RankNamer NodeSession::rank_namer() const {
  ClusterTable table = cluster_;
  return [table](int rank) { return table.describe_rank(rank); };
}

}  // namespace tessera::dist
