#include "cli/node_launch.h"

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <thread>

#include "cli/plan_flags.h"
#include "core/error.h"
#include "core/logging.h"
#include "distributed/placement.h"
#include "distributed/rendezvous_client.h"
#include "distributed/socket.h"
#include "engine/model_loader.h"

namespace tessera::cli {

namespace {

// SIGTERM / SIGINT on a node other than the head: counted, acted on by run_worker_node's loop.
std::atomic<int> g_stop_signals{0}, g_stop_count{0};
constexpr std::chrono::seconds kHeadShutdownWait{60};
// A node whose ranks finished asks the head whether it still counts the node (one heartbeat round trip;
// a head that does not answer is found out by the heartbeat timeout).
constexpr std::chrono::milliseconds kMembershipCheck{5000};

void on_stop_signal(int sig) {
  g_stop_signals.store(sig);
  g_stop_count.fetch_add(1);
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// The per-node flags a persistent cluster's node adds itself (its own address and NIC, the job's
// head): left out of the command line the nodes get.
bool is_per_node_flag(const std::string& name) {
  static const char* kFlags[] = {
      "--nnodes",          "--node-rank", "--master-addr",   "--master-port",
      "--node-ip-address", "--nic",       "--cluster-token", "--distributed-executor-backend"};
  for (const char* f : kFlags)
    if (name == f) return true;
  return false;
}

// This process's command line after the binary (the verb and its flags), from /proc/self/cmdline.
std::vector<std::string> job_args() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t i = 0; i < all.size();) {
    size_t end = all.find('\0', i);
    if (end == std::string::npos) end = all.size();
    args.push_back(all.substr(i, end - i));
    i = end + 1;
  }
  std::vector<std::string> out;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    std::string name = a.substr(0, a.find('='));
    if (is_per_node_flag(name)) {
      if (a.find('=') == std::string::npos) ++i;  // and its value
      continue;
    }
    out.push_back(a);
  }
  return out;
}

// A persistent cluster here: which nodes run the ranks. With `ray` always; without a backend
// only when the ranks do not fit this node's slots (vLLM picks Ray then too), else `facts`.
dist::LaunchFacts place_on_cluster(const EngineFlags& f, ClusterFlags& c, const ClusterState& st,
                                   dist::LaunchFacts facts, bool asked_for_ray) {
  dist::HeadAddress head{st.host, st.port, c.cluster_token.empty() ? st.token : c.cluster_token, ""};
  dist::ClusterStatus status = dist::query_cluster_status(head, std::chrono::seconds(10));
  std::vector<dist::NodeSlots> nodes;
  for (const dist::NodeStatus& n : status.nodes)
    nodes.push_back({n.node_rank, n.fingerprint.num_ranks, n.alive, n.fingerprint.ip, n.fingerprint.nic});
  const int world = f.tensor_parallel_size * f.pipeline_parallel_size;
  if (!asked_for_ray) {
    int here = 0;
    for (const dist::NodeSlots& n : nodes)
      if (n.node_rank == 0) here = n.slots;
    if (world <= here) return facts;
    TLOG_INFO(
        "{} ranks do not fit this node's {} slot(s): placing them on the cluster started here with `tessera node "
        "start` (as vLLM turns to Ray when a job does not fit one node; --distributed-executor-backend mp keeps "
        "them here)",
        world, here);
  }
  dist::RankPlacement2D p = dist::place_ranks(f.tensor_parallel_size, f.pipeline_parallel_size, nodes);
  if (p.nodes.size() == 1) {
    TLOG_INFO("--distributed-executor-backend ray: the {} rank(s) fit on this node (the cluster's head at {}:{})",
              p.ranks_per_node, st.host, st.port);
    return facts;
  }
  if (!p.warning.empty()) TLOG_WARN("{}", p.warning);
  std::string where;
  for (size_t k = 0; k < p.nodes.size(); ++k)
    for (const dist::NodeSlots& n : nodes)
      if (n.node_rank == p.nodes[k])
        where += fmt::format("{}cluster node {} ({}): ranks {}-{}", where.empty() ? "" : ", ", n.node_rank, n.ip,
                             k * p.ranks_per_node, (k + 1) * p.ranks_per_node - 1);
  TLOG_INFO("placing the job on the cluster: {} rank(s) on {} nodes of the cluster at {}:{}: {}",
            f.tensor_parallel_size * f.pipeline_parallel_size, p.nodes.size(), st.host, st.port, where);
  c.cluster = st;
  c.cluster_nodes.assign(p.nodes.begin() + 1, p.nodes.end());
  if (c.cluster_token.empty()) c.cluster_token = st.token;
  if (c.node_ip_address.empty()) c.node_ip_address = st.host;
  facts.source = dist::LaunchSource::kFlags;
  facts.nnodes = static_cast<int>(p.nodes.size());
  facts.node_rank = 0;
  facts.master_addr = st.host;
  {  // the job's own control port: one the kernel has free on the head's address
    dist::Socket probe = dist::listen_tcp(st.host, 0);
    facts.master_port = dist::local_port(probe);
  }
  return facts;
}

}  // namespace

dist::LaunchFacts resolve_cluster(const EngineFlags& f, ClusterFlags& c) {
  const std::string& b = c.distributed_executor_backend;
  if (!b.empty() && b != "mp" && b != "uni" && b != "ray" && b != "external_launcher")
    fail(ErrorKind::kInvalidArgument, "--distributed-executor-backend {}: not one of mp, ray, uni, external_launcher",
         b);
  if (const char* v = std::getenv("VLLM_HOST_IP"); v && *v) {
    if (c.node_ip_address.empty()) {
      TLOG_INFO("VLLM_HOST_IP={} (from the environment) used as --node-ip-address", v);
      c.node_ip_address = v;
    } else if (c.node_ip_address != v) {
      fail(ErrorKind::kInvalidArgument,
           "--node-ip-address {} contradicts VLLM_HOST_IP={} (from the environment); make them agree or unset one",
           c.node_ip_address, v);
    }
  }
  const int world = f.tensor_parallel_size * f.pipeline_parallel_size;
  dist::LaunchFacts facts = dist::resolve_launch({c.nnodes, c.node_rank, c.master_addr, c.master_port, world});
  if (b == "external_launcher" && facts.rank < 0)
    fail(ErrorKind::kInvalidArgument,
         "--distributed-executor-backend external_launcher: no launcher started this process (no torchrun, mpirun or "
         "srun variables); start one process per rank under one, or drop the flag (tessera starts its ranks itself)");
  if (facts.source != dist::LaunchSource::kSingleNode && facts.source != dist::LaunchSource::kFlags) {
    TLOG_INFO("{}", facts.describe());
    for (const std::string& note : facts.notes) TLOG_INFO("{}", note);
  }
  if ((b == "ray" || b.empty()) && facts.nnodes == 1 && facts.rank < 0 && world > 1) {
    if (std::optional<ClusterState> st = read_cluster_state()) {
      facts = place_on_cluster(f, c, *st, facts, b == "ray");
    } else if (b == "ray") {
      TLOG_INFO(
          "--distributed-executor-backend ray: no cluster head on this machine ({} does not exist), so this node's "
          "ranks only; start one with `tessera node start --head` and join the others with `tessera node start "
          "--address`, or run one command per node with --nnodes/--node-rank/--master-addr",
          cluster_state_path());
    }
  } else if (b == "ray") {
    TLOG_INFO(
        "--distributed-executor-backend ray: tessera starts and supervises its rank processes itself (one command "
        "per node with --nnodes/--node-rank/--master-addr); continuing with mp");
  }
  if (facts.nnodes > 1 && (world < facts.nnodes || world % facts.nnodes != 0))
    fail(ErrorKind::kInvalidArgument,
         "--tensor-parallel-size {} x --pipeline-parallel-size {} = {} ranks do not split evenly across {} nodes "
         "(every node runs the same number of ranks)",
         f.tensor_parallel_size, f.pipeline_parallel_size, world, facts.nnodes);
  if (facts.nnodes == 1 && (!c.nic.empty() || !c.cluster_token.empty()))
    TLOG_INFO("one node: --nic / --cluster-token are not used (the ranks talk over 127.0.0.1)");
  return facts;
}

std::unique_ptr<dist::NodeSession> start_node_session(const EngineFlags& f, const ClusterFlags& c,
                                                      const dist::LaunchFacts& facts) {
  if (facts.nnodes == 1) return nullptr;
  if (facts.source == dist::LaunchSource::kFlags) TLOG_INFO("{}", facts.describe());
  dist::NodeSessionOptions o;
  o.launch = facts;
  o.nic = c.nic;
  o.node_ip_address = c.node_ip_address;
  o.token = required_cluster_token(c.cluster_token, facts.nnodes, "on every node");
  o.model_dir = f.model;
  o.gpus = dist::local_gpu_names();
  o.local_ranks = f.tensor_parallel_size * f.pipeline_parallel_size / facts.nnodes;
  if (c.cluster) {  // a persistent cluster: its nodes run this command as the job's nodes 1..n-1
    dist::JobSubmit js;
    js.nodes = c.cluster_nodes;
    js.job.nnodes = facts.nnodes;
    js.job.node_rank = 0;
    js.job.master_addr = facts.master_addr;
    js.job.master_port = static_cast<uint16_t>(facts.master_port);
    js.job.args = job_args();
    dist::submit_job({c.cluster->host, c.cluster->port, o.token, ""}, js, std::chrono::seconds(10));
    TLOG_INFO("the cluster's node(s) got the job; its control channel is {}:{}", facts.master_addr, facts.master_port);
  }
  o.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(c.join_timeout_s * 1000));
  return std::make_unique<dist::NodeSession>(o);
}

RankPlacement placement_of(const EngineFlags& f, const dist::NodeSession& s, const dist::LaunchFacts& facts) {
  RankPlacement p;
  p.node_rank = s.node_rank();
  p.first_rank = s.first_rank();
  p.local_ranks = f.tensor_parallel_size * f.pipeline_parallel_size / facts.nnodes;
  p.launcher_started_ranks = facts.one_process_per_rank;
  p.store_host = s.head().host;
  p.store_port = s.head().port;
  p.token = s.head().token;
  p.bind_ip = s.nic().ip;
  p.namer = s.rank_namer();
  return p;
}

int run_worker_node(const EngineFlags& f, dist::NodeSession& s, const dist::LaunchFacts& facts, int argc, char** argv) {
  using clock = std::chrono::steady_clock;
  auto launcher = std::make_unique<RankLauncher>(f, argc, argv, placement_of(f, s, facts));
  TLOG_INFO("node {}: supervising its ranks; the head ({}:{}) runs the engine", s.node_rank(), s.head().host,
            s.head().port);
  // A scheduler's cancel (scancel, SIGTERM from mpirun) reaches every node at once: the head
  // drains and its shutdown plan ends the ranks here, so this node waits for that.
  install_stop_handlers();
  std::optional<clock::time_point> head_failed_at, stop_asked_at;
  // Ends this node at once, non-zero, its ranks killed; no orderly leave.
  auto end_node = [&](const std::string& what) {
    std::fprintf(stderr, "error: node %d: %s\n", s.node_rank(), what.c_str());
    std::fflush(nullptr);
    launcher->report_failure(what);  // so the ranks end now
    launcher.reset();
    std::_Exit(1);
  };
  for (;;) {
    if (int sig = g_stop_signals.load(); sig > 0 && !stop_asked_at) {
      stop_asked_at = clock::now();
      TLOG_INFO(
          "node {}: {}: waiting for the head's shutdown (it drains the job and ends this node's ranks; a second "
          "signal ends them now)",
          s.node_rank(), sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
    if (stop_asked_at && (g_stop_count.load() > 1 || clock::now() - *stop_asked_at > kHeadShutdownWait))
      end_node("stopped before the head ended the job");
    std::optional<dist::RankFailure> rf = s.client()->failure();
    if (rf && rf->node_rank == s.node_rank()) {
      // The head dropped this node (it missed heartbeats: this process hung, was stopped or starved)
      // and ended the job; whatever the ranks did meanwhile, this node's part is over.
      end_node(fmt::format("{}; the head ended the job: start it again on every node", rf->reason));
    }
    if (launcher->all_exited_ok()) {
      // Ranks also end cleanly when the head shut them down after it dropped this node: ask the head
      // whether it still counts this node before calling the job done.
      if (s.client()->confirm_membership(kMembershipCheck)) {
        TLOG_INFO("node {}: every rank finished", s.node_rank());
        return 0;
      }
      rf = s.client()->failure();  // the head dropped this node or is gone: said below
    }
    if (std::string what = launcher->failure(); !what.empty()) {
      // A rank that failed because the head died is reaped a moment before or after the control
      // connection closes: wait briefly, so the message names the head, not the rank.
      for (auto until = clock::now() + std::chrono::milliseconds(500); !rf && clock::now() < until;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        rf = s.client()->failure();
      }
      if (rf && rf->node_rank == s.node_rank())
        end_node(fmt::format("{}; the head ended the job: start it again on every node", rf->reason));
      if (rf && rf->node_rank == 0)
        end_node(fmt::format("{}; this node's ranks ended with it ({}): start the job again on every node", rf->reason,
                             what));
      // No orderly leave: the head must see this node as lost (its control connection closes).
      end_node(what);
    }
    if (rf && rf->node_rank == s.node_rank()) continue;  // ended at the top of the loop
    if (rf) {
      // The ranks may be finishing after the head's shutdown plan: give them a moment.
      if (!head_failed_at)
        head_failed_at = clock::now();
      else if (clock::now() - *head_failed_at > std::chrono::seconds(3))
        fail(ErrorKind::kNetwork, "node {}: {}; ending this node's ranks (start the job again on every node)",
             s.node_rank(), rf->reason);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

int run_launched_rank(const EngineFlags& f, const ClusterFlags& c, const dist::LaunchFacts& facts) {
  using clock = std::chrono::steady_clock;
  // The interface the node's local rank 0 chooses from the same inputs (its Gloo binds there too).
  dist::NicChoice nic = dist::choose_nic({facts.master_addr, c.nic, c.node_ip_address});
  dist::apply_nic_env(nic);
  const std::string token = required_cluster_token(c.cluster_token, facts.nnodes, "to every process");
  // The head's rank 0 joins the groups once every node has joined; wait for that here, so the
  // groups' 30 s bootstrap wait starts when all nodes are up.
  const dist::HeadAddress head{facts.master_addr, static_cast<uint16_t>(facts.master_port), token, nic.ip};
  const auto deadline = clock::now() + std::chrono::milliseconds(static_cast<int64_t>(c.join_timeout_s * 1000));
  std::string last_error = "no answer yet";
  for (;;) {
    try {
      if (dist::query_cluster_status(head, std::chrono::seconds(5)).formed) break;
      last_error = "the cluster has not formed yet";
    } catch (const Error& e) {
      last_error = e.what();
    }
    if (clock::now() >= deadline)
      fail(ErrorKind::kNetwork,
           "rank {} (local rank {} of node {}): the cluster at {}:{} did not form within {} s ({}); check that every "
           "node's local rank 0 runs and reaches the head",
           facts.rank, facts.local_rank, facts.node_rank, facts.master_addr, facts.master_port, c.join_timeout_s,
           last_error);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  WorkerFlags w;
  w.worker_rank = facts.rank;
  w.worker_port = facts.master_port;
  w.worker_master_addr = facts.master_addr;
  w.worker_bind_ip = nic.ip;
  w.worker_first_rank = facts.node_rank * facts.local_world_size;
  w.worker_local_ranks = facts.local_world_size;
  w.worker_node_rank = facts.node_rank;
  set_rank_token(token);
  return run_worker_rank(f, w);
}

NodeFailureHook::NodeFailureHook(dist::NodeSession* s, RankLauncher* launcher) : session_(s) {
  if (session_ && session_->server()) {
    session_->server()->set_on_node_failure(
        [launcher](const dist::RankFailure& rf) { launcher->report_failure(rf.reason); });
    session_->server()->set_on_rank_lost([launcher](const std::string& what) { launcher->report_failure(what); });
  }
}

NodeFailureHook::~NodeFailureHook() {
  if (session_ && session_->server()) {
    session_->server()->set_on_node_failure(nullptr);
    session_->server()->set_on_rank_lost(nullptr);
  }
}

AwaitNodesLeaving::~AwaitNodesLeaving() {
  if (!session_ || !session_->server() || std::uncaught_exceptions() > 0) return;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    bool others_gone = true;
    for (const dist::NodeStatus& n : session_->server()->status().nodes) others_gone &= n.node_rank == 0 || !n.alive;
    if (others_gone) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  TLOG_WARN("some nodes did not leave within 10 s of the end of the job");
}

HeadEngine start_head_engine(const EngineFlags& f, std::unique_ptr<dist::NodeSession> session,
                             const dist::LaunchFacts& facts, int argc, char** argv) {
  const int nnodes = facts.nnodes;
  HeadEngine h;
  h.session = std::move(session);
  h.await_nodes = std::make_unique<AwaitNodesLeaving>(h.session.get());
  const int world = f.tensor_parallel_size * f.pipeline_parallel_size;
  if (world == 1) {
    h.backend = make_backend_for(f);
    EngineConfig ec = engine_config(f);
    plan_or_fail(f, *h.backend, ec);  // before any weight is read
    h.llm = std::make_unique<LLMEngine>(load_model(load_options(f), *h.backend), *h.backend, ec);
    return h;
  }
  EngineConfig ec = engine_config(f, /*parallel_supported=*/true);
  h.backend = make_rank_backend(f, h.session ? world / nnodes : world);  // rank 0: local rank 0
  plan_or_fail(f, *h.backend, ec, h.session ? nnodes : 1);               // before any rank starts or any weight is read
  h.launcher = h.session ? std::make_unique<RankLauncher>(f, argc, argv, placement_of(f, *h.session, facts))
                         : std::make_unique<RankLauncher>(f, argc, argv);
  h.node_hook = std::make_unique<NodeFailureHook>(h.session.get(), h.launcher.get());
  h.llm = std::make_unique<LLMEngine>(h.launcher->make_executor(*h.backend), ec);
  return h;
}

}  // namespace tessera::cli
