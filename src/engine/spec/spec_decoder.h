// Speculative decoding as one engine component (vLLM v1's shape: proposers as classes, one
// object the engine calls). SpecDecoder owns the proposer (NgramProposer, MtpProposer, or one a
// test brings), the decision to draft at the running batch (disable_by_batch_size, or the cost
// measured at startup against the acceptance so far), the startup calibration, the acceptance
// counters and their periodic log line, and the choice to run MTP drafting with its step. The
// engine sees the calls of one step (plan_step, execute, note_verification, finish_step) and
// never a proposer's capabilities; the model-side work (the MTP passes, their graphs and
// buffers) is the executor's and its ModelRunner's (engine/spec/mtp_drafter.h).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "engine/spec/proposer.h"
#include "engine/spec/spec_config.h"
#include "engine/step_plan.h"

namespace tessera {

class Executor;
class KvCacheCoordinator;
struct SchedulerOutput;

class SpecDecoder {
 public:
  struct Options {
    int block_size = 16;
    int max_model_len = 0;
    // MTP: decode and verification steps may run their drafting with them (EngineConfig::mtp_drafts_in_step).
    bool drafts_in_step = true;
  };
  // `config` validated and enabled. Fails (kUnsupported) where `executor` cannot run it (a hybrid
  // model on a backend without per-token state slots; mtp on a model loaded without its layer);
  // makes the proposer the method names and logs the setup.
  SpecDecoder(const SpeculativeConfig& config, Executor& executor, Options options);
  ~SpecDecoder();

  int num_speculative_tokens() const { return config_.num_speculative_tokens; }
  const SpecDecodeStats& stats() const { return stats_; }
  // disable_by_batch_size auto: (batch, a step with drafts over one without) as measured at startup.
  const std::vector<std::pair<int, double>>& costs() const { return costs_; }
  // Replaces the proposer the method chose (a custom proposer; tests).
  void set_proposer(std::unique_ptr<Proposer> p) { proposer_ = std::move(p); }

  // One step, in this order. Before its input is built: a step run while drafting is off ends
  // the drafting of its sequences for good where the proposer must see every step (MTP); the
  // step runs its MTP drafting with it when every sequence decodes or verifies the same number
  // of drafts and holds the KV blocks the passes write (taken here, so they are in the step's
  // block tables); what each sequence computes is noted. `num_running`: the scheduler's.
  void plan_step(const SchedulerOutput& sched, size_t num_running, KvCacheCoordinator& cache);
  // Runs the step on the executor: with its drafting (Executor::execute_with_mtp) where
  // plan_step chose it and every row is sampled on the device without masks, else plain.
  void execute(const ModelInput& in, const StepSampling& sampling, StepOutput& out);
  // The step's generating sequence `seq` (its index among them, in the step's order) kept
  // `accepted` of its `drafts` drafts; `going_on`: the request when it goes on (null: it
  // finished). Counts them; checks the device accepted as many where the step drafted.
  void note_verification(size_t seq, int drafts, int accepted, const Request* going_on);
  // After the step's tokens are taken: the proposer sees what the step computed (or the drafts
  // the step made), and each sequence of `decoding` (those that decode next) gets up to k drafts
  // in Request::spec_tokens, capped by max_tokens and max_model_len (and, MTP, the blocks the
  // drafts' KV needs). Logs vLLM's SpecDecoding line every 10 s of verification.
  void finish_step(const std::vector<Request*>& decoding, size_t num_running, KvCacheCoordinator& cache);

  // The engine's own runs (warm-up, calibration) between begin_internal_run and
  // end_internal_run: drafting is never off; with `warm_up` a proposer that drafts on the host
  // (ngram) gives way to drafts of 0, k, k - 1, ..., 1 tokens in successive steps (prompt lookup
  // finds none in random tokens), so the batch-1 graph of every verification shape is captured.
  // Afterwards the counters and the acceptance history are as before.
  void begin_internal_run(bool warm_up);
  void end_internal_run();
  // The tokens the warm-up's request needs beyond its decode steps (one round of every draft
  // count, where the warm-up drafts them even when they are accepted).
  int warm_up_extra_tokens() const;

  // Whether the cost of drafting is measured at startup (MTP, disable_by_batch_size auto).
  bool wants_calibration() const;
  // time_steps(B, drafts, seed): the median time of kCalibrationSteps decode steps of B random
  // sequences of kCalibrationPrompt tokens, generating up to calibration_max_tokens(), after
  // kCalibrationWarm untimed ones (graph captures), with k drafts a step or none (0: they did
  // not all get there). Runs it for B = 1, 2, 4, ... and keeps each B's time with drafts over
  // without, until drafting cannot pay (the ratio reaches k + 1), B passes `max_num_seqs` or the
  // cache's free blocks, or kCalibrationBudget has passed; logs the result.
  using TimeSteps = std::function<double(int batch, bool drafts, uint64_t seed)>;
  void calibrate(const TimeSteps& time_steps, int max_num_seqs, const KvCacheCoordinator& cache);
  static constexpr int kCalibrationPrompt = 32, kCalibrationWarm = 3, kCalibrationSteps = 6;
  int calibration_max_tokens() const;

 private:
  // Whether the next step's sequences get no drafts (disable_by_batch_size; auto: the measured
  // cost of drafting at the running batch against the mean acceptance length so far).
  bool drafting_off(size_t num_running) const;
  // The MTP passes to run with this step, or -1 when they run after it (plan_step).
  int passes_in_step(const SchedulerOutput& sched, KvCacheCoordinator& cache) const;
  // The drafts for the sequences that decode next (finish_step).
  void propose_drafts(const std::vector<Request*>& decoding, size_t num_running, KvCacheCoordinator& cache);
  // The positions a calibration sequence may reach with k drafts a step.
  int calibration_tokens() const;
  // The drafting cost measured at the smallest calibrated batch >= n (the largest one's past it).
  double cost_at(size_t n) const;
  // Tokens a verification step is expected to yield (1 + accepted drafts), from the recent ones.
  double expected_tokens_per_verification() const;
  // vLLM's periodic SpecDecoding log line, every 10 s while drafts are verified.
  void log_metrics();

  SpeculativeConfig config_;
  Executor& executor_;
  Options options_;
  std::unique_ptr<Proposer> proposer_;
  std::unique_ptr<Proposer> parked_;  // the proposer while the warm-up's drafts stand in
  SpecDecodeStats stats_;
  // The step in flight: what each sequence computes (end filled at finish_step), whether it
  // catches up, the passes planned with it (-1: none), whether it drafted and what.
  std::vector<ComputedSpan> spans_;
  std::vector<bool> caught_up_;
  int passes_ = -1;
  bool drafted_ = false;
  MtpStepResult step_drafts_;
  uint64_t step_verifications_ = 0, step_accepted_ = 0;
  // calibrate's results: (batch, step time with k drafts a sequence / without).
  std::vector<std::pair<int, double>> costs_;
  static constexpr std::chrono::seconds kCalibrationBudget{20};  // no larger batch is begun after this
  bool internal_run_ = false;                                    // (drafting never off while one runs)
  SpecDecodeStats saved_stats_;
  // Verifications and accepted drafts, each weighted by kDecay per step since.
  double recent_drafts_ = 0, recent_accepted_ = 0;
  static constexpr double kDecay = 0.995, kPrior = 4;
  // The periodic "SpecDecoding metrics" log line: the counts and time of the last one.
  SpecDecodeStats logged_;
  std::chrono::steady_clock::time_point logged_at_ = std::chrono::steady_clock::now();
};

}  // namespace tessera
