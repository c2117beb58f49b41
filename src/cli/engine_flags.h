// Flags shared by the verbs that run a model (generate, serve), with vllm serve's names.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "cli/cluster_state.h"
#include "engine/engine.h"
#include "engine/model_loader.h"

namespace tessera::cli {

struct EngineFlags {
  std::string model;
  std::string load_format = "auto";
  std::string quantization;  // --quantization / -q
  std::string hf_overrides;  // --hf-overrides: a JSON object over config.json ("" = none)
  std::string rope_scaling;  // --rope-scaling: JSON, config.json's rope_scaling
  double rope_theta = 0;     // --rope-theta: config.json's rope_theta (0 = the file's)
  std::string device = "auto";
  std::string dtype = "auto";  // --dtype: auto or bfloat16 (the compute dtype tessera has)
  int data_parallel_size = 1;  // --data-parallel-size / -dp: 1 only
  int max_model_len = 0;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 0;
  int block_size = 16;
  int num_gpu_blocks_override = 0;
  double gpu_memory_utilization = 0.9;
  size_t kv_cache_memory_bytes = 0;  // --kv-cache-memory-bytes: the cache's size per GPU (0 = plan from utilization)
  std::string kv_cache_dtype = "auto";
  std::string mamba_cache_dtype = "auto", mamba_ssm_cache_dtype = "auto";
  bool enable_prefix_caching = true;
  bool enable_chunked_prefill = true;
  uint64_t seed = 0;
  bool check_weights = false;  // --check-weights: scan the loaded weights for NaN/Inf before serving
  bool enforce_eager = false;
  bool disable_hybrid_kv_cache_manager = false;  // one KV cache group, windowed layers keeping every block
  bool disable_sliding_window = false;  // --disable-sliding-window: full attention, max_model_len capped at the window
  bool disable_custom_all_reduce = false;
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  bool enable_expert_parallel = false;
  std::string speculative_config;  // --speculative-config: vLLM's JSON object ("" = off)
  std::string gpu_memory;          // --gpu-memory: plan and run as if each device had this much ("" = what it reports)
  std::string download_dir;        // --download-dir: a Hugging Face cache searched first for an org/name model id
  std::string revision;            // --revision: the snapshot of an org/name model id (branch, tag or commit)
};

// An `org/name` model (vLLM's Hugging Face id) becomes its snapshot directory in the hub cache (loader/hf_cache.h);
// a directory stays. Returns the model as given (the default --served-model-name for an id). Fails naming where it
// looked and how to download. With --disable-sliding-window and a model that has sliding-window layers, also caps
// max_model_len at the window, as vLLM does (0 becomes min(window, max_position_embeddings); a larger
// --max-model-len fails naming both).
std::string resolve_model(EngineFlags& f);

void add_engine_flags(CLI::App& app, EngineFlags& f);

// The cluster token: the --cluster-token value, else $TESSERA_CLUSTER_TOKEN ("" when neither is set).
std::string cluster_token_or_env(const std::string& flag_value);
// The same, required: fails (naming the `nnodes` nodes) saying to pass the same token on every `peers`.
std::string required_cluster_token(const std::string& flag_value, int nnodes, const char* peers);
// --speculative-config's JSON ("" = off), validated; fails naming the bad field.
SpeculativeConfig parse_speculative_config(const std::string& text);

// The model a verb runs when none is given (vLLM's `vllm serve` has a default model too): the demo model
// shipped in the repository, models/tessera-demo, looked up beside the binary and in its parent folders
// (build/cpu/bin/tessera finds the source tree's; a bundle or install may carry models/ next to it).
inline constexpr const char* kDemoModelName = "tessera-demo";
// The demo model's directory, or Error(kNotFound) naming where it looked and what to do.
std::string default_model_dir(const char* verb);

// Several nodes (vLLM / torchrun names) and the executor backend. Every node runs the same
// command with its own --node-rank; under mpirun, Slurm or a LeaderWorkerSet the launcher's
// environment supplies them (dist/launch_env.h).
struct ClusterFlags {
  std::optional<int> nnodes, node_rank, master_port;
  std::optional<std::string> master_addr;
  std::string nic;  // NCCL_SOCKET_IFNAME syntax
  std::string node_ip_address;
  std::string cluster_token;  // default: $TESSERA_CLUSTER_TOKEN
  double join_timeout_s = 300;
  std::string distributed_executor_backend;  // mp | ray (a persistent cluster's nodes, if one runs here) | uni
  // Filled by resolve_cluster when the ranks go to the nodes of a persistent cluster
  // (`tessera node start`, found through its state file): its head, and the other nodes chosen
  // (cluster node ranks; the job's node rank k + 1 is cluster_nodes[k]).
  std::optional<ClusterState> cluster;
  std::vector<int> cluster_nodes;
};
void add_cluster_flags(CLI::App& app, ClusterFlags& c);
// The backend for --device (auto: CUDA when this build has it and a GPU is visible), after vLLM's
// startup check (check_start_memory).
std::unique_ptr<Backend> make_backend_for(const EngineFlags& f);
// vLLM's startup check on a new backend, before any weight is read: fails (kOutOfMemory) when
// other processes on its GPU hold so much that --gpu-memory-utilization's share (or
// --kv-cache-memory-bytes) cannot be had (engine/memory_plan.h, check_memory_at_start).
void check_start_memory(const EngineFlags& f, const Backend& backend);
// --kv-cache-memory-bytes's value: bytes as vLLM's human-readable integers (8589934592, 8G = 8 x
// 1024^3, 8g = 8 x 10^9, 512M, 1.5g) and the IEC spellings 8GiB / 512MiB; at least 1. Throws
// FlagError naming the flag.
size_t parse_kv_cache_memory_bytes(const std::string& text);
// Refuses TP/PP > 1 (verbs that do not launch rank processes yet).
EngineConfig engine_config(const EngineFlags& f);
// For verbs that run TP x PP rank processes (generate, through RankLauncher), and for `tessera
// plan`, which makes the same checks so that it never plans a setup serve refuses.
EngineConfig engine_config(const EngineFlags& f, bool parallel_supported);
LoadOptions load_options(const EngineFlags& f);
// --hf-overrides with --rope-scaling and --rope-theta folded in (null when none is given); fails naming the flag.
nlohmann::json hf_overrides_json(const EngineFlags& f);

}  // namespace tessera::cli
