#include "cli/node_launch.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <thread>

#include "cli/plan_flags.h"
#include "core/error.h"
#include "core/logging.h"
#include "engine/model_loader.h"

namespace tessera::cli {

dist::LaunchFacts resolve_cluster(const EngineFlags& f, const ClusterFlags& c) {
  const std::string& b = c.distributed_executor_backend;
  if (b == "ray") {
    TLOG_INFO(
        "--distributed-executor-backend ray: Ray is not needed; tessera starts and supervises its rank "
        "processes itself (one command per node with --nnodes/--node-rank/--master-addr, no `ray start`). "
        "Continuing with mp");
  } else if (b == "external_launcher") {
    fail(ErrorKind::kUnsupported,
         "--distributed-executor-backend external_launcher is not supported: run one tessera command per node "
         "(mpirun -npernode 1 / srun --ntasks-per-node=1 work; their environment gives the node rank)");
  } else if (!b.empty() && b != "mp" && b != "uni") {
    fail(ErrorKind::kInvalidArgument, "--distributed-executor-backend {}: not one of mp, ray, uni", b);
  }
  dist::LaunchFacts facts = dist::resolve_launch({c.nnodes, c.node_rank, c.master_addr, c.master_port});
  if (facts.rank >= 0 && facts.local_world_size != 1)
    fail(ErrorKind::kInvalidArgument,
         "{} started {} processes on this node; tessera runs one process per node and spawns that node's ranks "
         "itself: start one task per node (mpirun -npernode 1, srun --ntasks-per-node=1)",
         dist::launch_source_name(facts.source), facts.local_world_size);
  const int world = f.tensor_parallel_size * f.pipeline_parallel_size;
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
  TLOG_INFO("{}", facts.describe());
  dist::NodeSessionOptions o;
  o.launch = facts;
  o.nic = c.nic;
  o.node_ip_address = c.node_ip_address;
  o.token = c.cluster_token;
  if (o.token.empty())
    if (const char* t = std::getenv("TESSERA_CLUSTER_TOKEN")) o.token = t;
  if (o.token.empty())
    fail(ErrorKind::kInvalidArgument,
         "{} nodes need a shared secret: pass the same --cluster-token (or TESSERA_CLUSTER_TOKEN) on every node",
         facts.nnodes);
  o.model_dir = f.model;
  o.local_ranks = f.tensor_parallel_size * f.pipeline_parallel_size / facts.nnodes;
  o.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(c.join_timeout_s * 1000));
  return std::make_unique<dist::NodeSession>(o);
}

RankPlacement placement_of(const EngineFlags& f, const dist::NodeSession& s, int nnodes) {
  RankPlacement p;
  p.first_rank = s.first_rank();
  p.local_ranks = f.tensor_parallel_size * f.pipeline_parallel_size / nnodes;
  p.store_host = s.head().host;
  p.store_port = s.head().port;
  p.token = s.head().token;
  p.bind_ip = s.nic().ip;
  p.namer = s.rank_namer();
  return p;
}

int run_worker_node(const EngineFlags& f, dist::NodeSession& s, int nnodes, int argc, char** argv) {
  using clock = std::chrono::steady_clock;
  auto launcher = std::make_unique<RankLauncher>(f, argc, argv, placement_of(f, s, nnodes));
  TLOG_INFO("node {}: supervising its ranks; the head ({}:{}) runs the engine", s.node_rank(), s.head().host,
            s.head().port);
  std::optional<clock::time_point> head_failed_at;
  for (;;) {
    if (launcher->all_exited_ok()) {
      TLOG_INFO("node {}: every rank finished", s.node_rank());
      return 0;
    }
    if (std::string what = launcher->failure(); !what.empty()) {
      // No orderly leave: the head must see this node as lost (its control connection closes).
      std::fprintf(stderr, "error: node %d: %s\n", s.node_rank(), what.c_str());
      std::fflush(nullptr);
      launcher.reset();  // ends the other local ranks
      std::_Exit(1);
    }
    if (std::optional<dist::RankFailure> rf = s.client()->failure()) {
      // The ranks may be finishing after the head's shutdown plan: give them a moment.
      if (!head_failed_at)
        head_failed_at = clock::now();
      else if (clock::now() - *head_failed_at > std::chrono::seconds(3))
        fail(ErrorKind::kNetwork, "node {}: {}; ending this node's ranks", s.node_rank(), rf->reason);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

NodeFailureHook::NodeFailureHook(dist::NodeSession* s, RankLauncher* launcher) : session_(s) {
  if (session_ && session_->server())
    session_->server()->set_on_node_failure(
        [launcher](const dist::RankFailure& rf) { launcher->report_failure(rf.reason); });
}

NodeFailureHook::~NodeFailureHook() {
  if (session_ && session_->server()) session_->server()->set_on_node_failure(nullptr);
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

HeadEngine start_head_engine(const EngineFlags& f, std::unique_ptr<dist::NodeSession> session, int nnodes, int argc,
                             char** argv) {
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
  plan_or_fail(f, *h.backend, ec);                                       // before any rank starts or any weight is read
  h.launcher = h.session ? std::make_unique<RankLauncher>(f, argc, argv, placement_of(f, *h.session, nnodes))
                         : std::make_unique<RankLauncher>(f, argc, argv);
  h.node_hook = std::make_unique<NodeFailureHook>(h.session.get(), h.launcher.get());
  h.llm = std::make_unique<LLMEngine>(h.launcher->make_executor(*h.backend), ec);
  return h;
}

}  // namespace tessera::cli
