// The engine: owns the model, the KV cache and the scheduler, and advances every
// request by one step per call. Single-threaded by contract: one thread (the engine
// loop) calls everything here; front ends talk to it through their own queues.
#pragma once
#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/background_tasks.h"
#include "core/phase_timer.h"
#include "engine/executor.h"
#include "engine/kv_cache_coordinator.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/spec/spec_decoder.h"
#include "model/model.h"

namespace tessera {

struct EngineConfig {
  SchedulerConfig scheduler;  // max_model_len 0 = the model's max_position_embeddings
  int block_size = 16;
  int num_blocks_override = 0;  // --num-gpu-blocks-override
  double gpu_memory_utilization = 0.9;
  size_t kv_cache_memory_bytes = 0;     // explicit KV budget; 0 = plan from memory
  std::string kv_cache_dtype = "auto";  // auto | bf16 | fp8 (e4m3) | fp8_e5m2 | f32
  // Linear-attention state slots (engine/memory_plan.h, parse_mamba_cache_dtypes).
  std::string mamba_cache_dtype = "auto", mamba_ssm_cache_dtype = "auto";
  bool enable_prefix_caching = true;
  // A model mixing full-attention and sliding-window layers gets a KV cache group per kind, its
  // windowed layers keeping only their window's blocks (engine_cache_groups); false (vLLM's
  // --disable-hybrid-kv-cache-manager): one group, windowed layers keeping every block.
  bool hybrid_kv_cache_manager = true;
  // Hybrid models with prefix caching: tokens between moves of a sequence's rolling state
  // checkpoint (CacheGroupSpec::checkpoint_interval; each move copies its whole state).
  int state_checkpoint_interval = CacheGroupSpec{}.checkpoint_interval;
  uint64_t seed = 0;
  bool enforce_eager = false;  // no CUDA graphs
  // With CUDA graphs: one request through prefill and a few decode steps before the engine takes
  // requests (LLMEngine::warm_up), so the first user request does not pay for kernel loading and
  // the batch-1 decode graph's capture. The command line turns it on; tests leave it off.
  bool warm_up = false;
  SpeculativeConfig speculative;  // --speculative-config (off by default)
  // MTP: decode and verification steps run their drafting with them (Executor::execute_with_mtp)
  // where the executor can; false: always after the step's tokens are on the host (tests).
  bool mtp_drafts_in_step = true;
  // Constrained decoding: the background threads that fill a step's token masks while its forward runs
  // (0: BackgroundTasks::default_threads(), min(8, cores - 1)); -1: none, the masks are filled on the
  // engine thread before the forward (the serial path; tests compare the two).
  int mask_threads = 0;
  // Memory planning (engine/memory_plan.h). device_memory: plan as if the device had this many
  // bytes (--gpu-memory; 0 = what it reports). reserved_bytes: memory the activation arena and
  // graphs will take after the cache is allocated (from `tessera plan`'s arithmetic).
  size_t device_memory = 0;
  size_t reserved_bytes = 0;
  // What the planner predicted before loading (planned_blocks > 0): logged beside the measured
  // figures.
  int planned_blocks = 0;
  size_t planned_used_bytes = 0;
};

struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> new_token_ids;
  std::vector<TokenLogprob> logprobs;  // one per new token when asked for
  // prompt_logprobs >= 0: with the request's first output, one entry per prompt token from the second on.
  std::vector<TokenLogprob> prompt_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<int32_t> stop_token;
  std::string error;  // finish_reason kError: what failed and what to check
  int num_prompt_tokens = 0;
  int num_output_tokens = 0;
  int num_cached_tokens = 0;
  // When a step first computed any of the sequence (the end of its queue time; vLLM's scheduled time).
  std::chrono::steady_clock::time_point scheduled_at{};
};

// Bucket bounds of the tokens-per-step histogram (vLLM's iteration_tokens_total).
inline constexpr int kIterationTokensBuckets[] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
inline constexpr size_t kNumIterationTokensBuckets = std::size(kIterationTokensBuckets);

struct EngineStats {
  size_t num_running = 0, num_waiting = 0;
  double kv_cache_usage = 0;
  uint64_t num_preemptions = 0;
  uint64_t prompt_tokens = 0, generation_tokens = 0, prefix_cache_hit_tokens = 0;
  uint64_t prefix_cache_queries = 0;  // prompt tokens looked up in the prefix cache (hits: the line above)
  uint64_t steps = 0;
  // Tokens each step computed: counts per bucket of kIterationTokensBuckets (not cumulative; the last is
  // above the largest bound), and their sum.
  std::array<uint64_t, kNumIterationTokensBuckets + 1> iteration_tokens{};
  uint64_t iteration_tokens_sum = 0;
  SpecDecodeStats spec;            // speculative decoding (all zero when off)
  int num_speculative_tokens = 0;  // k; 0 when speculative decoding is off
};

class LLMEngine {
 public:
  // Plans and allocates the KV cache (logging its capacity), then is ready for requests.
  LLMEngine(std::unique_ptr<Model> model, Backend& backend, EngineConfig config);
  // Same, with the forward pass behind an executor (MultiprocExecutor for TP/PP).
  LLMEngine(std::unique_ptr<Executor> executor, EngineConfig config);
  ~LLMEngine();

  // Queues a request; with n > 1 it becomes n sequences "<id>", "<id>#1", ... that share the
  // prompt's cached blocks. The request must pass validate_request (AsyncEngine::submit checks
  // it; an invalid one here throws an internal Error); a sequence id already in use fails (no
  // side effects).
  Status add_request(const std::string& id, std::vector<int32_t> prompt, const SamplingParams& params);
  // Finishes the request (and, unless only_this_sequence, its n siblings "<id>#k") with
  // reason abort; frees its blocks. No-op if unknown.
  void abort(const std::string& id, bool only_this_sequence = false);
  // One scheduling step and forward pass; outputs for requests that advanced or finished.
  std::vector<RequestOutput> step();
  bool has_unfinished() const { return !requests_.empty(); }
  // Runs one request of kWarmUpPrompt random tokens (shorter where --max-model-len asks) through
  // prefill and kWarmUpDecode decode steps, so the prefill and decode kernels are loaded and the
  // batch-1 decode graph is captured and replayed before a user's request comes (with a proposer
  // that drafts on the host, ngram, the steps carry 0, k, k - 1, ..., 1 drafts in turn, so the
  // batch-1 verification graph of every draft count is captured too; MTP drafts k) (the constructor
  // calls it with EngineConfig::warm_up). Leaves no request, stats or counters behind; the
  // request's full blocks stay in the prefix cache as evictable blocks. Returns the steps it ran
  // (0: no room for it).
  int warm_up();
  static constexpr int kWarmUpPrompt = 512, kWarmUpDecode = 6;

  const ModelConfig& model_config() const { return executor_->model_config(); }
  const EngineConfig& config() const { return config_; }
  int max_model_len() const { return config_.scheduler.max_model_len; }
  int num_blocks() const { return cache_manager_->pool().num_blocks(); }
  int kv_capacity_tokens() const { return num_blocks() * config_.block_size; }
  const KvCacheCoordinator& cache_manager() const { return *cache_manager_; }
  EngineStats stats() const;
  // Replaces the proposer --speculative-config chose (a custom proposer; tests). Needs
  // speculative decoding on (its num_speculative_tokens bounds the drafts).
  void set_proposer(std::unique_ptr<Proposer> p);
  // disable_by_batch_size auto: (batch, a step with drafts over one without) as measured at startup.
  const std::vector<std::pair<int, double>>& speculation_costs() const;
  const std::vector<int32_t>& eos_token_ids() const { return eos_ids_; }
  void set_eos_token_ids(std::vector<int32_t> ids) { eos_ids_ = std::move(ids); }

 private:
  // One logits row of a step: a prompt position whose logits give the logprob of the prompt token
  // after it (prompt_logprobs; prompt_pos >= 0), or row `draft` of a sequence's next tokens
  // (prompt_pos -1): row 0 follows its last token, row j >= 1 its draft j - 1 (speculative
  // decoding: a sequence with `drafts` drafts has rows 0..drafts, consecutive).
  struct LogitsRow {
    Request* request;
    int prompt_pos = -1;
    int draft = 0;
    int drafts = 0;
  };
  void plan_kv_cache();
  // Validates --speculative-config; when it is on, makes the SpecDecoder (which fails, kUnsupported,
  // on a setup tessera cannot run).
  void init_speculative();
  // `rows`: what each logits row is for; `scored`: requests with max_tokens 0 whose prompt is done.
  ModelInput build_input(const SchedulerOutput& sched, std::vector<LogitsRow>& rows,
                         std::vector<Request*>& scored) const;
  // Hybrid models in a step with drafts: the slot that keeps the state after each new token of s.
  void add_token_state_slots(const ScheduledRequest& s, LinearAttnLayout& linear) const;
  // Fails (kOutOfMemory) when one sequence of max_model_len cannot hold its blocks in every paged group.
  void check_sequence_fits(const std::vector<CacheGroup>& groups, int num_blocks) const;
  // The sampling row of each logits row; prompt-logprob rows and host-sampled ones are host rows. Starts
  // the fill of the constrained rows' masks (start_token_masks).
  void step_sampling(const std::vector<LogitsRow>& rows, StepSampling& sampling);
  // The host logits of logits row `row` when it is the next host row (then moves past it), else nullptr.
  float* host_logits(const StepSampling& sampling, size_t& next_host, int row);
  // Takes the tokens of rows[first] .. rows[first + drafts]: the first row's token, then, while a
  // token equals the draft at its position, the next row's (spec/spec_config.h). Appends the
  // request's output; returns false when it finished (it is retired).
  // `accepted` gets the drafts it accepted.
  bool take_tokens(const std::vector<LogitsRow>& rows, int first, const StepSampling& sampling, size_t& next_host,
                   std::vector<RequestOutput>& out, int& accepted);
  // Constrained decoding on the device: starts filling the token masks of the rows of the sequences whose
  // row 0 are rows[firsts[k]] (ascending) on mask_pool_ and sets sampling.await_masks, so that the forward
  // runs meanwhile (with mask_threads -1: fills them here). `rows` and `sampling` must outlive the fill.
  void start_token_masks(const std::vector<LogitsRow>& rows, const std::vector<size_t>& firsts, StepSampling& sampling);
  // Sequence k's rows of the fill (any thread; each sequence's constraint is touched by one thread).
  void fill_token_masks_of(size_t k);
  // Waits for the fill, packs the masks in row order into the step's StepSampling and records the
  // constraints that threw on their requests (engine thread; a no-op when no fill is pending).
  void finish_token_masks();
  // finish_token_masks where an exception must not escape (a step that failed; destructors).
  void abandon_token_masks() noexcept;
  // Why r stops after taking `token` (kNone: it goes on).
  // Constrained decoding: r took `token`; the constraint advances (or starts, at the end of the reasoning).
  void advance_constraint(Request& r, int32_t token);
  FinishReason finish_reason_after(Request& r, int32_t token) const;
  RequestOutput output_of(const Request& r) const;
  // Counts one step of `tokens` computed tokens in the tokens-per-step histogram.
  void count_iteration_tokens(uint64_t tokens);
  // The engine's own runs (warm_up, calibrate_speculation): a greedy, EOS-ignoring request of `len`
  // tokens drawn from rng; false where it does not fit --max-model-len or is refused.
  bool add_random_request(const std::string& id, int len, int max_tokens, std::mt19937_64& rng);
  // After such a run: the stats as before it (SpecDecoder::end_internal_run).
  void end_internal_run(const EngineStats& saved);
  // CUDA graphs are captured (not --enforce-eager, a backend that has them).
  bool captures_graphs() const { return !config_.enforce_eager && backend_.supports_graphs(); }
  // disable_by_batch_size auto (MTP): SpecDecoder::calibrate over time_calibration_steps. Leaves no
  // request, stats or counters behind.
  void calibrate_speculation();
  // SpecDecoder::TimeSteps: B random-prompt sequences through real steps, drafting or not.
  double time_calibration_steps(int batch, bool drafts, uint64_t seed);
  void finish(Request* r, FinishReason reason, std::vector<RequestOutput>& out);
  // Frees the request's blocks and forgets it (the pointer dangles afterwards).
  void retire(Request* r);

  std::unique_ptr<Executor> executor_;
  Backend& backend_;
  EngineConfig config_;
  std::unique_ptr<KvCacheCoordinator> cache_manager_;
  std::vector<int> kv_layer_groups_;  // CacheInit::layer_groups: each layer's paged group
  std::unique_ptr<Scheduler> scheduler_;
  Sampler sampler_;
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;
  std::vector<int32_t> eos_ids_;
  uint64_t next_order_ = 0;
  EngineStats stats_;
  PhaseTimer timer_{"engine step (TESSERA_STEP_TIMING)"};
  StepOutput step_out_;
  std::mt19937_64 seed_rng_;           // sample seeds of requests that bring none
  std::unique_ptr<SpecDecoder> spec_;  // speculative decoding; null when off
  // Constrained decoding: the step's mask fill (start_token_masks) and the threads that run it (made at
  // the first constrained step).
  struct MaskFill {
    const std::vector<LogitsRow>* rows = nullptr;
    StepSampling* sampling = nullptr;
    uint32_t* masks = nullptr;  // sampling->masks, one slot of `words` words per row of each sequence
    size_t words = 0;
    std::vector<size_t> firsts;       // row 0 of each sequence filled
    std::vector<size_t> slot0;        // sequence k's slots: [slot0[k], slot0[k + 1])
    std::vector<int32_t> slot_row;    // the row a filled slot masks; -1: unused
    std::vector<std::string> errors;  // what sequence k's constraint threw; empty: nothing
    bool pending = false;
  };
  MaskFill mask_fill_;
  std::unique_ptr<BackgroundTasks> mask_pool_;
  std::vector<int32_t> mask_store_;  // the masks' buffer between steps (kept, not re-zeroed, each step)
};

}  // namespace tessera
