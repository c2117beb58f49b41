// One rank of a TP x PP job, the engine's counterpart of vLLM's Worker (docs/engine.md,
// "Worker"): it joins the process groups, loads this rank's shard of the model, allocates
// its cache and runs its steps. Rank 0's worker is driven by the MultiprocExecutor (one step
// at a time, on the engine thread); every other rank's worker runs `run_step_loop`, taking
// each step from the plan rank 0 broadcasts until the shutdown plan. cli/ only turns flags
// into WorkerOptions and starts the processes (cli/rank_launcher.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/process_groups.h"
#include "engine/model_loader.h"
#include "engine/model_runner.h"
#include "engine/step_plan.h"

namespace tessera {

struct WorkerOptions {
  int rank = 0;  // world rank
  dist::ParallelLayout layout;
  // This rank's job node and the ranks each node runs (0: every rank on this node), from the
  // launcher: NCCL's host identity and where the custom all-reduce may run (dist/join_groups.h).
  int node_rank = 0;
  int ranks_per_node = 0;
  bool enable_expert_parallel = false;
  bool disable_custom_all_reduce = false;  // TP all-reduces over NCCL only (CUDA ranks)
  LoadOptions load;                        // the model; `parallel` and `runtime` are set per rank
  // The groups' bootstrap store: the head's control channel, with the job's token; Gloo binds
  // `bind_ip` (this node's NIC address; 127.0.0.1 on one node).
  std::string store_host = "127.0.0.1";
  uint16_t store_port = 0;
  std::string token;
  std::string bind_ip = "127.0.0.1";
  dist::RankNamer namer;  // "rank 1 (node 1, 10.0.0.2)" in errors
};

// The TP/PP position of world rank `rank` in `layout`.
ParallelContext parallel_context(const dist::ParallelLayout& layout, int rank, bool expert_parallel);

class Worker {
 public:
  // Joins the groups (every rank of the job at once) and loads this rank's shard on `backend`.
  Worker(const WorkerOptions& options, Backend& backend);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  const ModelConfig& model_config() const { return model_->config(); }
  std::vector<LayerCacheSpec> cache_specs() const { return model_->cache_specs(); }
  Backend& backend() { return backend_; }
  const ParallelContext& context() const { return pc_; }
  dist::ProcessGroups& groups() { return *groups_; }

  // Allocates this rank's cache (and graph buffers).
  void init_cache(const CacheInit& init) { runner_->init_cache(init); }
  // This rank's part of one step; the logits on the rank that returns them (the greedy rows of
  // `sampling` as stand-in rows that hold only their pick: argmax_rows).
  Tensor run(const ModelInput& input, const StepSampling& sampling) {
    return runner_->run(input, argmax_rows(sampling));
  }
  // Whether the job runs the MTP layer (LoadOptions::mtp; the last pipeline stage holds it).
  bool loads_mtp() const { return loads_mtp_; }
  // The MTP passes after the last step (MtpDrafter::draft): the drafts [passes, W] on the
  // last stage (right on its TP rank 0; its other TP ranks get them too), undefined on the
  // stages before it, which hold no part of the layer.
  Tensor run_mtp(const MtpDraftInput& in);
  // Throws the TP/PP communicators' failure, if any (an aborted collective leaves garbage
  // behind a clean synchronize).
  void raise_if_failed();
  // World ranks > 0: receives the plans from rank 0 and runs them until the shutdown plan.
  // Throws Error on a damaged plan or a communicator failure.
  void run_step_loop();

 private:
  void run_step(const StepPlan& plan);
  void run_mtp_plan(const StepPlan& plan);

  Backend& backend_;
  ParallelContext pc_;
  bool loads_mtp_ = false;
  // Declared in the order they are built; destroyed backwards (the runner reads the model,
  // the model holds the groups' communicators).
  std::unique_ptr<dist::ProcessGroups> groups_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<ModelRunner> runner_;
};

}  // namespace tessera
