#include "distributed/process_groups.h"

#include "core/error.h"

namespace tessera::dist {

GroupInfo ParallelLayout::world_group(int world_rank) const {
  GroupInfo g{"world", {}, world_rank};
  for (int r = 0; r < world_size(); ++r) g.world_ranks.push_back(r);
  return g;
}

GroupInfo ParallelLayout::tp_group(int world_rank) const {
  int stage = pp_rank(world_rank);
  GroupInfo g{"tp" + std::to_string(stage), {}, tp_rank(world_rank)};
  for (int t = 0; t < tensor_parallel; ++t) g.world_ranks.push_back(stage * tensor_parallel + t);
  return g;
}

GroupInfo ParallelLayout::pp_group(int world_rank) const {
  int shard = tp_rank(world_rank);
  GroupInfo g{"pp" + std::to_string(shard), {}, pp_rank(world_rank)};
  for (int p = 0; p < pipeline_parallel; ++p) g.world_ranks.push_back(p * tensor_parallel + shard);
  return g;
}

void ParallelLayout::validate(int world_size_seen, int ranks_per_node) const {
  if (tensor_parallel < 1 || pipeline_parallel < 1)
    fail(ErrorKind::kInvalidArgument, "--tensor-parallel-size and --pipeline-parallel-size must be at least 1");
  if (world_size() != world_size_seen)
    fail(ErrorKind::kInvalidArgument,
         "tensor parallel {} x pipeline parallel {} = {} ranks, but the cluster has {}; make TP x PP equal the "
         "number of GPUs (or CPU ranks) over all nodes",
         tensor_parallel, pipeline_parallel, world_size(), world_size_seen);
  if (ranks_per_node > 0 && tensor_parallel > ranks_per_node && tensor_parallel % ranks_per_node != 0)
    fail(ErrorKind::kInvalidArgument,
         "tensor parallel {} does not divide into nodes of {} ranks; use TP within a node and PP across nodes",
         tensor_parallel, ranks_per_node);
}

ProcessGroups create_process_groups(CommunicatorFactory& factory, const ParallelLayout& layout, int world_rank) {
  if (world_rank < 0 || world_rank >= layout.world_size())
    fail(ErrorKind::kInvalidArgument, "rank {} outside a world of {}", world_rank, layout.world_size());
  ProcessGroups g;
  g.world = factory.create(layout.world_group(world_rank));
  g.tp = factory.create(layout.tp_group(world_rank));
  g.pp = factory.create(layout.pp_group(world_rank));
  return g;
}

}  // namespace tessera::dist
