// Cache groups (vLLM v1's KVCacheGroupSpec): the model declares what each layer keeps per
// sequence (Model::cache_specs, one LayerCacheSpec a layer); layers whose cache is managed the
// same way share a group, and a request holds one table per group (Request::cache_tables):
// - full attention: paged KV, every block of the sequence kept;
// - sliding window W: paged KV, only the blocks that hold the last W - 1 positions before the
//   next token are needed, the others are given back;
// - state slot: the linear-attention layers of hybrid models, a fixed-size state per sequence.
// Paged groups share one block pool and one block size; the per-layer page (KV heads, head
// size, dtype) does not decide the group, since a block id indexes every layer's own tensor.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace tessera {

enum class CacheGroupKind : uint8_t { kFullAttention, kSlidingWindow, kStateSlot };
const char* cache_group_kind_name(CacheGroupKind kind);

// How a group's cache is managed: its kind, the paged block size and the window.
struct CacheGroupSpec {
  CacheGroupKind kind = CacheGroupKind::kFullAttention;
  int block_size = 16;     // paged groups (the state group's prefix-cache checkpoints sit on these blocks too)
  int sliding_window = 0;  // kSlidingWindow: the token at position p attends to [p - W + 1, p]
  // kStateSlot with prefix caching: a sequence's rolling checkpoint moves past its prompt at most
  // every this many tokens (rounded up to whole blocks). Each move copies the sequence's whole
  // linear-attention state (tens of MiB on Qwen3.5: a 2 MiB f32 matrix a layer), so moving it at
  // every block would add a copy every 16 tokens per sequence to decoding; at 256 a
  // continuation recomputes fewer than 256 tokens of the previous answer.
  int checkpoint_interval = 256;
  bool paged() const { return kind != CacheGroupKind::kStateSlot; }
  bool operator==(const CacheGroupSpec&) const = default;
};

struct CacheGroup {
  CacheGroupSpec spec;
  std::vector<int> layers;  // indices into the cache_specs() they came from
};

// Groups `layers` (cache_specs() order): paged groups in the order of their first layer, then
// one state group for every kStateSlot layer. window_groups false: sliding-window layers are
// managed as full attention (they keep every block, which their attention never reads past the
// window; vLLM does the same without its hybrid allocator). Fails on a negative window.
std::vector<CacheGroup> make_cache_groups(const std::vector<LayerCacheSpec>& layers, int block_size,
                                          bool window_groups);

// The engine's groups (vLLM's hybrid KV cache manager): where `layers` is the whole model (with
// pipeline stages, rank 0 sees its own layers only and every stage reads the same tables) and
// every paged layer has the same page (KV heads, head size), layers of each kind (full attention,
// window W) are split into groups of one size, as vLLM's _get_kv_cache_groups_uniform_page_size
// does: the fewest layers of a kind, or the most where that is under 1.25 times the fewest. Layer i
// of every paged group then shares one KV tensor (cache_layer_groups), so that a block is one page
// of one layer a group and a block a window group gives back serves any group. Otherwise (or with
// `hybrid` false, vLLM's --disable-hybrid-kv-cache-manager) one paged group: a sliding-window one
// when every layer has the same window and the model is whole, else full attention, windowed layers
// then keeping every block. A stage without attention layers of its own still gets a
// full-attention group (without layers): the other stages read its tables.
std::vector<CacheGroup> engine_cache_groups(const std::vector<LayerCacheSpec>& layers, int block_size, bool whole_model,
                                            bool hybrid = true);

// For each of the `num_layers` layers of `groups` (cache_specs() order), the paged group whose
// block table it reads in a step (the step carries one table per paged group, paged groups being
// the first groups); -1 for a layer without paged KV. Empty where there is one paged group: every
// paged layer reads the step's one table and has a KV tensor of its own.
std::vector<int> cache_layer_groups(const std::vector<CacheGroup>& groups, int num_layers);
// The KV tensor each layer uses (-1: none) and how many there are: with one paged group
// (`layer_groups` empty) one a paged layer; with several, layer i of every group shares tensor i.
std::vector<int> kv_tensor_of_layers(const std::vector<LayerCacheSpec>& layers, const std::vector<int>& layer_groups);
// The number of paged groups `layer_groups` names (1 when empty).
int num_paged_groups(const std::vector<int>& layer_groups);

// The most blocks one sequence of up to max_model_len tokens holds in a paged group (vLLM's
// max_memory_usage_bytes of a spec): full attention, every block; a window W, the blocks of the
// W - 1 positions before a step and the step's own (at most max_num_batched_tokens), one more
// where they do not start on a block edge, and never more than full attention's.
int max_blocks_per_seq(const CacheGroupSpec& spec, int max_model_len, int max_num_batched_tokens);

// The most blocks one sequence holds in all paged groups together.
int max_blocks_per_seq(const std::vector<CacheGroup>& groups, int max_model_len, int max_num_batched_tokens);

// What a cache of num_blocks holds (the startup log and `tessera plan`; vLLM's
// _report_kv_cache_config): tokens = num_blocks / the paged groups x block size; concurrency at
// max_model_len = num_blocks / the blocks one such sequence holds at most, or with full attention
// alone, tokens / max_model_len.
struct KvCapacity {
  int64_t tokens = 0;
  double max_concurrency = 0;
};
KvCapacity kv_capacity(const std::vector<CacheGroup>& groups, int num_blocks, int max_model_len,
                       int max_num_batched_tokens);

// "full attention (layers 0-3, 5), sliding window 4096 (layer 4)" for the startup log.
std::string describe_cache_groups(const std::vector<CacheGroup>& groups);

}  // namespace tessera
