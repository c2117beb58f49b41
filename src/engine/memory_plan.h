// The KV cache arithmetic, in one place: `tessera plan` (before anything is loaded, from the
// model's declarations) and the engine (after loading, from measured memory) both size the
// cache with these functions, so their figures can only differ by what they are given.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace tessera {

// --kv-cache-dtype: auto (the compute dtype), bfloat16, float16, fp8 / fp8_e4m3, fp8_e5m2,
// float32. Anything else fails naming the choices.
DType parse_kv_cache_dtype(const std::string& name, DType compute);

// --mamba-cache-dtype and --mamba-ssm-cache-dtype (vLLM's flags) give the dtypes of the
// linear-attention state slots: the conv state takes --mamba-cache-dtype (auto: the compute
// dtype); the recurrent state takes --mamba-ssm-cache-dtype, whose auto is --mamba-cache-dtype
// when that is set and float32 otherwise (the recurrence accumulates over the whole sequence).
// Choices: auto, float32, bfloat16; anything else fails naming them.
struct StateDtypes {
  DType conv = DType::kF32, ssm = DType::kF32;
};
StateDtypes parse_mamba_cache_dtypes(const std::string& mamba_cache_dtype, const std::string& mamba_ssm_cache_dtype,
                                     DType compute);

// State slots kept for prefix-cache checkpoints of hybrid models, beyond one per sequence:
// a quarter of max_num_seqs (at least 1) with prefix caching on, else none.
int checkpoint_state_slots(int max_num_seqs, bool enable_prefix_caching);

// What one rank's cache costs, from its layers' declarations.
struct CacheFootprint {
  int paged_layers = 0, state_layers = 0;
  // K and V of one block in every KV tensor: every paged layer's, or with several paged groups one
  // layer's of each group (the layers at one place in their groups share a tensor).
  size_t kv_bytes_per_block = 0;
  size_t state_bytes_per_seq = 0;  // every kStateSlot layer's state, one sequence
  size_t kv_bytes_per_token(int block_size) const {
    return block_size > 0 ? kv_bytes_per_block / static_cast<size_t>(block_size) : 0;
  }
};
// State slots are costed at conv_dtype / ssm_dtype (CacheInit's choice for kStateSlot layers);
// layer_groups: each layer's paged group (cache_layer_groups; empty: one group).
CacheFootprint cache_footprint(const std::vector<LayerCacheSpec>& specs, DType kv_dtype, int block_size,
                               DType conv_dtype = DType::kF32, DType ssm_dtype = DType::kF32,
                               const std::vector<int>& layer_groups = {});

// The CPU backend shares RAM with everything else: its KV budget is capped, as vLLM's CPU
// backend caps it (VLLM_CPU_KVCACHE_SPACE's default).
inline constexpr size_t kCpuKvCacheCap = size_t{4} << 30;

struct KvBudgetInputs {
  size_t total = 0;     // device memory (or the --gpu-memory override)
  size_t used = 0;      // in use before the cache: runtime, weights, communicators (measured or planned)
  size_t reserved = 0;  // not allocated yet but will be: activation arena, graph pools
  double utilization = 0.9;
  bool cpu = false;             // cap at kCpuKvCacheCap
  size_t explicit_budget = 0;   // bytes for the cache, instead of the arithmetic above
  int num_blocks_override = 0;  // --num-gpu-blocks-override
  int block_size = 16;
  int max_num_seqs = 1;
  int max_model_len = 1;
  // The most blocks one max_model_len sequence holds in all paged groups (max_blocks_per_seq of the
  // groups); 0: every block of it in one group.
  int blocks_per_seq = 0;
  int extra_state_slots = 0;    // state slots beyond those of the sequences (prefix-cache checkpoints)
  int state_slots_per_seq = 1;  // 1 + k with speculative decoding (the state after each draft)
};

struct KvBudget {
  size_t usable = 0;        // utilization x total
  size_t budget = 0;        // what is left for the cache (KV blocks + state slots)
  size_t state_bytes = 0;   // num_state_slots state slots
  int num_state_slots = 0;  // 0 without kStateSlot layers
  // max_num_seqs, or fewer when the memory cannot hold that many state slots next to the KV of
  // one max_model_len sequence (the engine clamps --max-num-seqs to it; vLLM fails instead).
  int max_num_seqs = 0;
  int num_blocks = 0;
  bool capped_by_seqs = false;  // more memory than max_num_seqs x max_model_len tokens need
  int64_t tokens(int block_size) const { return static_cast<int64_t>(num_blocks) * block_size; }
  double max_concurrency(int block_size, int max_model_len) const {
    return max_model_len > 0 ? static_cast<double>(tokens(block_size)) / max_model_len : 0;
  }
};

// State slots = max_num_seqs x state_slots_per_seq + extra_state_slots, each state_bytes_per_seq, taken off the top;
// when they would leave less than one max_model_len sequence of KV (or half the budget, if
// that is less), fewer slots (and sequences, in proportion) are planned. Blocks = (utilization x total - used -
// reserved - state slots) / bytes per block, capped at what max_num_seqs full-length sequences can use. Without a paged
// layer on this rank the blocks cost nothing here: that cap.
// --num-gpu-blocks-override: that many blocks and every slot asked for.
KvBudget plan_kv_budget(const KvBudgetInputs& in, const CacheFootprint& fp);

// What the KV budget counts as in use before the cache (KvBudgetInputs::used) on a device with
// `free_now` of `total` bytes free. With `free_at_start` (Backend::free_memory_at_start, > 0): this
// process's growth since its backend was created, free_at_start - free_now, so that processes
// sharing a GPU each count only their own, as vLLM's per-instance --gpu-memory-utilization does
// ("two instances on one GPU: 0.5 each"). Another process that allocates or frees meanwhile moves
// the figure (two processes loading at the same moment count each other's growth):
// --kv-cache-memory-bytes avoids that race. Without it (0: the CPU backend, a GPU that shares the
// host's memory): everything in use on the device, total - free_now.
size_t memory_in_use(size_t total, size_t free_now, size_t free_at_start);

// vLLM's startup check, made when the backend exists and before any weight is read: this process
// will take utilization x total of the device, and other processes already hold
// total - free_at_start of it.
struct StartMemory {
  std::string device;        // "cuda:0 (NVIDIA H100 80GB HBM3)", for the message
  size_t total = 0;          // the device's memory (the smaller of it and --gpu-memory)
  size_t free_at_start = 0;  // Backend::free_memory_at_start; 0: not recorded, nothing to check
  double utilization = 0.9;
  size_t kv_cache_memory_bytes = 0;  // --kv-cache-memory-bytes; 0: not given
};
// The largest --gpu-memory-utilization (two decimals, rounded down) that fits in free_at_start.
double max_start_utilization(const StartMemory& m);
// Throws Error(kOutOfMemory) when utilization x total is more than free_at_start (total -
// free_at_start + utilization x total > total), naming the free and the asked GiB and the largest
// utilization that fits. With --kv-cache-memory-bytes the utilization is not used (as in vLLM): it
// fails when the cache alone is more than free_at_start. Nothing to check without free_at_start.
void check_memory_at_start(const StartMemory& m);

std::string format_gib(size_t bytes);   // "12.34 GiB"
std::string with_thousands(int64_t v);  // 1234567 -> "1,234,567"

}  // namespace tessera
