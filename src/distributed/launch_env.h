// Where this process sits in the job: node count, node rank, master, and, when a launcher
// started one process per rank, world rank and local rank.
//
// One precedence, highest first (the first source whose variables are set supplies the facts;
// the startup log names it):
//   1. explicit flags: --nnodes, --node-rank, --master-addr, --master-port
//   2. Kubernetes LeaderWorkerSet: LWS_GROUP_SIZE, LWS_WORKER_INDEX, LWS_LEADER_ADDRESS
//      (one pod per node)
//   3. torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (GROUP_RANK when set),
//      MASTER_ADDR, MASTER_PORT (MASTER_PORT + 1 when TORCHELASTIC_USE_AGENT_STORE=True: torchrun's
//      agent serves its own store on MASTER_PORT)
//   4. Open MPI / PMIx: OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}, or PMIX_RANK
//   5. Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_NODEID, SLURM_LOCALID, the step's node count and
//      tasks per node; the master is MASTER_ADDR, else the first host of the step's (or the
//      job's) node list, with Slurm's compressed hostlist expanded (`gnode[10,20]`)
//   6. MPICH / PMI: PMI_RANK, PMI_SIZE (MPI_LOCALRANKID, MPI_LOCALNRANKS when set)
// A lower source that is also set is ignored, and the log says so: mpirun inside a Slurm
// allocation takes Open MPI's ranks (Slurm's variables describe the allocation, not the rank).
//
// A launcher may start one process per node (tessera spawns the node's ranks) or one per rank
// (one per GPU: then its world size must equal TP x PP and the local rank 0 of each node does
// the node's part). A flag that disagrees with the launcher's environment, a world size that
// does not divide into nodes, and a process count that is neither of the two layouts are
// errors naming both sides, never a silent choice: a mismatch there is the classic stale-script
// bug (an sbatch script that expands $SLURM_NODEID in the batch shell gives every node rank 0).
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace tessera::dist {

enum class LaunchSource { kFlags, kLeaderWorkerSet, kTorchrun, kOpenMpi, kSlurm, kPmi, kSingleNode };
const char* launch_source_name(LaunchSource s);  // "Slurm", "Open MPI", "LeaderWorkerSet", ...

struct LaunchFlags {
  std::optional<int> nnodes, node_rank;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  // TP x PP of the job when the caller knows it (0: not known). With it, a launcher's process
  // count is checked against the two layouts (one process per node, one per rank).
  int parallel_ranks = 0;
};

struct LaunchFacts {
  LaunchSource source = LaunchSource::kSingleNode;
  int nnodes = 1;
  int node_rank = 0;
  // Set when a launcher started the processes (mpirun, srun, torchrun); -1 when the node's
  // facts come from flags or a LeaderWorkerSet.
  int world_size = -1;
  int rank = -1;
  int local_rank = -1;
  int local_world_size = -1;
  // The launcher started one process per rank (several per node): this process is world rank
  // `rank`; the node's local rank 0 joins the rendezvous, the others run their rank only.
  bool one_process_per_rank = false;
  std::string master_addr;  // empty on one node
  int master_port = 29500;
  std::string master_from;         // "--master-addr", "MASTER_ADDR", "the first node of SLURM_JOB_NODELIST=..."
  std::vector<std::string> notes;  // for the startup log: lower sources that were set and ignored
  bool is_head() const { return node_rank == 0; }
  std::string describe() const;  // for the startup log
};

using EnvLookup = std::function<const char*(const char*)>;
// Throws Error(kInvalidArgument) naming the variable or flag at fault (both sides of a contradiction).
LaunchFacts resolve_launch(const LaunchFlags& flags, const EnvLookup& env);
LaunchFacts resolve_launch(const LaunchFlags& flags);  // this process's environment

// Slurm's compressed host list, expanded in order: "n[01-04,7]" -> n01 n02 n03 n04 n7,
// "gnode[10,20]", "a[1-2]-b[1-2]" -> a1-b1 a1-b2 a2-b1 a2-b2, "x,y[1-2]". Throws
// Error(kInvalidArgument) on a malformed list or more than 65536 hosts.
std::vector<std::string> expand_hostlist(const std::string& list);

// The variables resolve_launch reads (for a process that starts a job of its own, which must not
// inherit its launcher's facts).
const std::vector<const char*>& launcher_variable_names();

}  // namespace tessera::dist
