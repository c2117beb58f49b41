// `tessera node start`: a cluster started once, like Ray's (`ray start --head`, `ray start
// --address HEAD:6379`). The head keeps a control channel open (the rendezvous server in
// persistent mode: dist/rendezvous_server.h); every other node joins it, sends heartbeats and
// waits for jobs. `tessera serve ... --distributed-executor-backend ray` on the head places
// its ranks on the joined nodes and hands each chosen node a job: the same command with the
// per-node flags (--nnodes/--node-rank/--master-addr/--master-port), which the node runs as
// a child process. Jobs come and go; the nodes stay joined (docs/distributed.md, "A
// persistent cluster").
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/cluster_state.h"
#include "cli/flag_parsing.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "core/logging.h"
#include "distributed/fingerprint.h"
#include "distributed/launch_env.h"
#include "distributed/nic.h"
#include "distributed/placement.h"
#include "distributed/rendezvous_client.h"
#include "distributed/rendezvous_server.h"

extern char** environ;

namespace tessera::cli {
namespace {

volatile sig_atomic_t g_stop = 0;
void on_stop(int) { g_stop = 1; }

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

struct NodeStartFlags {
  bool head = false;
  std::string address;  // HEAD:PORT (workers)
  int port = 6379;      // the head's control port (Ray's default)
  std::string node_ip_address, nic, token;
  std::optional<int> num_gpus;  // rank slots this node offers
  double join_timeout_s = 300;
  bool block = false, disable_usage_stats = false;
  std::string object_store_memory, dashboard_host;
  std::optional<int> num_cpus;
};

dist::NodeFingerprint node_fingerprint(const dist::NicChoice& nic, const NodeStartFlags& f) {
  dist::NodeFingerprint fp;
  fp.version = dist::this_version();
  fp.gpus = dist::local_gpu_names();
  // A node without GPUs offers one CPU rank unless told otherwise.
  fp.num_ranks = f.num_gpus ? *f.num_gpus : std::max<int>(1, static_cast<int>(fp.gpus.size()));
  fp.nic = nic.interface_name;
  fp.ip = nic.ip;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  fp.hostname = host;
  return fp;
}

// The job's child process on a worker node.
struct NodeJob {
  pid_t pid = -1;
  int node_rank = 0, nnodes = 0;
};

void end_job(NodeJob& job, const char* why) {
  if (job.pid <= 0) return;
  TLOG_INFO("ending the job's process (pid {}): {}", job.pid, why);
  // SIGKILL at once: a job's node process answers SIGTERM by waiting for its head's shutdown
  // (a scheduler's cancel), and its ranks end with it (PR_SET_PDEATHSIG).
  kill(job.pid, SIGKILL);
  waitpid(job.pid, nullptr, 0);
  job.pid = -1;
}

void reap_job(NodeJob& job) {
  if (job.pid <= 0) return;
  int status = 0;
  if (waitpid(job.pid, &status, WNOHANG) != job.pid) return;
  if (WIFEXITED(status))
    TLOG_INFO("the job's process (node {} of {}) ended with exit code {}; this node stays in the cluster",
              job.node_rank, job.nnodes, WEXITSTATUS(status));
  else
    TLOG_WARN("the job's process (node {} of {}) was killed by signal {}; this node stays in the cluster",
              job.node_rank, job.nnodes, WTERMSIG(status));
  job.pid = -1;
}

void start_job(NodeJob& job, const dist::JobStart& js, const dist::NicChoice& nic, const std::string& token) {
  std::vector<std::string> args{"/proc/self/exe"};
  args.insert(args.end(), js.args.begin(), js.args.end());
  args.insert(args.end(), {"--nnodes", std::to_string(js.nnodes), "--node-rank", std::to_string(js.node_rank),
                           "--master-addr", js.master_addr, "--master-port", std::to_string(js.master_port),
                           "--node-ip-address", nic.ip, "--nic", "=" + nic.interface_name});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  TLOG_INFO("job: node {} of {}, head {}:{}: tessera {}", js.node_rank, js.nnodes, js.master_addr, js.master_port,
            fmt::join(js.args, " "));
  std::fflush(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) fail(ErrorKind::kInternal, "fork failed: {}", std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // the job ends with its node
    if (getppid() != parent) _exit(1);
    setenv("TESSERA_CLUSTER_TOKEN", token.c_str(), 1);
    // The job's facts are its flags; a launcher that started this node must not contradict them.
    for (const char* name : dist::launcher_variable_names()) unsetenv(name);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  job = {pid, js.node_rank, js.nnodes};
}

std::string resolve_token(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* t = std::getenv("TESSERA_CLUSTER_TOKEN")) return t;
  return "";
}

// --node-ip-address, else VLLM_HOST_IP (what the seeds set for Ray); both: they must agree.
std::string node_ip_from(const std::string& flag) {
  const char* env = std::getenv("VLLM_HOST_IP");
  if (env && *env && !flag.empty() && flag != env)
    fail(ErrorKind::kInvalidArgument,
         "--node-ip-address {} contradicts VLLM_HOST_IP={} (from the environment); make them agree or unset one", flag,
         env);
  if (flag.empty() && env && *env) {
    TLOG_INFO("VLLM_HOST_IP={} (from the environment) used as --node-ip-address", env);
    return env;
  }
  return flag;
}

void note_ray_flags(const NodeStartFlags& f) {
  if (f.block) TLOG_INFO("--block: tessera node start runs in the foreground anyway");
  if (f.disable_usage_stats) TLOG_INFO("--disable-usage-stats: tessera collects no usage statistics");
  if (!f.object_store_memory.empty())
    TLOG_INFO("--object-store-memory {}: tessera has no object store (tensors go over Gloo/NCCL); not used",
              f.object_store_memory);
  if (f.num_cpus)
    TLOG_INFO("--num-cpus {}: tessera's CPU ranks split this node's cores themselves; not used", *f.num_cpus);
  if (!f.dashboard_host.empty())
    TLOG_INFO("--dashboard-host: tessera has no dashboard; `tessera cluster status` lists the nodes");
}

int run_head(const NodeStartFlags& f) {
  if (std::optional<ClusterState> running = read_cluster_state())
    fail(ErrorKind::kInvalidArgument,
         "a cluster head already runs on this machine (pid {}, {}:{}; {}); stop it first, or give this one its own "
         "TESSERA_STATE_DIR",
         running->pid, running->host, running->port, cluster_state_path());
  std::string token = resolve_token(f.token);
  std::string ip = node_ip_from(f.node_ip_address);
  dist::NicChoice nic;
  try {
    // The head's own address is its "master": the NIC that owns it (or --nic's choice).
    // Without an address, --nic or *_SOCKET_IFNAME: the interface of the default route.
    bool env_ifname = std::getenv("GLOO_SOCKET_IFNAME") || std::getenv("NCCL_SOCKET_IFNAME");
    std::string master = !ip.empty() ? ip : (f.nic.empty() && !env_ifname ? "8.8.8.8" : "");
    nic = dist::choose_nic({master, f.nic, ip});
  } catch (const Error& e) {
    if (!ip.empty() || !f.nic.empty()) throw;
    fail(ErrorKind::kInvalidArgument,
         "cannot tell which address the other nodes reach this head at ({}); pass --node-ip-address IP (or set "
         "VLLM_HOST_IP) or --nic NAME",
         e.what());
  }
  dist::apply_nic_env(nic);
  if (f.port < 1 || f.port > 65535) fail(ErrorKind::kInvalidArgument, "--port {} outside 1..65535", f.port);
  if (token.empty() && !dist::is_loopback_address(nic.ip))
    fail(ErrorKind::kInvalidArgument,
         "a cluster needs a shared secret: pass --cluster-token T (or set TESSERA_CLUSTER_TOKEN) here and the same on "
         "every node that joins");
  dist::RendezvousServerOptions so;
  so.bind_ip = nic.ip;
  so.port = static_cast<uint16_t>(f.port);
  so.token = token;
  so.persistent = true;
  so.head_fingerprint = node_fingerprint(nic, f);
  install_stop_handlers();
  dist::RendezvousServer server(so);
  write_cluster_state({nic.ip, server.port(), token, nic.interface_name, static_cast<long>(getpid())});
  std::printf(
      "tessera cluster head started at %s:%u (%s, %d rank slot(s), %zu GPU(s)).\n"
      "On each other node run:\n  TESSERA_CLUSTER_TOKEN=<the same token> tessera node start --address %s:%u\n"
      "Then on this node: tessera serve MODEL --tensor-parallel-size N --distributed-executor-backend ray\n"
      "Nodes: tessera cluster status\n",
      nic.ip.c_str(), server.port(), nic.interface_name.c_str(), so.head_fingerprint.num_ranks,
      so.head_fingerprint.gpus.size(), nic.ip.c_str(), server.port());
  std::fflush(stdout);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  TLOG_INFO("stopping the cluster head");
  remove_cluster_state();
  return 0;
}

int run_worker(const NodeStartFlags& f) {
  size_t colon = f.address.rfind(':');
  if (colon == std::string::npos || colon == 0)
    fail(ErrorKind::kInvalidArgument, "--address {}: write HEAD:PORT (the head's address and --port)", f.address);
  std::string host = f.address.substr(0, colon);
  int port = std::atoi(f.address.c_str() + colon + 1);
  if (port < 1 || port > 65535) fail(ErrorKind::kInvalidArgument, "--address {}: port outside 1..65535", f.address);
  std::string token = resolve_token(f.token);
  if (token.empty() && !dist::is_loopback_address(host))
    fail(ErrorKind::kInvalidArgument,
         "joining a cluster needs its shared secret: pass --cluster-token T (or set TESSERA_CLUSTER_TOKEN) as given to "
         "the head");
  std::string ip = node_ip_from(f.node_ip_address);
  dist::NicChoice nic = dist::choose_nic({host, f.nic, ip});
  dist::apply_nic_env(nic);
  install_stop_handlers();
  dist::RendezvousClientOptions co;
  co.head = {host, static_cast<uint16_t>(port), token, nic.ip};
  co.node_rank = -1;
  co.nnodes = 0;
  co.fingerprint = node_fingerprint(nic, f);
  co.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.join_timeout_s * 1000));
  auto client = std::make_unique<dist::RendezvousClient>(co);
  std::printf("joined the tessera cluster at %s:%d as node %d (%s on %s, %d rank slot(s), %zu GPU(s))\n", host.c_str(),
              port, client->node_rank(), nic.ip.c_str(), nic.interface_name.c_str(), co.fingerprint.num_ranks,
              co.fingerprint.gpus.size());
  std::fflush(stdout);
  NodeJob job;
  while (!g_stop) {
    reap_job(job);
    if (std::optional<dist::RankFailure> lost = client->failure()) {
      if (lost->node_rank == client->node_rank()) {  // the head is there but dropped this node (it hung)
        end_job(job, "the head declared this node dead");
        fail(ErrorKind::kNetwork, "{}; start this node again with `tessera node start --address {}`", lost->reason,
             f.address);
      }
      end_job(job, "the head is gone");
      fail(ErrorKind::kNetwork,
           "{}; start this node again with `tessera node start --address {}` once the head is back", lost->reason,
           f.address);
    }
    if (std::optional<dist::JobStart> js = client->wait_job(std::chrono::milliseconds(100))) {
      if (job.pid > 0) end_job(job, "a new job arrived");
      start_job(job, *js, nic, token);
    }
  }
  end_job(job, "this node is stopping");
  TLOG_INFO("leaving the cluster");
  return 0;
}

}  // namespace

int run_node(int argc, char** argv) {
  CLI::App app{
      "A cluster started once, like `ray start`: `tessera node start --head` on one machine, "
      "`tessera node start --address HEAD:PORT` on the others; then `tessera serve ... "
      "--distributed-executor-backend ray` on the head places its ranks on them.",
      "tessera node"};
  use_vllm_conventions(app);
  app.require_subcommand(1);
  CLI::App* start = app.add_subcommand("start", "start this node (in the foreground) as the head or joining one");
  NodeStartFlags f;
  start->add_flag("--head", f.head, "start the cluster's head on this machine");
  start->add_option("--address", f.address, "join the head at HEAD:PORT");
  start->add_option("--port", f.port, "the head's control port")->capture_default_str();
  start->add_option("--node-ip-address", f.node_ip_address,
                    "this node's address on the network the nodes share (default: $VLLM_HOST_IP, else the NIC that "
                    "routes to the head)");
  start->add_option("--nic", f.nic, "interface(s), NCCL_SOCKET_IFNAME syntax (eth,ib / =eth0 / ^docker,lo)");
  start->add_option("--cluster-token", f.token, "shared secret of the cluster (default $TESSERA_CLUSTER_TOKEN)");
  start->add_option("--num-gpus", f.num_gpus,
                    "rank slots this node offers (default: its GPUs; 1 CPU rank on a node without GPUs)");
  start->add_option("--join-timeout", f.join_timeout_s, "seconds to reach the head")->capture_default_str();
  start->add_flag("--block", f.block, "accepted for Ray compatibility (tessera node start stays in the foreground)");
  start->add_flag("--disable-usage-stats", f.disable_usage_stats, "accepted for Ray compatibility");
  start->add_option("--object-store-memory", f.object_store_memory, "accepted for Ray compatibility; not used");
  start->add_option("--num-cpus", f.num_cpus, "accepted for Ray compatibility; not used");
  start->add_option("--dashboard-host", f.dashboard_host, "accepted for Ray compatibility; not used");
  if (int rc = parse_flags(app, argc, argv); rc >= 0) return rc;
  if (f.head == !f.address.empty())
    fail(ErrorKind::kInvalidArgument,
         "tessera node start needs exactly one of --head (start the cluster here) or --address HEAD:PORT (join it)");
  if (f.num_gpus && *f.num_gpus < 1) fail(ErrorKind::kInvalidArgument, "--num-gpus must be at least 1");
  note_ray_flags(f);
  return f.head ? run_head(f) : run_worker(f);
}

}  // namespace tessera::cli
