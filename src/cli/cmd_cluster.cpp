// `tessera cluster status`: asks a running head's control port which nodes joined, like
// `ray status`. The connection authenticates with the cluster token like any node.
//   tessera cluster status --master-addr 10.0.0.1 --master-port 29500 [--cluster-token T]
//   tessera cluster status        (on the machine of a `tessera node start --head`: its state file)
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "cli/cluster_state.h"
#include "cli/flag_parsing.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "distributed/rendezvous_client.h"

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

// A persistent cluster (`tessera node start`): nodes come and go, no fixed count, no ranks.
void print_persistent(const dist::ClusterStatus& s, const std::string& where) {
  int alive = 0, gpus = 0;
  for (const dist::NodeStatus& n : s.nodes) {
    alive += n.alive;
    gpus += n.alive ? static_cast<int>(n.fingerprint.gpus.size()) : 0;
  }
  std::printf("Cluster at %s (started with tessera node start): %d node(s) alive of %zu joined, %d GPU(s)\n\n",
              where.c_str(), alive, s.nodes.size(), gpus);
  std::printf("%-5s %-16s %-16s %-10s %-5s %-28s %-6s %-20s %-6s %s\n", "NODE", "HOST", "IP", "NIC", "GPUS",
              "GPU NAMES", "SLOTS", "VERSION", "STATE", "HEARTBEAT");
  for (const dist::NodeStatus& n : s.nodes) {
    std::string beat = n.node_rank == 0 ? "(head)" : fmt::format("{:.1f}s ago", n.ms_since_heartbeat / 1000.0);
    std::printf("%-5d %-16s %-16s %-10s %-5zu %-28s %-6d %-20s %-6s %s\n", n.node_rank,
                n.fingerprint.hostname.empty() ? "-" : n.fingerprint.hostname.c_str(),
                n.fingerprint.ip.empty() ? "-" : n.fingerprint.ip.c_str(),
                n.fingerprint.nic.empty() ? "-" : n.fingerprint.nic.c_str(), n.fingerprint.gpus.size(),
                gpu_summary(n.fingerprint.gpus).c_str(), n.fingerprint.num_ranks, n.fingerprint.version.c_str(),
                n.alive ? "alive" : "DEAD", beat.c_str());
  }
}

void print_status(const dist::ClusterStatus& s, const std::string& where) {
  if (s.nnodes == 0) return print_persistent(s, where);
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
  use_vllm_conventions(app);
  app.require_subcommand(1);
  CLI::App* status =
      app.add_subcommand("status", "nodes, ranks, GPUs, NIC, IP, version and liveness, like `ray status`");
  std::string master_addr, token, address;
  std::optional<int> master_port;
  double timeout_s = 10;
  status->add_option("--master-addr", master_addr,
                     "the head's address (as given to the nodes); default: the `tessera node start --head` of this "
                     "machine");
  status->add_option("--master-port", master_port, "the head's control port (default 29500)");
  status->add_option("--address", address, "HEAD:PORT, as given to `tessera node start --address`");
  status->add_option("--cluster-token", token, "the cluster token (default: $TESSERA_CLUSTER_TOKEN)");
  status->add_option("--timeout", timeout_s, "seconds to wait for the head")->capture_default_str();
  if (int rc = parse_flags(app, argc, argv); rc >= 0) return rc;
  if (token.empty() && std::getenv("TESSERA_CLUSTER_TOKEN")) token = std::getenv("TESSERA_CLUSTER_TOKEN");
  if (!address.empty()) {
    size_t colon = address.rfind(':');
    if (colon == std::string::npos) fail(ErrorKind::kInvalidArgument, "--address {}: write HEAD:PORT", address);
    master_addr = address.substr(0, colon);
    master_port = std::atoi(address.c_str() + colon + 1);
  }
  if (master_addr.empty()) {
    std::optional<ClusterState> st = read_cluster_state();
    if (!st)
      fail(ErrorKind::kInvalidArgument,
           "no cluster head runs on this machine ({} does not exist); pass --master-addr HEAD --master-port PORT (or "
           "--address HEAD:PORT)",
           cluster_state_path());
    master_addr = st->host;
    master_port = st->port;
    if (token.empty()) token = st->token;
  }
  if (!master_port) master_port = 29500;
  if (*master_port < 1 || *master_port > 65535)
    fail(ErrorKind::kInvalidArgument, "--master-port {} outside 1..65535", *master_port);
  dist::HeadAddress head{master_addr, static_cast<uint16_t>(*master_port), token, ""};
  dist::ClusterStatus s =
      dist::query_cluster_status(head, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  print_status(s, fmt::format("{}:{}", master_addr, *master_port));
  bool all_alive = s.formed;
  for (const dist::NodeStatus& n : s.nodes) all_alive &= n.alive;
  return all_alive ? 0 : 3;  // scripts can tell a degraded cluster from a healthy one
}

}  // namespace tessera::cli
