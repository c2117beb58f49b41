#include "engine/executor.h"

#include <cstring>

#include "core/error.h"
#include "core/logging.h"
#include "dist/process_groups.h"

namespace tessera {

namespace {

constexpr size_t kInlinePlanBytes = 4096;  // decode plans of modest batches fit in one message
constexpr size_t kMaxPlanBytes = 64u << 20;

void logits_to_host(Backend& be, const Tensor& logits, std::vector<float>& out) {
  out.resize(static_cast<size_t>(logits.numel()));
  be.copy_to_host(out.data(), logits);
  be.synchronize();
}

}  // namespace

KvCache allocate_kv_cache(Backend& backend, const std::vector<LayerCacheSpec>& specs, const CacheInit& init) {
  KvCache kv;
  kv.block_size = init.block_size;
  kv.num_blocks = init.num_blocks;
  kv.dtype = init.dtype;
  kv.k_scale = init.k_scale;
  kv.v_scale = init.v_scale;
  for (const auto& s : specs) {
    if (s.kind != CacheKind::kPagedKv)
      fail(ErrorKind::kUnsupported, "layer cache kind 'state slot' (linear attention) is not implemented yet");
    kv.k.push_back(backend.alloc({init.num_blocks, init.block_size, s.num_kv_heads, s.head_dim}, init.dtype));
    kv.v.push_back(backend.alloc({init.num_blocks, init.block_size, s.num_kv_heads, s.head_dim}, init.dtype));
  }
  return kv;
}

// ---------------------------------------------------------------- local

LocalExecutor::LocalExecutor(std::unique_ptr<Model> model, Backend& backend)
    : model_(std::move(model)), backend_(backend) {}

void LocalExecutor::init_kv_cache(const CacheInit& init) { kv_ = allocate_kv_cache(backend_, model_->cache_specs(), init); }

void LocalExecutor::execute(const ModelInput& input, std::vector<float>& logits) {
  backend_.reset_scratch();
  logits_to_host(backend_, model_->forward(input, kv_), logits);
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
    : model_(std::move(model)), backend_(backend), pc_(pc), groups_(std::move(groups)), keep_alive_(std::move(keep_alive)) {
  TESSERA_CHECK(groups_ && groups_->world && groups_->world->rank() == 0, "the multiprocess executor runs on rank 0");
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
  kv_ = allocate_kv_cache(backend_, model_->cache_specs(), init);
}

void MultiprocExecutor::execute(const ModelInput& input, std::vector<float>& logits) {
  if (broken_ || shut_down_) fail(ErrorKind::kNetwork, "the rank processes are gone (an earlier step failed)");
  StepPlan p;
  p.kind = PlanKind::kStep;
  p.step = step_++;
  p.input = input;
  broadcast(p);
  backend_.reset_scratch();
  try {
    Tensor out = model_->forward(input, kv_);
    if (pc_.pp_size == 1) {
      logits_to_host(backend_, out, logits);
      return;
    }
    // The last stage's TP rank 0 sends the logits back over this shard's pipeline group.
    const int64_t n = static_cast<int64_t>(input.logits_indices.size()), V = model_->config().vocab_size;
    Tensor host = host_empty({n, V}, DType::kF32);
    groups_->pp->recv(host, pc_.pp_size - 1);
    logits.resize(static_cast<size_t>(n * V));
    std::memcpy(logits.data(), host.raw(), host.nbytes());
  } catch (...) {
    broken_ = true;
    throw;
  }
}

// ---------------------------------------------------------------- worker ranks

void run_worker_loop(Model& model, Backend& backend, const ParallelContext& pc, dist::ProcessGroups& groups) {
  KvCache kv;
  PlanLimits limits;
  limits.vocab_size = model.config().vocab_size;
  const bool sends_logits = pc.pp_size > 1 && model.returns_logits();
  for (;;) {
    StepPlan plan = decode_step_plan(receive_plan_bytes(groups), limits);
    switch (plan.kind) {
      case PlanKind::kShutdown: return;
      case PlanKind::kKeepalive: break;
      case PlanKind::kInitCache:
        kv = allocate_kv_cache(backend, model.cache_specs(), plan.cache);
        limits.num_blocks = plan.cache.num_blocks;
        break;
      case PlanKind::kStep: {
        if (kv.num_blocks == 0) fail(ErrorKind::kCorrupt, "step plan before the cache was initialised");
        backend.reset_scratch();
        Tensor out = model.forward(plan.input, kv);
        if (sends_logits) {
          Tensor host = host_empty(out.shape(), DType::kF32);
          backend.copy_to_host(host.raw(), out);
          backend.synchronize();
          groups.pp->send(host, 0);
        }
        break;
      }
    }
  }
}

}  // namespace tessera
