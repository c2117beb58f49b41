#include "engine/worker.h"

#include "backend/devices.h"
#include "core/error.h"
#include "distributed/join_groups.h"
#include "engine/executor.h"
#include "engine/spec/mtp_drafter.h"

namespace tessera {

namespace {

// Every rank joins the same groups in the same order (dist/join_groups.h chooses their
// communicators): world (plans), tp, pp; a CUDA rank's data plane runs on its backend stream.
std::unique_ptr<dist::ProcessGroups> join_groups(const WorkerOptions& o, Backend& backend) {
  dist::JoinGroupsOptions j;
  j.rank = o.rank;
  j.layout = o.layout;
  j.node_rank = o.node_rank;
  j.ranks_per_node = o.ranks_per_node;
  j.store_host = o.store_host;
  j.store_port = o.store_port;
  j.token = o.token;
  j.bind_ip = o.bind_ip;
  j.namer = o.namer;
  j.device_tensors = backend.device().type == DeviceType::kCUDA;
  if (j.device_tensors) {
    j.device_index = backend.device().index;
    j.stream = cuda_backend_stream(backend);
  }
  j.disable_custom_all_reduce = o.disable_custom_all_reduce;
  return dist::join_process_groups(j);
}

// The TP and PP groups (what a step's collectives and graphs use).
std::vector<dist::Communicator*> data_groups(dist::ProcessGroups& g) {
  std::vector<dist::Communicator*> v;
  if (g.tp) v.push_back(g.tp.get());
  if (g.pp) v.push_back(g.pp.get());
  return v;
}

// Sends a tensor this rank computed to `peer` over `comm`: as it is when the communicator
// takes device tensors or the tensor is host memory, else through a host copy.
void send_tensor(Backend& be, dist::Communicator& comm, const Tensor& t, int peer) {
  if (comm.stream_ordered() || t.device().type == DeviceType::kCPU) {
    if (!comm.stream_ordered()) be.synchronize();
    comm.send(t, peer);
    return;
  }
  Tensor host = host_empty(t.shape(), t.dtype());
  be.copy_to_host(host.raw(), t);
  comm.send(host, peer);
}

}  // namespace

ParallelContext parallel_context(const dist::ParallelLayout& l, int rank, bool expert_parallel) {
  return {l.tp_rank(rank), l.tensor_parallel, l.pp_rank(rank), l.pipeline_parallel, expert_parallel};
}

Worker::Worker(const WorkerOptions& o, Backend& backend)
    : backend_(backend), pc_(parallel_context(o.layout, o.rank, o.enable_expert_parallel)), loads_mtp_(o.load.mtp) {
  groups_ = join_groups(o, backend);
  LoadOptions lo = o.load;
  lo.parallel = pc_;
  lo.runtime.tp = groups_->tp.get();
  lo.runtime.pp = groups_->pp.get();
  model_ = load_model(lo, backend);
  runner_ = std::make_unique<ModelRunner>(*model_, backend);
  runner_->watch(data_groups(*groups_));
}

Worker::~Worker() = default;

void Worker::raise_if_failed() {
  for (dist::Communicator* c : data_groups(*groups_)) c->raise_if_failed();
}

void Worker::run_step_loop() {
  TESSERA_CHECK(groups_->world->rank() != 0, "rank 0 runs its steps from the engine, not from plans");
  PlanLimits limits;
  limits.vocab_size = model_->config().vocab_size;
  for (;;) {
    StepPlan plan = decode_step_plan(receive_plan_bytes(*groups_), limits);
    switch (plan.kind) {
      case PlanKind::kShutdown:
        return;
      case PlanKind::kInitCache:
        runner_->init_cache(plan.cache);
        limits.num_blocks = plan.cache.num_blocks;
        limits.num_state_slots = plan.cache.num_state_slots;
        break;
      case PlanKind::kStep:
        run_step(plan);
        break;
      case PlanKind::kMtpDraft:
        run_mtp_plan(plan);
        break;
    }
  }
}

void Worker::run_step(const StepPlan& plan) {
  if (!runner_->cache_ready()) fail(ErrorKind::kCorrupt, "step plan before the cache was initialised");
  Tensor logits = run(plan.input, plan.sampling);
  // With a pipeline, the last stage's TP rank 0 samples and sends the tokens, then the host
  // rows, back to rank 0 over this shard's pipeline group.
  if (pc_.pp_size > 1 && model_->returns_logits()) {
    const auto [ids, rows] = sample_on_device(backend_, logits, plan.sampling);
    send_tensor(backend_, *groups_->pp, ids, 0);
    if (rows.defined()) send_tensor(backend_, *groups_->pp, rows, 0);
  }
  raise_if_failed();
}

Tensor Worker::run_mtp(const MtpDraftInput& in) {
  if (!model_->has_mtp()) return Tensor();  // (a stage before the last)
  return runner_->mtp().draft(in);
}

void Worker::run_mtp_plan(const StepPlan& plan) {
  if (!runner_->cache_ready()) fail(ErrorKind::kCorrupt, "MTP plan before the cache was initialised");
  if (!loads_mtp_) fail(ErrorKind::kCorrupt, "MTP plan for a job loaded without the MTP layer");
  const Tensor drafts = run_mtp(plan.mtp);
  // With a pipeline, the last stage's TP rank 0 sends the drafts to rank 0 (as the tokens).
  if (pc_.pp_size > 1 && model_->returns_logits() && plan.mtp.num_drafting > 0)
    send_tensor(backend_, *groups_->pp, compact_drafts(backend_, drafts, plan.mtp.num_drafting), 0);
  raise_if_failed();
}

}  // namespace tessera
