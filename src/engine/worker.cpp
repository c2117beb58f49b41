#include "engine/worker.h"

#include <chrono>

#include "backend/devices.h"
#include "core/error.h"
#include "dist/control_store.h"
#include "dist/custom_all_reduce_communicator.h"
#include "dist/gloo_communicator.h"
#include "engine/executor.h"
#include "engine/spec/mtp_drafter.h"

#ifdef TESSERA_HAVE_NCCL
#include "dist/nccl_communicator.h"
#endif

namespace tessera {

namespace {

constexpr std::chrono::milliseconds kCollectiveTimeout{std::chrono::seconds(30)};
// The world group carries the step plans: workers wait on it for as long as the head is
// idle, so its limit is only a backstop (the head supervises them; PDEATHSIG ends them).
constexpr std::chrono::milliseconds kPlanWaitTimeout{std::chrono::hours(24 * 30)};
// A CUDA rank whose data plane failed is done: its watchdog ends it this long after the
// abort if its thread is waiting elsewhere (the next step plan) and never sees the error.
constexpr std::chrono::milliseconds kExitAfterDataPlaneFailure{std::chrono::seconds(3)};

#ifdef TESSERA_HAVE_NCCL
// CUDA ranks' TP and PP groups: NCCL on the backend's stream (no host wait per collective),
// small TP all-reduces through the one-shot custom kernel where every rank of the group is on
// this host with peer access.
void join_nccl_groups(const WorkerOptions& o, Backend& backend, std::shared_ptr<dist::ControlStoreClient> store,
                      dist::ProcessGroups& g) {
  dist::NcclOptions n;
  n.store = store;
  n.device_index = backend.device().index;
  n.timeout = kCollectiveTimeout;
  n.namer = o.namer;
  n.stream = cuda_backend_stream(backend);
  n.exit_after_failure = kExitAfterDataPlaneFailure;
  dist::NcclCommunicatorFactory data_factory(n);  // sets NCCL_NVLS_ENABLE=0
  g.tp = data_factory.create(o.layout.tp_group(o.rank));
  g.pp = data_factory.create(o.layout.pp_group(o.rank));
  dist::CustomAllReduceConfig car;
  car.disable = o.disable_custom_all_reduce;
  car.store = store;
  car.device_index = n.device_index;
  car.stream = n.stream;
  car.timeout = kCollectiveTimeout;
  car.namer = o.namer;
  g.tp = dist::with_custom_all_reduce(std::move(g.tp), car);
}
#endif

// Every rank creates the groups in the same order: world (plans), tp, pp. The world group
// carries host bytes (step plans) over Gloo; the tp and pp groups carry the backend's
// tensors: Gloo for CPU ranks, NCCL for CUDA ranks.
std::unique_ptr<dist::ProcessGroups> join_groups(const WorkerOptions& o, Backend& backend) {
  const bool local = o.bind_ip == "127.0.0.1";
  auto store = std::make_shared<dist::ControlStoreClient>(
      dist::HeadAddress{o.store_host, o.store_port, o.token, local ? "" : o.bind_ip}, o.rank, std::chrono::seconds(60));
  dist::GlooOptions gloo;
  gloo.store = store;
  gloo.ip = o.bind_ip;
  gloo.namer = o.namer;
  gloo.timeout = kPlanWaitTimeout;
  auto g = std::make_unique<dist::ProcessGroups>();
  g->world = dist::GlooCommunicatorFactory(gloo).create(o.layout.world_group(o.rank));
  if (backend.device().type == DeviceType::kCUDA) {
#ifdef TESSERA_HAVE_NCCL
    join_nccl_groups(o, backend, store, *g);
    return g;
#else
    fail(ErrorKind::kUnsupported, "CUDA rank processes need NCCL: rebuild with -DTESSERA_CUDA=ON");
#endif
  }
  gloo.timeout = kCollectiveTimeout;
  dist::GlooCommunicatorFactory data_factory(gloo);
  g->tp = data_factory.create(o.layout.tp_group(o.rank));
  g->pp = data_factory.create(o.layout.pp_group(o.rank));
  return g;
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
  Tensor logits = runner_->run(plan.input);
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
