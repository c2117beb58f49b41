#include "engine/executor.h"

#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/logging.h"
#include "dist/communicator.h"
#include "dist/process_groups.h"

namespace tessera {

namespace {

constexpr size_t kInlinePlanBytes = 4096;  // decode plans of modest batches fit in one message
constexpr size_t kMaxPlanBytes = 64u << 20;

// The host rows of `logits`, gathered into one scratch tensor [h, V] (undefined when none).
Tensor gather_host_rows(Backend& be, const Tensor& logits, const std::vector<int32_t>& host_rows) {
  if (host_rows.empty()) return Tensor();
  const int64_t h = static_cast<int64_t>(host_rows.size());
  Tensor idx = be.scratch({h}, DType::kI32);
  be.copy_from_host(idx, host_rows.data());
  Tensor rows = be.scratch({h, logits.dim(1)}, DType::kF32);
  be.gather_rows(logits, idx, rows);
  return rows;
}

void check_sampling(const Tensor& logits, const StepSampling& sampling) {
  TESSERA_CHECK(logits.defined() && logits.ndim() == 2 && logits.dim(0) == static_cast<int64_t>(sampling.rows.size()),
                "step: {} sampling rows for logits {}", sampling.rows.size(), logits.defined() ? logits.str() : "none");
}

// The step's token ids (i32 [n]) and host rows ([h, V], undefined when none), on the device.
std::pair<Tensor, Tensor> sample_on_device(Backend& be, const Tensor& logits, const StepSampling& sampling) {
  check_sampling(logits, sampling);
  Tensor ids = be.scratch({logits.dim(0)}, DType::kI32);
  be.sample(logits, sampling.rows, ids);
  return {ids, gather_host_rows(be, logits, sampling.host_rows)};
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

// Receives into host memory `dst` (nbytes of it) from `peer`.
void recv_tensor(Backend& be, dist::Communicator& comm, Shape shape, DType dtype, void* dst, int peer) {
  if (comm.stream_ordered()) {
    Tensor t = be.scratch(shape, dtype);
    comm.recv(t, peer);
    be.copy_to_host(dst, t);
    return;
  }
  Tensor host = host_empty(shape, dtype);
  comm.recv(host, peer);
  std::memcpy(dst, host.raw(), host.nbytes());
}

// The TP and PP groups (what a step's collectives and graphs use).
std::vector<dist::Communicator*> data_groups(dist::ProcessGroups& g) {
  std::vector<dist::Communicator*> v;
  if (g.tp) v.push_back(g.tp.get());
  if (g.pp) v.push_back(g.pp.get());
  return v;
}

void raise_if_failed(dist::ProcessGroups& g) {
  for (dist::Communicator* c : data_groups(g)) c->raise_if_failed();
}

}  // namespace

void sample_logits(Backend& be, const Tensor& logits, const StepSampling& sampling, StepOutput& out) {
  const auto [ids, rows] = sample_on_device(be, logits, sampling);
  const int64_t n = logits.dim(0), V = logits.dim(1);
  out.tokens.resize(static_cast<size_t>(n));
  be.copy_to_host(out.tokens.data(), ids);
  out.host_logits.resize(sampling.host_rows.size() * static_cast<size_t>(V));
  if (rows.defined()) be.copy_to_host(out.host_logits.data(), rows);
  be.synchronize();
}

KvCache allocate_kv_cache(Backend& backend, const std::vector<LayerCacheSpec>& specs, const CacheInit& init) {
  KvCache kv;
  kv.block_size = init.block_size;
  kv.num_blocks = init.num_blocks;
  kv.dtype = init.dtype;
  kv.k_scale = init.k_scale;
  kv.v_scale = init.v_scale;
  kv.num_state_slots = init.num_state_slots;
  // Row `slot` of a state tensor is one sequence's state: [num_state_slots, ...shape].
  auto slots_of = [&](const Shape& per_seq) {
    Shape sh{init.num_state_slots};
    for (int i = 0; i < per_seq.ndim(); ++i) sh.push_back(per_seq[i]);
    return sh;
  };
  for (const auto& s : specs) {
    if (s.kind == CacheKind::kPagedKv) {
      kv.k.push_back(backend.alloc({init.num_blocks, init.block_size, s.num_kv_heads, s.head_dim}, init.dtype));
      kv.v.push_back(backend.alloc({init.num_blocks, init.block_size, s.num_kv_heads, s.head_dim}, init.dtype));
      kv.conv_state.emplace_back();
      kv.ssm_state.emplace_back();
      continue;
    }
    if (init.num_state_slots <= 0)
      fail(ErrorKind::kInvalidArgument,
           "the model has linear-attention layers but the cache was planned without state slots");
    kv.k.emplace_back();
    kv.v.emplace_back();
    kv.conv_state.push_back(backend.alloc(slots_of(s.conv_state_shape), init.conv_dtype));
    kv.ssm_state.push_back(backend.alloc(slots_of(s.ssm_state_shape), init.ssm_dtype));
  }
  return kv;
}

// ---------------------------------------------------------------- local

LocalExecutor::LocalExecutor(std::unique_ptr<Model> model, Backend& backend)
    : model_(std::move(model)), backend_(backend), runner_(*model_, backend) {}

void LocalExecutor::init_kv_cache(const CacheInit& init) { runner_.init_cache(init); }

void LocalExecutor::execute(const ModelInput& input, const StepSampling& sampling, StepOutput& out) {
  timer_.start();
  Tensor logits = runner_.run(input);
  timer_.mark(0, "enqueue forward");
  sample_logits(backend_, logits, sampling, out);
  timer_.mark(1, "sample + wait for the GPU");
  timer_.pass_done();
}

// ---------------------------------------------------------------- plan transport

void broadcast_plan_bytes(dist::ProcessGroups& groups, const std::vector<uint8_t>& bytes) {
  if (bytes.size() > kMaxPlanBytes)
    fail(ErrorKind::kInvalidArgument, "step plan of {} bytes is over the {} byte limit", bytes.size(), kMaxPlanBytes);
  Tensor first = host_empty({static_cast<int64_t>(kInlinePlanBytes)}, DType::kU8);
  uint32_t n = static_cast<uint32_t>(bytes.size());
  std::memcpy(first.raw(), &n, 4);
  size_t head = std::min(bytes.size(), kInlinePlanBytes - 4);
  std::memcpy(static_cast<char*>(first.raw()) + 4, bytes.data(), head);
  groups.world->broadcast(first, 0);
  if (bytes.size() > head) {
    Tensor rest = host_empty({static_cast<int64_t>(bytes.size() - head)}, DType::kU8);
    std::memcpy(rest.raw(), bytes.data() + head, bytes.size() - head);
    groups.world->broadcast(rest, 0);
  }
}

std::vector<uint8_t> receive_plan_bytes(dist::ProcessGroups& groups) {
  Tensor first = host_empty({static_cast<int64_t>(kInlinePlanBytes)}, DType::kU8);
  groups.world->broadcast(first, 0);
  uint32_t n = 0;
  std::memcpy(&n, first.raw(), 4);
  if (n > kMaxPlanBytes) fail(ErrorKind::kCorrupt, "step plan: {} bytes announced, limit {}", n, kMaxPlanBytes);
  std::vector<uint8_t> bytes(n);
  size_t head = std::min<size_t>(n, kInlinePlanBytes - 4);
  std::memcpy(bytes.data(), static_cast<char*>(first.raw()) + 4, head);
  if (n > head) {
    Tensor rest = host_empty({static_cast<int64_t>(n - head)}, DType::kU8);
    groups.world->broadcast(rest, 0);
    std::memcpy(bytes.data() + head, rest.raw(), n - head);
  }
  return bytes;
}

// ---------------------------------------------------------------- multiprocess (rank 0)

MultiprocExecutor::MultiprocExecutor(std::unique_ptr<Model> model, Backend& backend, ParallelContext pc,
                                     std::unique_ptr<dist::ProcessGroups> groups, std::shared_ptr<void> keep_alive)
    : model_(std::move(model)),
      backend_(backend),
      pc_(pc),
      groups_(std::move(groups)),
      keep_alive_(std::move(keep_alive)),
      runner_(*model_, backend) {
  TESSERA_CHECK(groups_ && groups_->world && groups_->world->rank() == 0, "the multiprocess executor runs on rank 0");
  runner_.watch(data_groups(*groups_));
}

MultiprocExecutor::~MultiprocExecutor() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    TLOG_WARN("could not tell the worker ranks to stop: {}", e.what());
  }
}

void MultiprocExecutor::shutdown() {
  if (shut_down_ || broken_) return;
  shut_down_ = true;
  StepPlan p;
  p.kind = PlanKind::kShutdown;
  broadcast(p);
}

void MultiprocExecutor::broadcast(const StepPlan& plan) {
  try {
    broadcast_plan_bytes(*groups_, encode_step_plan(plan));
  } catch (...) {
    broken_ = true;
    throw;
  }
}

void MultiprocExecutor::init_kv_cache(const CacheInit& init) {
  StepPlan p;
  p.kind = PlanKind::kInitCache;
  p.cache = init;
  broadcast(p);
  runner_.init_cache(init);
}

void MultiprocExecutor::execute(const ModelInput& input, const StepSampling& sampling, StepOutput& out) {
  if (broken_ || shut_down_) fail(ErrorKind::kNetwork, "the rank processes are gone (an earlier step failed)");
  StepPlan p;
  p.kind = PlanKind::kStep;
  p.step = step_++;
  p.input = input;
  p.sampling = sampling;
  broadcast(p);
  try {
    Tensor logits = runner_.run(input);
    if (pc_.pp_size == 1) {
      sample_logits(backend_, logits, sampling, out);
      raise_if_failed(*groups_);  // an aborted collective leaves garbage behind a clean sync
      return;
    }
    // The last stage's TP rank 0 samples and sends the tokens, then the host rows, back over
    // this shard's pipeline group.
    const int64_t n = static_cast<int64_t>(sampling.rows.size()), V = model_->config().vocab_size;
    const int64_t h = static_cast<int64_t>(sampling.host_rows.size());
    dist::Communicator& pp = *groups_->pp;
    out.tokens.resize(static_cast<size_t>(n));
    recv_tensor(backend_, pp, {n}, DType::kI32, out.tokens.data(), pc_.pp_size - 1);
    out.host_logits.resize(static_cast<size_t>(h * V));
    if (h > 0) recv_tensor(backend_, pp, {h, V}, DType::kF32, out.host_logits.data(), pc_.pp_size - 1);
    raise_if_failed(*groups_);
  } catch (const Error& e) {
    broken_ = true;
    // A collective that timed out surfaces first as a failed kernel or stream sync; the
    // communicator knows which peer it waited for, so its error is the one to report.
    if (e.kind() != ErrorKind::kNetwork) raise_if_failed(*groups_);
    throw;
  } catch (...) {
    broken_ = true;
    throw;
  }
}

// ---------------------------------------------------------------- worker ranks

void run_worker_loop(Model& model, Backend& backend, const ParallelContext& pc, dist::ProcessGroups& groups) {
  ModelRunner runner(model, backend);
  runner.watch(data_groups(groups));
  PlanLimits limits;
  limits.vocab_size = model.config().vocab_size;
  const bool sends_tokens = pc.pp_size > 1 && model.returns_logits();
  for (;;) {
    StepPlan plan = decode_step_plan(receive_plan_bytes(groups), limits);
    switch (plan.kind) {
      case PlanKind::kShutdown:
        return;
      case PlanKind::kInitCache:
        runner.init_cache(plan.cache);
        limits.num_blocks = plan.cache.num_blocks;
        limits.num_state_slots = plan.cache.num_state_slots;
        break;
      case PlanKind::kStep: {
        if (!runner.cache_ready()) fail(ErrorKind::kCorrupt, "step plan before the cache was initialised");
        Tensor logits = runner.run(plan.input);
        if (sends_tokens) {
          const auto [ids, rows] = sample_on_device(backend, logits, plan.sampling);
          send_tensor(backend, *groups.pp, ids, 0);
          if (rows.defined()) send_tensor(backend, *groups.pp, rows, 0);
        }
        raise_if_failed(groups);
        break;
      }
    }
  }
}

}  // namespace tessera
