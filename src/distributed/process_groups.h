// Ranks = TP x PP. TP ranks are adjacent (rank = pp_rank * tp + tp_rank), so with
// ranks placed node by node a TP group stays inside a node (NVLink/PCIe) and only the
// pipeline's activations cross nodes, the rule the field reports arrive at.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"

namespace tessera::dist {

struct ParallelLayout {
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int world_size() const { return tensor_parallel * pipeline_parallel; }
  int tp_rank(int world_rank) const { return world_rank % tensor_parallel; }
  int pp_rank(int world_rank) const { return world_rank / tensor_parallel; }
  GroupInfo world_group(int world_rank) const;
  GroupInfo tp_group(int world_rank) const;  // "tp<pp_rank>": the ranks of one pipeline stage
  GroupInfo pp_group(int world_rank) const;  // "pp<tp_rank>": one shard's ranks across stages
  // Throws Error(kInvalidArgument) when sizes are not positive or do not match the world.
  void validate(int world_size, int ranks_per_node) const;
};

// Builds a communicator for a group; the Gloo and NCCL factories implement it.
class CommunicatorFactory {
 public:
  virtual ~CommunicatorFactory() = default;
  virtual std::unique_ptr<Communicator> create(const GroupInfo& group) = 0;
};

struct ProcessGroups {
  std::unique_ptr<Communicator> world, tp, pp;
};

// Every rank calls this with the same layout; groups are created in the same order
// everywhere (world, tp, pp) so that their bootstraps pair up.
ProcessGroups create_process_groups(CommunicatorFactory& factory, const ParallelLayout& layout, int world_rank);

}  // namespace tessera::dist
