#include "engine/executor.h"

#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/logging.h"
#include "distributed/communicator.h"
#include "distributed/process_groups.h"
#include "engine/cache_groups.h"
#include "engine/spec/mtp_drafter.h"
#include "engine/worker.h"

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

}  // namespace

std::pair<Tensor, Tensor> sample_on_device(Backend& be, const Tensor& logits, const StepSampling& sampling) {
  check_sampling(logits, sampling);
  sampling.wait_masks();  // (the engine may still be filling them while the forward was enqueued)
  if (!sampling.mask_rows.empty()) {
    const int64_t m = static_cast<int64_t>(sampling.mask_rows.size());
    Tensor rows = be.scratch({m}, DType::kI32), masks = be.scratch({m, sampling.mask_words}, DType::kI32);
    be.copy_from_host(rows, sampling.mask_rows.data());
    be.copy_from_host(masks, sampling.masks.data());
    be.apply_token_mask(logits, masks, rows);
  }
  Tensor ids = be.scratch({logits.dim(0)}, DType::kI32);
  be.sample(logits, sampling.rows, ids);
  return {ids, gather_host_rows(be, logits, sampling.host_rows)};
}

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
  // With several KV cache groups, the layers at one place in their groups share a tensor.
  const std::vector<int> tensor_of = kv_tensor_of_layers(specs, init.layer_groups);
  std::vector<std::pair<Tensor, Tensor>> tensors;
  kv.layer_group = init.layer_groups;
  for (size_t i = 0; i < specs.size(); ++i) {
    const LayerCacheSpec& s = specs[i];
    if (s.kind == CacheKind::kPagedKv) {
      const Shape shape{init.num_blocks, init.block_size, s.num_kv_heads, s.head_dim};
      const size_t t = static_cast<size_t>(tensor_of[i]);
      if (t == tensors.size()) tensors.emplace_back(backend.alloc(shape, init.dtype), backend.alloc(shape, init.dtype));
      TESSERA_CHECK(t < tensors.size() && tensors[t].first.shape() == shape,
                    "layer {}: its KV page {} differs from the page of the layers sharing its tensor", i, shape.str());
      kv.k.push_back(tensors[t].first);
      kv.v.push_back(tensors[t].second);
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

bool LocalExecutor::execute_with_mtp(const ModelInput& input, const StepSampling& sampling, int passes, StepOutput& out,
                                     MtpStepResult& result) {
  if (!model_->has_mtp() || !sampling.host_rows.empty() || sampling.mask_words > 0 ||
      !runner_.mtp().step_fusable(input))
    return false;
  runner_.mtp().run_with_step(
      input, passes,
      [&](const Tensor& logits, const Tensor& ids) {
        check_sampling(logits, sampling);
        backend_.sample(logits, sampling.rows, ids);
      },
      result);
  out.tokens.swap(result.tokens);  // (the engine reads the step's tokens from out)
  out.host_logits.clear();
  return true;
}

void Executor::propose_mtp(const MtpDraftInput&, std::vector<int32_t>&) {
  fail(ErrorKind::kUnsupported, "this executor does not run the MTP layer (one rank only)");
}

Tensor compact_drafts(Backend& be, const Tensor& d, int S) {
  TESSERA_CHECK(d.ndim() == 2 && S >= 0 && d.dim(1) >= S, "MTP drafts {} for {} sequences", d.str(), S);
  const int64_t P = d.dim(0), W = d.dim(1);
  const Tensor flat = d.view({P * W});
  if (W == S) return flat;
  Tensor out = be.scratch({std::max<int64_t>(1, P * S)}, DType::kI32).rows(0, P * S);
  for (int64_t j = 0; j < P && S > 0; ++j) be.copy(out.rows(j * S, (j + 1) * S), flat.rows(j * W, j * W + S));
  return out;
}

namespace {

// The drafts of MtpDrafter::draft's `d` for S drafting sequences on the host (drafts[j * S + s]).
void download_drafts(Backend& be, const Tensor& d, int S, std::vector<int32_t>& drafts) {
  drafts.clear();
  if (d.numel() == 0 || S == 0) return;
  const Tensor c = compact_drafts(be, d, S);
  drafts.resize(static_cast<size_t>(c.numel()));
  be.copy_to_host(drafts.data(), c);
  be.synchronize();
}

}  // namespace

void LocalExecutor::propose_mtp(const MtpDraftInput& in, std::vector<int32_t>& drafts) {
  download_drafts(backend_, runner_.mtp().draft(in), in.num_drafting, drafts);
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

MultiprocExecutor::MultiprocExecutor(std::unique_ptr<Worker> worker) : worker_(std::move(worker)) {
  TESSERA_CHECK(worker_ && worker_->groups().world->rank() == 0, "the multiprocess executor runs on rank 0");
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
    broadcast_plan_bytes(worker_->groups(), encode_step_plan(plan));
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
  worker_->init_cache(init);
}

template <typename Body>
void MultiprocExecutor::guarded(Body body) {
  try {
    body();
    worker_->raise_if_failed();  // an aborted collective leaves garbage behind a clean sync
  } catch (const Error& e) {
    broken_ = true;
    // A collective that timed out surfaces first as a failed kernel or stream sync; the
    // communicator knows which peer it waited for, so its error is the one to report.
    if (e.kind() != ErrorKind::kNetwork) worker_->raise_if_failed();
    throw;
  } catch (...) {
    broken_ = true;
    throw;
  }
}

void MultiprocExecutor::execute(const ModelInput& input, const StepSampling& sampling, StepOutput& out) {
  if (broken_ || shut_down_) fail(ErrorKind::kNetwork, "the rank processes are gone (an earlier step failed)");
  StepPlan p;
  p.kind = PlanKind::kStep;
  p.step = step_++;
  p.input = input;
  p.sampling.rows = sampling.rows;
  p.sampling.host_rows = sampling.host_rows;
  p.sampling.constrained_rows = sampling.constrained_rows;
  // The masks go to the ranks only where one of them samples (a pipeline: the last stage's TP rank 0), so
  // the plan waits for them there; without a pipeline rank 0 samples and waits for them only right before
  // (the engine fills them while the forward runs).
  if (worker_->context().pp_size > 1 && sampling.mask_words > 0) {
    sampling.wait_masks();
    p.sampling.mask_rows = sampling.mask_rows;
    p.sampling.mask_words = sampling.mask_words;
    p.sampling.masks = sampling.masks;
  }
  broadcast(p);
  guarded([&] { run_and_collect(input, sampling, out); });
}

void MultiprocExecutor::propose_mtp(const MtpDraftInput& in, std::vector<int32_t>& drafts) {
  if (broken_ || shut_down_) fail(ErrorKind::kNetwork, "the rank processes are gone (an earlier step failed)");
  TESSERA_CHECK(worker_->loads_mtp(), "MTP drafts from a job loaded without the MTP layer");
  StepPlan p;
  p.kind = PlanKind::kMtpDraft;
  p.step = step_++;
  p.mtp = in;
  broadcast(p);
  guarded([&] {
    const ParallelContext& pc = worker_->context();
    Backend& be = worker_->backend();
    if (pc.pp_size == 1) {  // rank 0 is the last stage's TP rank 0: the drafts are here
      download_drafts(be, worker_->run_mtp(in), in.num_drafting, drafts);
      return;
    }
    drafts.clear();
    if (in.num_drafting == 0) return;
    const int64_t n = static_cast<int64_t>(in.num_drafting) * static_cast<int64_t>(1 + in.chained.size());
    drafts.resize(static_cast<size_t>(n));
    recv_tensor(be, *worker_->groups().pp, {n}, DType::kI32, drafts.data(), pc.pp_size - 1);
  });
}

void MultiprocExecutor::run_and_collect(const ModelInput& input, const StepSampling& sampling, StepOutput& out) {
  Tensor logits = worker_->run(input, sampling);
  const ParallelContext& pc = worker_->context();
  Backend& be = worker_->backend();
  if (pc.pp_size == 1) {
    sample_logits(be, logits, sampling, out);
    return;
  }
  // The last stage's TP rank 0 samples and sends the tokens, then the host rows, back over
  // this shard's pipeline group.
  const int64_t n = static_cast<int64_t>(sampling.rows.size()), V = worker_->model_config().vocab_size;
  const int64_t h = static_cast<int64_t>(sampling.host_rows.size());
  dist::Communicator& pp = *worker_->groups().pp;
  out.tokens.resize(static_cast<size_t>(n));
  recv_tensor(be, pp, {n}, DType::kI32, out.tokens.data(), pc.pp_size - 1);
  out.host_logits.resize(static_cast<size_t>(h * V));
  if (h > 0) recv_tensor(be, pp, {h, V}, DType::kF32, out.host_logits.data(), pc.pp_size - 1);
}

}  // namespace tessera
