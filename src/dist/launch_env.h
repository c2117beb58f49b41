// Where this process sits in the job: world size, rank, local rank, node rank, master.
//
// Precedence, highest first:
//   1. explicit flags (--nnodes, --node-rank, --master-addr, --master-port)
//   2. mpirun: OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}, or PMIX_RANK (+ PMIX/OMPI size)
//   3. Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES
//   4. Kubernetes LeaderWorkerSet: LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX (node level)
//   5. MASTER_ADDR / MASTER_PORT (torchrun convention) for the master only
// A flag that disagrees with the launcher's environment is an error (both are named)
// rather than a silent choice: a mismatch there is the classic stale-script bug.
#pragma once
#include <functional>
#include <optional>
#include <string>

namespace tessera::dist {

enum class LaunchSource { kFlags, kMpi, kSlurm, kLeaderWorkerSet, kSingleNode };
const char* launch_source_name(LaunchSource s);

struct LaunchFlags {
  std::optional<int> nnodes, node_rank;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
};

struct LaunchFacts {
  LaunchSource source = LaunchSource::kSingleNode;
  int nnodes = 1;
  int node_rank = 0;
  // Set when a launcher started one process per rank (mpirun, srun); -1 when tessera
  // spawns the local ranks itself.
  int world_size = -1;
  int rank = -1;
  int local_rank = -1;
  int local_world_size = -1;
  std::string master_addr;  // empty on one node
  int master_port = 29500;
  bool is_head() const { return node_rank == 0; }
  std::string describe() const;  // for the startup log
};

using EnvLookup = std::function<const char*(const char*)>;
// Throws Error(kInvalidArgument) naming the variable or flag at fault.
LaunchFacts resolve_launch(const LaunchFlags& flags, const EnvLookup& env);
LaunchFacts resolve_launch(const LaunchFlags& flags);  // this process's environment

}  // namespace tessera::dist
