// One node, TP x PP rank processes (docs/distributed.md, "Execution"): the head process is
// rank 0 and runs the engine; it starts the bootstrap store (the dist layer's control
// channel on 127.0.0.1, a random token), spawns ranks 1..N-1 as copies of this binary with
// the hidden `--worker-rank R --worker-port P` flags, and supervises them.
//
// Liveness: a worker that exits or dies while the job runs is reported at once
// ("rank 2 (pid 123) was killed by signal 9 (Killed)"); the head's next collective fails
// on the closed sockets, and if it has not ended by itself within 5 s the supervisor ends
// the process with exit code 1. Workers get PR_SET_PDEATHSIG(SIGKILL), so a dead head takes
// them along; their world-group wait has no practical limit (the head is their supervisor),
// every other collective keeps the communicator's 30 s timeout.
#pragma once
#include <sys/types.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cli/engine_flags.h"
#include "distributed/communicator.h"
#include "engine/executor.h"

namespace tessera::dist {
class RendezvousServer;
}

namespace tessera::cli {

// Hidden flags a spawned rank runs with.
struct WorkerFlags {
  int worker_rank = -1;                          // >= 1 in a worker
  int worker_port = 0;                           // the head's control channel
  std::string worker_master_addr = "127.0.0.1";  // the head's control-channel address (several nodes: its NIC IP)
  std::string worker_bind_ip = "127.0.0.1";      // this node's NIC address: Gloo binds it
  int worker_first_rank = 0;                     // world rank of this node's first rank (several nodes)
  int worker_local_ranks = 0;                    // rank processes on this node; 0 = all (one node)
  int worker_node_rank = 0;                      // this node's rank in the job (several nodes)
};
void add_worker_flags(CLI::App& app, WorkerFlags& w);

// The backend of one rank process; `local_ranks` rank processes run on this node and this is
// the `local_rank`-th of them. CPU ranks share the cores (threads = cores / local_ranks).
// CUDA ranks (--device cuda, or auto with a GPU) take visible GPU `local_rank` (vLLM's rule,
// dist/rank_gpus.h); more rank processes than visible GPUs is an error naming both numbers. A
// CUDA backend passes vLLM's startup check (check_start_memory) before any weight is read.
std::unique_ptr<Backend> make_rank_backend(const EngineFlags& f, int local_ranks, int local_rank = 0);

// Where this node's ranks sit in a job of several nodes (from dist::NodeSession): their
// world ranks, the head's control channel (which already runs there) and the NIC address.
// Default: one node, the launcher starts its own control channel on 127.0.0.1.
struct RankPlacement {
  int node_rank = 0;       // this node's rank in the job (0 = the head); its ranks' NCCL host
  int first_rank = 0;      // world rank of this node's first rank (0 on the head)
  int local_ranks = 0;     // rank processes on this node; 0 = all of them (one node)
  std::string store_host;  // the head's control-channel address; empty = one node
  uint16_t store_port = 0;
  std::string token;      // the cluster token (handed to the ranks in the environment)
  std::string bind_ip;    // this node's NIC address (Gloo binds it)
  dist::RankNamer namer;  // "rank 1 (node 1, 10.0.0.2)" in rank 0's errors
  // A launcher (srun, mpirun, torchrun) started one process per rank: the node's other local
  // ranks run by themselves, so this launcher spawns only local rank 0 (none on the head, where
  // this process is rank 0).
  bool launcher_started_ranks = false;
};

class RankLauncher {
 public:
  // Starts the control channel (one node) and spawns this node's workers: `argv` (argc
  // entries, argv[0] the verb) are re-run with the worker flags appended. On the head
  // (first_rank 0) this process is rank 0 and is not spawned.
  RankLauncher(const EngineFlags& f, int argc, char** argv, RankPlacement placement = {});
  // Stops supervising, gives the workers 10 s to finish their shutdown, then kills them.
  ~RankLauncher();
  RankLauncher(const RankLauncher&) = delete;
  RankLauncher& operator=(const RankLauncher&) = delete;

  // Rank 0's executor: joins the groups (with the workers) and loads rank 0's shard.
  std::unique_ptr<Executor> make_executor(Backend& backend);
  // "" while every worker runs (or exited after the shutdown plan); else what happened.
  std::string failure() const;
  // failure(), waiting up to `timeout` for one (a collective may fail before the reaper sees
  // the process gone).
  std::string wait_failure(std::chrono::milliseconds timeout) const;
  // A failure seen elsewhere (a node lost, from the control channel): treated as a dead rank.
  void report_failure(const std::string& what);
  // Every spawned worker has exited with status 0 (after the shutdown plan).
  bool all_exited_ok() const { return exited_ok_ == static_cast<int>(pids_.size()); }

 private:
  void supervise();

  EngineFlags flags_;
  int world_ = 1;
  std::string token_;
  std::unique_ptr<dist::RendezvousServer> server_;
  std::vector<pid_t> pids_;  // index r-1 = rank r
  std::vector<bool> reaped_;
  mutable std::mutex mu_;
  std::string failure_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> exited_ok_{0};
  RankPlacement placement_;
  std::thread supervisor_;
};

// The body of a worker rank process (run_generate/run_serve call it when --worker-rank is set).
// SIGINT and SIGTERM are ignored: the head drains and its shutdown plan ends the ranks.
int run_worker_rank(const EngineFlags& f, const WorkerFlags& w);
// The token run_worker_rank reads (a rank a launcher started gets the cluster token).
void set_rank_token(const std::string& token);

}  // namespace tessera::cli
