// Several nodes for the verbs that run a model (generate, serve): every node runs the same
// command with its own --node-rank (docs/distributed.md, "Startup sequence"). The head
// (node 0) runs the engine (and the HTTP server); every other node only spawns and supervises
// its rank processes. World ranks are numbered node by node: node k owns
// [k x L, (k + 1) x L) with L = TP x PP / nnodes.
#pragma once
#include <chrono>
#include <memory>

#include "cli/engine_flags.h"
#include "cli/rank_launcher.h"
#include "distributed/launch_env.h"
#include "distributed/node_session.h"

namespace tessera::cli {

// Checks --distributed-executor-backend and resolves the launch facts (flags, mpirun, Slurm,
// LeaderWorkerSet); fails with a clear message when they do not fit TP x PP. With `ray` and
// a persistent cluster's head on this machine (`tessera node start --head`), places the
// ranks on its nodes (dist/placement.h) and records the choice in c.cluster/cluster_nodes.
// VLLM_HOST_IP fills --node-ip-address.
dist::LaunchFacts resolve_cluster(const EngineFlags& f, ClusterFlags& c);

// nnodes > 1: NIC choice, fingerprint and rendezvous (blocks until every node joined, or
// fails naming what went wrong); on a persistent cluster it first hands the other nodes
// their job (this command with their per-node flags). nnodes == 1: nullptr.
std::unique_ptr<dist::NodeSession> start_node_session(const EngineFlags& f, const ClusterFlags& c,
                                                      const dist::LaunchFacts& facts);

// Where this node's ranks sit, for RankLauncher.
RankPlacement placement_of(const EngineFlags& f, const dist::NodeSession& s, const dist::LaunchFacts& facts);

// Node rank > 0: spawns this node's ranks (one process per rank under a launcher: only its
// local rank 0) and supervises them and the head until the head's shutdown plan ends them (0,
// once a heartbeat round trip shows the head still counts this node) or a rank fails, the head
// is gone, or the head declared this node dead (non-zero, naming which). SIGTERM/SIGINT (a scheduler's cancel reaches
// every node) waits up to 60 s for the head's shutdown; a second one ends the ranks at once.
int run_worker_node(const EngineFlags& f, dist::NodeSession& s, const dist::LaunchFacts& facts, int argc, char** argv);

// A launcher started one process per rank and this one is not its node's local rank 0: it
// runs world rank facts.rank and nothing else (the local rank 0 joins the rendezvous for the
// node). Waits until the cluster has formed (bounded by --join-timeout), then runs the rank.
int run_launched_rank(const EngineFlags& f, const ClusterFlags& c, const dist::LaunchFacts& facts);

// The head: a lost node (control channel closed, heartbeats missed) fails the job like a dead
// local rank. Declare it after the launcher (it must go first).
class NodeFailureHook {
 public:
  NodeFailureHook(dist::NodeSession* s, RankLauncher* launcher);
  ~NodeFailureHook();
  NodeFailureHook(const NodeFailureHook&) = delete;
  NodeFailureHook& operator=(const NodeFailureHook&) = delete;

 private:
  dist::NodeSession* session_;
};

// The head, at an orderly end: waits (up to 10 s) for the other nodes to leave before the
// control channel closes, so none of them reports the head as lost. Declare it before the
// launcher (it runs after the ranks got their shutdown plan).
class AwaitNodesLeaving {
 public:
  explicit AwaitNodesLeaving(dist::NodeSession* s) : session_(s) {}
  ~AwaitNodesLeaving();
  AwaitNodesLeaving(const AwaitNodesLeaving&) = delete;
  AwaitNodesLeaving& operator=(const AwaitNodesLeaving&) = delete;

 private:
  dist::NodeSession* session_;
};

// Rank 0's engine and what it rests on. Members end in reverse order: the engine, then the
// failure hook before the launcher, then AwaitNodesLeaving before the session closes.
struct HeadEngine {
  std::unique_ptr<dist::NodeSession> session;  // several nodes only
  std::unique_ptr<AwaitNodesLeaving> await_nodes;
  std::unique_ptr<RankLauncher> launcher;  // TP x PP > 1 only
  std::unique_ptr<NodeFailureHook> node_hook;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LLMEngine> llm;  // for the AsyncEngine to take
};

// The head's engine (generate, serve): in this process when TP x PP = 1, else over rank
// processes that a RankLauncher spawns on this node (and, with `session`, on the others).
HeadEngine start_head_engine(const EngineFlags& f, std::unique_ptr<dist::NodeSession> session,
                             const dist::LaunchFacts& facts, int argc, char** argv);

}  // namespace tessera::cli
