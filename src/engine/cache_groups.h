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

// The engine's groups: sliding-window groups of their own only where the step's one attention
// block table serves every paged layer (a single paged group results) and `layers` is the whole
// model (with pipeline stages, rank 0 sees its own layers only, and every stage reads the same
// table); otherwise windowed layers are managed as full attention. A stage without attention layers
// of its own still gets a full-attention group (without layers): the other stages read its tables.
std::vector<CacheGroup> engine_cache_groups(const std::vector<LayerCacheSpec>& layers, int block_size,
                                            bool whole_model);

// The most blocks one sequence of up to max_model_len tokens holds in a paged group (vLLM's
// max_memory_usage_bytes of a spec): full attention, every block; a window W, the blocks of the
// W - 1 positions before a step and the step's own (at most max_num_batched_tokens), one more
// where they do not start on a block edge, and never more than full attention's.
int max_blocks_per_seq(const CacheGroupSpec& spec, int max_model_len, int max_num_batched_tokens);

// "full attention (layers 0-3, 5), sliding window 4096 (layer 4)" for the startup log.
std::string describe_cache_groups(const std::vector<CacheGroup>& groups);

}  // namespace tessera
