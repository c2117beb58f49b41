// Where a job's TP x PP ranks go on the nodes of a persistent cluster (`tessera node start`).
// The job runs as the per-node launch does: every chosen node runs the same number of ranks,
// world ranks node by node (rank = pp_rank x TP + tp_rank), so with R ranks per node a TP
// group stays inside a node when R is a multiple of TP, and the PP stages go across nodes
// (the seeds' rule: TP = GPUs per node, PP = nodes). TP across nodes happens only when the
// user's TP exceeds what a node holds, and is named in a warning.
#pragma once
#include <string>
#include <vector>

namespace tessera::dist {

struct NodeSlots {
  int node_rank = 0;  // in the cluster; 0 = the head, where the job's engine runs
  int slots = 1;      // ranks it can run (its GPUs, or --num-gpus)
  bool alive = true;
  std::string ip, nic;
};

struct RankPlacement2D {
  std::vector<int> nodes;  // cluster node ranks, the head first; job node rank = index
  int ranks_per_node = 0;
  bool tp_crosses_nodes = false;
  std::string warning;  // set when a TP group spans nodes: which link its all-reduces cross
};

// The fewest nodes (the head always among them) whose slots hold TP x PP ranks in equal
// shares. Throws Error(kInvalidArgument) naming every node's slots when nothing fits.
RankPlacement2D place_ranks(int tp, int pp, const std::vector<NodeSlots>& nodes);

// This machine's NVIDIA GPUs by name (from the driver's /proc/driver/nvidia/gpus, so a CPU
// build sees them too), limited to the first N when CUDA_VISIBLE_DEVICES lists N devices.
// Empty without the driver. `proc_root` is a parameter for the tests.
std::vector<std::string> local_gpu_names(const std::string& proc_root = "/proc/driver/nvidia/gpus");

}  // namespace tessera::dist
