// `tessera cluster status`: asks a running head's control port which nodes joined, like
// `ray status`. The connection authenticates with the cluster token like any node.
//   tessera cluster status --master-addr 10.0.0.1 --master-port 29500 [--cluster-token T]
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include "cli/verbs.h"
#include "core/error.h"
#include "dist/rendezvous_client.h"

namespace tessera::cli {
namespace {

std::string gpu_summary(const std::vector<std::string>& gpus) {
  if (gpus.empty()) return "-";
  std::map<std::string, int> counts;
  for (const std::string& g : gpus) counts[g]++;
  std::string out;
  for (const auto& [name, n] : counts) out += fmt::format("{}{} x {}", out.empty() ? "" : ", ", n, name);
  return out;
}

std::string rank_span(const dist::NodeStatus& n) {
  int count = n.fingerprint.num_ranks;
  return count == 1 ? std::to_string(n.first_rank) : fmt::format("{}-{}", n.first_rank, n.first_rank + count - 1);
}

void print_status(const dist::ClusterStatus& s, const std::string& where) {
  std::printf("Cluster at %s: %zu/%d nodes joined, %s, %d ranks\n\n", where.c_str(), s.nodes.size(), s.nnodes,
              s.formed ? "formed" : "waiting for nodes", s.world_size);
  std::printf("%-5s %-16s %-16s %-10s %-7s %-28s %-20s %-6s %-10s %s\n", "NODE", "HOST", "IP", "NIC", "RANKS", "GPUS",
              "VERSION", "STATE", "HEARTBEAT", "JOINS");
  std::set<int> seen;
  for (const dist::NodeStatus& n : s.nodes) {
    seen.insert(n.node_rank);
    std::string beat = n.node_rank == 0 ? "(head)" : fmt::format("{:.1f}s ago", n.ms_since_heartbeat / 1000.0);
    std::printf("%-5d %-16s %-16s %-10s %-7s %-28s %-20s %-6s %-10s %d\n", n.node_rank,
                n.fingerprint.hostname.empty() ? "-" : n.fingerprint.hostname.c_str(),
                n.fingerprint.ip.empty() ? "-" : n.fingerprint.ip.c_str(),
                n.fingerprint.nic.empty() ? "-" : n.fingerprint.nic.c_str(), s.formed ? rank_span(n).c_str() : "-",
                gpu_summary(n.fingerprint.gpus).c_str(), n.fingerprint.version.c_str(), n.alive ? "alive" : "DEAD",
                beat.c_str(), n.joins);
  }
  std::string missing;
  for (int r = 0; r < s.nnodes; ++r)
    if (!seen.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  if (!missing.empty()) std::printf("\nnot joined yet: node %s\n", missing.c_str());
}

}  // namespace

int run_cluster(int argc, char** argv) {
  CLI::App app{"Inspect a running multi-node cluster through its head's control port.", "tessera cluster"};
  app.require_subcommand(1);
  CLI::App* status =
      app.add_subcommand("status", "nodes, ranks, GPUs, NIC, IP, version and liveness, like `ray status`");
  std::string master_addr, token;
  int master_port = 29500;
  double timeout_s = 10;
  status->add_option("--master-addr", master_addr, "the head's address (as given to the nodes)")->required();
  status->add_option("--master-port", master_port, "the head's control port")->capture_default_str();
  status->add_option("--cluster-token", token, "the cluster token (default: $TESSERA_CLUSTER_TOKEN)");
  status->add_option("--timeout", timeout_s, "seconds to wait for the head")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (token.empty() && std::getenv("TESSERA_CLUSTER_TOKEN")) token = std::getenv("TESSERA_CLUSTER_TOKEN");
  if (master_port < 1 || master_port > 65535)
    fail(ErrorKind::kInvalidArgument, "--master-port {} outside 1..65535", master_port);
  dist::HeadAddress head{master_addr, static_cast<uint16_t>(master_port), token, ""};
  dist::ClusterStatus s =
      dist::query_cluster_status(head, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  print_status(s, fmt::format("{}:{}", master_addr, master_port));
  bool all_alive = s.formed;
  for (const dist::NodeStatus& n : s.nodes) all_alive &= n.alive;
  return all_alive ? 0 : 3;  // scripts can tell a degraded cluster from a healthy one
}

}  // namespace tessera::cli
