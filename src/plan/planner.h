// `tessera plan`: will this model fit on these GPUs with these flags, and with how many KV
// tokens? The planner builds the real model on a MetaBackend (no memory, no compute) for each
// pipeline stage, so the weights are counted as the loader would place them and the cache as
// the model declares it (Model::cache_specs), then sizes the cache with the engine's own
// arithmetic (engine/memory_plan.h). `tessera serve` runs the same planner before it loads
// anything and refuses a configuration that cannot fit.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "engine/cache_groups.h"
#include "engine/memory_plan.h"
#include "loader/model_config.h"
#include "model/model.h"
#include "plan/network_cost.h"

namespace tessera::plan {

// A GPU model from the table (`--gpu h200`): memory as the driver reports it, and the
// vendor's memory bandwidth.
struct GpuSpec {
  std::string name;         // "h200"
  std::string description;  // "NVIDIA H200 (141 GB HBM3e)"
  size_t memory_bytes = 0;  // what cudaMemGetInfo / nvidia-smi report as total
  bool unified = false;     // memory shared with the CPU and the OS (GB10)
  double bandwidth = 0;     // bytes/s (vendor figure, decimal: 4.8 TB/s = 4.8e12)
  std::string alias;        // another name --gpu accepts ("dgx-spark"), or ""
};
const std::vector<GpuSpec>& gpu_table();
// nullopt when unknown (the caller lists gpu_table()).
std::optional<GpuSpec> find_gpu(const std::string& name);
// "32GiB", "32 GiB", "24GB", "1.5T", "4096M", "123456789": bytes; fails on anything else.
size_t parse_memory_size(const std::string& text);

// Where the plan is for.
struct Target {
  std::string description;  // "--gpu h200", "this machine: cuda:0 (NVIDIA H200)"
  DeviceType device = DeviceType::kCUDA;
  size_t memory_bytes = 0;  // per GPU (per CPU node for the CPU backend)
  bool unified = false;
  double bandwidth = 0;  // bytes/s per GPU; 0: unknown (no decode ceiling)
  int nodes = 1;
  int gpus_per_node = 0;  // 0: TP x PP / nodes
  // Memory already in use before tessera loads anything: measured when planning on this machine
  // (memory_in_use: on a discrete GPU this process's own, other processes being the startup
  // check's business, check_memory_at_start; on the CPU and unified memory all that is in use),
  // else estimated (kCudaRuntimeEstimate).
  std::optional<size_t> baseline_used;
  bool measured = false;         // the figures are this machine's (measured_target)
  std::optional<LinkSpec> link;  // between nodes (--link): the network's share of a decode step
};

// Estimates used when the target is not this machine (documented in docs/plan.md).
inline constexpr size_t kCudaRuntimeEstimate = size_t{640} << 20;  // CUDA context + cuBLAS workspace
inline constexpr size_t kNcclCommEstimate = size_t{256} << 20;     // buffers of one NCCL communicator
inline constexpr size_t kCustomAllReduceBytes = size_t{17} << 20;  // one-shot all-reduce staging + flags
inline constexpr size_t kCudaMinScratch = size_t{256} << 20;       // the CUDA arena's first chunk
// Unified memory (GB10): what the plan leaves the OS (kernel, services, the page cache's
// working set) out of the total; no other process is assumed to hold memory.
inline constexpr size_t kUnifiedOsReserve = size_t{8} << 30;

// What one decode step reads on one rank of one pipeline stage (the decode ceiling).
struct DecodeReads {
  size_t dense_bytes = 0;          // weights every token reads (all but routed experts and gathered embeddings)
  size_t expert_bytes = 0;         // the routed experts this rank holds, all of them (FP8 with scales)
  size_t kv_bytes_per_token = 0;   // KV read per context token of a sequence
  size_t state_bytes_per_seq = 0;  // linear-attention state read per sequence
};
// Bytes one decode step of `batch` sequences of `context` tokens reads on that rank:
//   dense + expert_bytes x (1 - (1 - k/E)^batch) + batch x (kv_bytes_per_token x context + state)
// where E x (1 - (1 - k/E)^batch) is the expected number of distinct experts `batch` tokens
// route to (k of E each, uniformly); E = 0: a dense model.
double decode_step_bytes(const DecodeReads& r, int num_experts, int top_k, int batch, int64_t context);
// The bandwidth-only ceiling of a decode step (no compute, no communication): a token passes
// the pipeline stages one after another, so the step takes the sum of the stages' reads over
// the bandwidth; batch tokens per step.
struct DecodeCeiling {
  int batch = 1;
  std::vector<double> stage_bytes;  // per stage, one rank's reads
  double step_seconds = 0;
  double steps_per_second = 0;
  double tokens_per_second = 0;  // batch x steps per second
};
DecodeCeiling decode_ceiling(const std::vector<DecodeReads>& stages, int num_experts, int top_k, int batch,
                             int64_t context, double bandwidth);

// A decode step's traffic between nodes at a batch (network_cost.h), and on the target's link its
// time and the step's: the decode ceiling's reads plus the network, one after the other.
struct NetworkStep {
  int batch = 1;
  CrossNodeTraffic traffic;
  double seconds = 0;       // on the link; 0 without one
  double step_seconds = 0;  // reads + network; 0 without a link or a memory bandwidth
};

struct PlanInputs {
  std::string model_dir;
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  bool enable_expert_parallel = false;  // whole experts per TP rank (MoE)
  int max_model_len = 0;                // 0: the model's max_position_embeddings
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;
  int block_size = 16;
  double gpu_memory_utilization = 0.9;
  std::string kv_cache_dtype = "auto";
  std::string mamba_cache_dtype = "auto", mamba_ssm_cache_dtype = "auto";  // linear-attention state slots
  bool enable_prefix_caching = true;    // hybrid models keep checkpoint state slots for it
  bool hybrid_kv_cache_manager = true;  // false: --disable-hybrid-kv-cache-manager (EngineConfig's field)
  int state_slots_per_seq = 1;          // hybrid models with speculative decoding: 1 + k
  bool mtp = false;                     // speculative decoding with method mtp: the MTP layer's weights and KV
  bool enforce_eager = false;
  bool disable_custom_all_reduce = false;
  int num_gpu_blocks_override = 0;
  std::string load_format = "auto";
  std::string quantization;     // --quantization
  nlohmann::json hf_overrides;  // --hf-overrides (with --rope-scaling / --rope-theta)
  Target target;
};

// Ranks that share one node's memory on the CPU backend: TP x PP / nodes, rounded up (1 on GPUs, where
// each rank has its own device).
int ranks_sharing_memory(const PlanInputs& in);
// The memory one rank plans with: its GPU's, or on the CPU backend its share of the node's memory.
size_t rank_memory_bytes(const PlanInputs& in);

// One rank of one pipeline stage (the TP ranks of a stage hold the same amounts).
struct StagePlan {
  int pp_rank = 0;
  LayerRange layers;
  size_t weight_bytes = 0;      // declared parameters, as the loader places them
  size_t fp8_weight_bytes = 0;  // of weight_bytes: block-scaled FP8 weights with their f32 scales
  size_t weight_tensors = 0;
  size_t other_bytes = 0;        // other buffers the model allocates (rotary table)
  size_t runtime_bytes = 0;      // in use before loading (context, other processes)
  size_t comm_bytes = 0;         // communicator buffers
  size_t activation_bytes = 0;   // the activation arena's peak (a full prefill step, a full decode step)
  size_t used_before_cache = 0;  // runtime + weights + other + communicators
  CacheFootprint cache;
  // The engine's KV cache groups here (engine_cache_groups: a model mixing full-attention and
  // sliding-window layers has one per kind, their layers sharing the blocks' tensors).
  std::vector<CacheGroup> cache_groups;
  KvBudget kv;
  bool runtime_estimated = false;
  DecodeReads reads;  // what a decode step reads here
};

struct Plan {
  PlanInputs in;
  ModelConfig config;
  int max_model_len = 0;
  DType compute_dtype = DType::kBF16, kv_dtype = DType::kBF16;
  size_t checkpoint_bytes = 0;  // the safetensors files (0: a config-only directory)
  size_t checkpoint_tensors = 0;
  std::vector<StagePlan> stages;
  int num_blocks = 0;  // what the engine allocates on every stage (planned from stage 0, as it does)
  // Hybrid models: state slots per rank (sequences + prefix-cache checkpoints), their dtypes,
  // and --max-num-seqs after the engine's clamp (= the flag when the slots fit).
  int num_state_slots = 0;
  int max_num_seqs = 0;
  DType conv_state_dtype = DType::kF32, ssm_state_dtype = DType::kF32;
  int64_t kv_tokens = 0;
  double max_concurrency = 0;
  // Verdict: fits (serve will start), and whether max_num_seqs full-length sequences fit at once.
  bool fits = false;
  bool full_concurrency = false;
  std::string verdict;         // one sentence, with what to change and the numbers
  std::string flag_to_change;  // the first flag the verdict names ("" when it fits)
  // With a bandwidth: the decode ceiling at batch 1 and at the planned concurrency
  // (min(--max-num-seqs after the clamp, full-length sequences the cache holds)), at --max-model-len.
  std::optional<DecodeCeiling> ceiling_one, ceiling_batch;
  // A layout whose collectives cross nodes: its decode step's traffic at the ceilings' batches; when
  // TP spans nodes, also the batch-1 step of TP inside the nodes and PP across them (alternative_tp
  // x alternative_pp), for the advice.
  std::optional<NetworkStep> network_one, network_batch, network_alternative;
  int alternative_tp = 0, alternative_pp = 0;
  // Unified memory: the highest --gpu-memory-utilization that leaves the OS kUnifiedOsReserve,
  // and the lowest that fits (0 when none up to the highest does).
  double max_utilization = 0, min_utilization = 0;
  size_t usable() const;  // utilization x memory per GPU
};

// Throws Error on a bad configuration (unknown architecture, TP not dividing the heads...).
Plan make_plan(const PlanInputs& in);
// This machine's device as a target, measured through `backend`: its device type, total memory,
// what is in use before tessera loads anything (total - free) and whether the memory is shared
// with the host (Backend::unified_memory: then free is the host's MemAvailable and a
// --gpu-memory-utilization over the share that leaves the OS kUnifiedOsReserve does not fit).
// nodes and gpus_per_node are left for the caller.
Target measured_target(const Backend& backend);

// The decode step's traffic between nodes at `batch` with `p`'s ranks `gpus_per_node` a node (no time:
// the plan's own link is not used), and its one-line description ("97 all-reduces + 1 logits gather
// + ...: 1.09 MB, 196 one-way latencies").
NetworkStep network_step_at(const Plan& p, int batch, int gpus_per_node);
std::string describe_traffic(const CrossNodeTraffic& t);

// TP x PP layouts over the target's GPUs (nodes x gpus_per_node, or up to 8 on one node) that
// fit, TP inside a node first; each with its plan.
std::vector<Plan> suggest_layouts(const PlanInputs& in);

// The human report (per-rank table, then the verdict).
std::string render_text(const Plan& p);

}  // namespace tessera::plan
