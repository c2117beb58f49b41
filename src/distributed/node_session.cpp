#include "distributed/node_session.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>

#include "core/error.h"
#include "core/logging.h"

namespace tessera::dist {

namespace {

// Node rank 0 listens for the others on the master address, so it must be this host. A second
// "head" elsewhere is the sign that every node got rank 0 (a rank computed once for the whole
// job); it would only wait for nodes that never come.
void check_head_is_master(const LaunchFacts& launch, const NicChoice& nic) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(launch.master_addr.c_str(), nullptr, &hints, &res) != 0 || !res) return;  // the NIC choice said why
  std::vector<std::string> master_ips;
  for (addrinfo* a = res; a; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    const void* src = a->ai_family == AF_INET
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    if (inet_ntop(a->ai_family, src, buf, sizeof buf)) master_ips.emplace_back(buf);
  }
  freeaddrinfo(res);
  std::vector<std::string> here;
  for (const NetworkInterface& i : list_interfaces()) here.push_back(i.ip);
  for (const std::string& ip : master_ips)
    if (is_loopback_address(ip) || std::find(here.begin(), here.end(), ip) != here.end()) return;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  fail(ErrorKind::kInvalidArgument,
       "this process is node 0 of {} (the head) but the master address {} ({}{}) is not an address of this host {} "
       "({}); node 0 must run where the master address points. If every node got node rank 0, the rank was computed "
       "once for all of them (a batch script that expands $SLURM_NODEID in the batch shell): let the launcher set it "
       "in each task",
       launch.nnodes, launch.master_addr, launch.master_from.empty() ? "" : "from " + launch.master_from + ", ",
       fmt::format("{}", fmt::join(master_ips, ", ")), host, nic.ip);
}

}  // namespace

NodeSession::NodeSession(const NodeSessionOptions& o) : node_rank_(o.launch.node_rank) {
  bool single = o.launch.nnodes == 1;
  // One node: the control channel (bootstrap store) stays on loopback, whatever the NICs.
  std::string master = single && o.launch.master_addr.empty() ? "127.0.0.1" : o.launch.master_addr;
  nic_ = single && o.nic.empty() && o.node_ip_address.empty() ? NicChoice{"lo", "127.0.0.1", "single node"}
                                                              : choose_nic({master, o.nic, o.node_ip_address});
  apply_nic_env(nic_);
  if (o.launch.is_head() && !single) check_head_is_master(o.launch, nic_);

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
