// How the engine runs a step's forward pass (docs/engine.md, "Executor").
//
// LocalExecutor: the model lives in this process (TP = PP = 1), as before.
// MultiprocExecutor: rank 0 of a TP x PP world of rank processes (docs/distributed.md,
// "Execution"). Each step rank 0 encodes the ModelInput as a step plan (step_plan.h),
// broadcasts it over the world group, runs its own shard (its Worker, engine/worker.h); with
// a pipeline, the last stage's TP rank 0 samples and sends the tokens back to rank 0. The
// other ranks' Workers run `Worker::run_step_loop`.
//
// Threads: an executor is used by the engine thread only (like the model and backend).
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include "core/phase_timer.h"
#include "engine/model_runner.h"
#include "engine/step_plan.h"
#include "engine/worker.h"
#include "model/model.h"

namespace tessera {

namespace dist {
struct ProcessGroups;
}

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const ModelConfig& model_config() const = 0;
  // This rank's layers (rank 0 plans the KV cache from them; see docs/engine.md).
  virtual std::vector<LayerCacheSpec> cache_specs() const = 0;
  virtual Backend& backend() = 0;
  // Allocates the KV cache on every rank.
  virtual void init_kv_cache(const CacheInit& init) = 0;
  // One step on every rank: the rank holding the logits samples them on its device as
  // `sampling` says; `out` gets a token per logits row and the host rows' logits.
  virtual void execute(const ModelInput& input, const StepSampling& sampling, StepOutput& out) = 0;
  // Speculative decoding with method mtp: whether the model's MTP layer runs here.
  virtual bool supports_mtp() const { return false; }
  // Runs the MTP passes of `in` after the last execute() (whose hidden states stayed on the
  // device) and returns the greedy drafts: drafts[j * in.num_drafting + i] is draft j + 1 of
  // drafting sequence i.
  virtual void propose_mtp(const MtpDraftInput& in, std::vector<int32_t>& drafts);
  // Speculative decoding with method mtp, the step and its drafting together
  // (MtpDrafter::run_with_step): returns false, having run nothing, where this executor cannot
  // (one rank only; every row of the step sampled on the device, every sequence q rows).
  virtual bool execute_with_mtp(const ModelInput& input, const StepSampling& sampling, int passes, StepOutput& out,
                                MtpStepResult& result) {
    (void)input, (void)sampling, (void)passes, (void)out, (void)result;
    return false;
  }
};

// Samples `logits` [n, V] on `backend` into out.tokens and copies the host rows to out.host_logits.
void sample_logits(Backend& backend, const Tensor& logits, const StepSampling& sampling, StepOutput& out);
// The same on the device only: the token ids (i32 [n]) and the host rows ([h, V], undefined
// when there are none), in scratch memory.
std::pair<Tensor, Tensor> sample_on_device(Backend& backend, const Tensor& logits, const StepSampling& sampling);

// The drafts of MtpDrafter::draft's result `d` ([passes, W], W >= S) for its first S
// columns, pass by pass ([passes * S]): `d` itself when W == S, else a compact copy in scratch.
Tensor compact_drafts(Backend& backend, const Tensor& d, int S);

// Allocates `init` for `specs` on `backend` (shared by both executors and the workers).
KvCache allocate_kv_cache(Backend& backend, const std::vector<LayerCacheSpec>& specs, const CacheInit& init);

class LocalExecutor : public Executor {
 public:
  LocalExecutor(std::unique_ptr<Model> model, Backend& backend);
  const ModelConfig& model_config() const override { return model_->config(); }
  std::vector<LayerCacheSpec> cache_specs() const override { return model_->cache_specs(); }
  Backend& backend() override { return backend_; }
  void init_kv_cache(const CacheInit& init) override;
  void execute(const ModelInput& input, const StepSampling& sampling, StepOutput& out) override;
  bool supports_mtp() const override { return model_->has_mtp(); }
  void propose_mtp(const MtpDraftInput& in, std::vector<int32_t>& drafts) override;
  bool execute_with_mtp(const ModelInput& input, const StepSampling& sampling, int passes, StepOutput& out,
                        MtpStepResult& result) override;

 private:
  std::unique_ptr<Model> model_;
  Backend& backend_;
  ModelRunner runner_;
  PhaseTimer timer_{"executor step (TESSERA_STEP_TIMING)"};
};

class MultiprocExecutor : public Executor {
 public:
  // `worker` is rank 0's (its groups joined, its shard loaded); its world group carries the plans.
  explicit MultiprocExecutor(std::unique_ptr<Worker> worker);
  // Sends the shutdown plan (best effort: a broken world is left to the launcher).
  ~MultiprocExecutor() override;
  const ModelConfig& model_config() const override { return worker_->model_config(); }
  std::vector<LayerCacheSpec> cache_specs() const override { return worker_->cache_specs(); }
  Backend& backend() override { return worker_->backend(); }
  void init_kv_cache(const CacheInit& init) override;
  void execute(const ModelInput& input, const StepSampling& sampling, StepOutput& out) override;
  // MTP (the job was loaded with its MTP layer, which the last pipeline stage holds): the passes
  // go to every rank as a kMtpDraft plan; the last stage runs them (its TP ranks together, the
  // greedy drafts picked on its TP rank 0 and shared) and, with a pipeline, its TP rank 0 sends
  // the drafts to rank 0. The step and its drafting are not fused here (execute_with_mtp: false).
  bool supports_mtp() const override { return worker_->loads_mtp(); }
  void propose_mtp(const MtpDraftInput& in, std::vector<int32_t>& drafts) override;
  // Ends the workers' loops; idempotent.
  void shutdown();

 private:
  void broadcast(const StepPlan& plan);
  // Runs `body` (rank 0's part of a plan already broadcast): a failure breaks the executor,
  // reported as the communicators' error where they have one.
  template <typename Body>
  void guarded(Body body);
  // Runs rank 0's part of the step; with a pipeline, receives the tokens from the last stage.
  void run_and_collect(const ModelInput& input, const StepSampling& sampling, StepOutput& out);

  std::unique_ptr<Worker> worker_;
  uint64_t step_ = 0;
  bool shut_down_ = false, broken_ = false;
};

// Plan transport over the world group (broadcast from rank 0): a fixed 4 KiB first message
// (u32 length + the plan's first bytes), then the rest when the plan is larger.
void broadcast_plan_bytes(dist::ProcessGroups& groups, const std::vector<uint8_t>& bytes);
std::vector<uint8_t> receive_plan_bytes(dist::ProcessGroups& groups);

}  // namespace tessera
