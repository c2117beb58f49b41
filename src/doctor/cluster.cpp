// run_doctor: one node by itself, or every node of a cluster meeting through the doctor's own
// rendezvous, exchanging facts and probe results through the head's store.
#include <map>
#include <memory>
#include <thread>

#include "core/error.h"
#include "distributed/control_store.h"
#include "distributed/nic.h"
#include "distributed/rendezvous_client.h"
#include "distributed/rendezvous_server.h"
#include "doctor/doctor.h"
#include "doctor/internal.h"
#include "doctor/probes.h"

namespace tessera::doctor {

using namespace std::chrono_literals;

namespace {

std::span<const uint8_t> as_span(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Every node learns whether every node reached every other (then the all-reduce is tried).
bool every_node_reaches(dist::ControlStoreClient& store, const std::vector<PairResult>& mine, const DoctorOptions& o) {
  bool all_reach = true;
  for (const auto& p : mine) all_reach &= p.reachable;
  store.set("doctor/reach/" + std::to_string(o.node_rank), as_span(all_reach ? "1" : "0"));
  bool everyone = true;
  for (int r = 0; r < o.nnodes; ++r) {
    auto v = store.wait_get("doctor/reach/" + std::to_string(r), o.join_timeout, fmt::format("node {}", r));
    everyone &= !v.empty() && v[0] == '1';
  }
  return everyone;
}

// The doctor's own rendezvous: the head serves the control port (and waits for every node),
// the others join it. The fingerprint never refuses: the doctor compares versions and model
// files itself, to name every difference.
void join_doctor_rendezvous(const DoctorOptions& o, const NodeFacts& me, bool is_head, dist::HeadAddress& head,
                            std::unique_ptr<dist::RendezvousServer>& server,
                            std::unique_ptr<dist::RendezvousClient>& client) {
  dist::NodeFingerprint neutral;
  neutral.version = "tessera doctor";
  neutral.hostname = me.hostname;
  neutral.nic = me.nic;
  neutral.ip = me.ip;
  if (is_head) {
    dist::RendezvousServerOptions so;
    so.bind_ip = me.ip;
    so.port = o.master_port;
    so.token = o.token;
    so.nnodes = o.nnodes;
    so.head_fingerprint = neutral;
    so.join_timeout = o.join_timeout;
    server = std::make_unique<dist::RendezvousServer>(so);
    head.host = me.ip;
    server->wait_for_nodes();
    return;
  }
  dist::RendezvousClientOptions co;
  co.head = head;
  co.node_rank = o.node_rank;
  co.nnodes = o.nnodes;
  co.fingerprint = neutral;
  co.join_timeout = o.join_timeout;
  client = std::make_unique<dist::RendezvousClient>(co);
}

// Lets the other nodes read the verdict before the head's control channel closes (10 s at most).
void wait_for_nodes_to_leave(dist::RendezvousServer& server) {
  auto deadline = dist::Clock::now() + 10s;
  while (dist::Clock::now() < deadline) {
    bool others_gone = true;
    for (const auto& n : server.status().nodes) others_gone &= n.node_rank == 0 || !n.alive;
    if (others_gone) break;
    std::this_thread::sleep_for(20ms);
  }
}

}  // namespace

Report run_doctor(const DoctorOptions& o) {
  Report rep;
  NodeFacts me = collect_local_facts(o);
  const bool cluster = o.nnodes > 1;
  if (!cluster) {
    rep.checks = local_checks(me, o);
    return rep;
  }
  rep.is_head = o.node_rank == 0;
  auto fail_line = [&](const std::string& name, const std::string& what, const std::string& fix) {
    rep.checks.push_back({node_name(me), name, Status::kFail, what, fix});
  };
  // 1. NIC: the same choice serve makes, and where the kernel routes to the head.
  dist::NicChoice nic;
  try {
    nic = dist::choose_nic({o.master_addr, o.nic, o.node_ip_address});
  } catch (const Error& e) {
    rep.checks = local_checks(me, o);
    fail_line("NIC choice", e.what(), "pass --nic with the interface on the network the nodes share");
    return rep;
  }
  me.nic = nic.interface_name;
  me.ip = nic.ip;
  if (auto src = dist::route_source_address(o.master_addr))
    for (const auto& i : me.interfaces)
      if (i.ip == *src) me.route_interface = i.name;
  if (rep.is_head && dist::is_loopback_address(o.master_addr)) me.route_interface = me.nic;
  auto probe_server = std::make_unique<ProbeServer>(me.ip);
  me.probe_ip = me.ip;
  me.probe_port = probe_server->port();
  // 2. The rendezvous (the control port), with a fingerprint that never refuses: the doctor
  // compares versions and model files itself, to name every difference.
  std::unique_ptr<dist::RendezvousServer> server;
  std::unique_ptr<dist::RendezvousClient> client;
  dist::HeadAddress head{o.master_addr, o.master_port, o.token, me.ip};
  try {
    join_doctor_rendezvous(o, me, rep.is_head, head, server, client);
  } catch (const Error& e) {
    auto local = local_checks(me, o);
    rep.checks.insert(rep.checks.end(), local.begin(), local.end());
    fail_line(fmt::format("control port {}:{}", o.master_addr, o.master_port), e.what(),
              rep.is_head ? fmt::format("start `tessera doctor` on every node with the same --nnodes, --master-addr "
                                        "and --cluster-token; open TCP {} on this node's firewall",
                                        o.master_port)
                          : fmt::format("check --master-addr and --nic, and open TCP {} on the head's firewall (nft "
                                        "add rule inet filter input tcp dport {} accept; ufw allow {}/tcp)",
                                        o.master_port, o.master_port, o.master_port));
    return rep;
  }
  // 3. Facts through the store, probes of every peer, an all-reduce, results back to the head.
  std::vector<NodeFacts> all;
  std::vector<PairResult> pairs;
  std::map<int, std::pair<double, std::string>> allreduce;
  try {
    auto store = std::make_shared<dist::ControlStoreClient>(head, o.node_rank, o.join_timeout);
    store->set("doctor/facts/" + std::to_string(o.node_rank), encode_facts(me));
    for (int r = 0; r < o.nnodes; ++r)
      all.push_back(r == o.node_rank ? me
                                     : decode_facts(store->wait_get("doctor/facts/" + std::to_string(r), o.join_timeout,
                                                                    fmt::format("node {}'s facts", r))));
    std::vector<PairResult> mine;
    for (const auto& peer : all)
      if (peer.node_rank != o.node_rank) mine.push_back(probe(me, peer, o));
    store->set("doctor/probed/" + std::to_string(o.node_rank), as_span("1"));
    for (int r = 0; r < o.nnodes; ++r)
      store->wait_get("doctor/probed/" + std::to_string(r), o.join_timeout, fmt::format("node {}'s probes", r));
    // Every node decides the same way whether the data plane can be tried: all probes passed.
    const bool everyone = every_node_reaches(*store, mine, o);
    double busbw = -1;
    std::string ar_error = everyone ? "" : "skipped: some node cannot reach another";
    if (everyone) try {
        busbw = all_reduce_busbw(store, me.ip, o.node_rank, o.nnodes, o.all_reduce_bytes);
      } catch (const Error& e) {
        ar_error = e.what();
      }
    store->set("doctor/result/" + std::to_string(o.node_rank), encode_pairs(mine, busbw, ar_error));
    if (rep.is_head) {
      for (int r = 0; r < o.nnodes; ++r) {
        double bw = -1;
        std::string err;
        auto v = decode_pairs(
            store->wait_get("doctor/result/" + std::to_string(r), o.join_timeout, fmt::format("node {}'s results", r)),
            &bw, &err);
        pairs.insert(pairs.end(), v.begin(), v.end());
        allreduce[r] = {bw, err};
      }
    }
    if (!rep.is_head) {
      // The head's verdict decides this node's exit status too.
      for (const auto& f : all) {
        auto local = local_checks(f, o);
        if (f.node_rank == o.node_rank) rep.checks.insert(rep.checks.end(), local.begin(), local.end());
      }
      auto v = store->wait_get("doctor/verdict", o.join_timeout, "the head's verdict");
      const bool ok = !v.empty() && v[0] == '1';
      rep.checks.push_back(
          {"", "cluster", ok ? Status::kOk : Status::kFail,
           ok ? "every check passed (the head printed the report)" : "the head found problems (its report names them)",
           ok ? "" : "see the head's output"});
      return rep;
    }
    // The head's report.
    for (const auto& f : all) {
      auto local = local_checks(f, o);
      rep.checks.insert(rep.checks.end(), local.begin(), local.end());
    }
    auto cmp = compare_nodes(all);
    rep.checks.insert(rep.checks.end(), cmp.begin(), cmp.end());
    const auto& [bw, err] = allreduce[0];
    const std::vector<Check> links = link_checks(all, pairs, bw, err, o);
    rep.checks.insert(rep.checks.end(), links.begin(), links.end());
    store->set("doctor/verdict", as_span(rep.ok() ? "1" : "0"));
    wait_for_nodes_to_leave(*server);
  } catch (const Error& e) {
    auto local = local_checks(me, o);
    rep.checks.insert(rep.checks.end(), local.begin(), local.end());
    fail_line("cluster checks", e.what(), "check that every node runs `tessera doctor` with the same flags");
  }
  return rep;
}

}  // namespace tessera::doctor
