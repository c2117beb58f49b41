#pragma once
#include <vector>

#include "backend/backend.h"

namespace tessera {

// Host description of one step's sequences; upload() makes the device tensors.
struct AttentionLayout {
  std::vector<int32_t> query_start_loc;  // S+1
  std::vector<int32_t> seq_lens;         // S
  // One table and one slot mapping per KV cache group (AttentionMetadata::num_kv_groups), group
  // after group.
  std::vector<int32_t> block_tables;  // G * S * max_blocks_per_seq, padded with 0
  std::vector<int32_t> slot_mapping;  // G * T
  int max_blocks_per_seq = 0;
  int block_size = 16;
  int num_kv_groups = 1;
};

// The most KV cache groups a step may carry.
inline constexpr int kMaxKvGroups = 64;

// Builds the metadata in `backend`'s scratch memory (valid until reset_scratch).
AttentionMetadata upload_attention_metadata(Backend& backend, AttentionLayout layout);

// KV cache group g's metadata of a step (m.num_kv_groups of them): its block tables and slots as
// views of m's (and their host copies, where m has them), the sequences' layout shared; one group.
AttentionMetadata attention_group(const AttentionMetadata& m, int g);

// Host description of one step's linear-attention sequences (state slots).
struct LinearAttnLayout {
  std::vector<int32_t> query_start_loc;    // S+1
  std::vector<int32_t> state_slots;        // S (< 0: padding sequence)
  std::vector<int32_t> has_initial_state;  // S (0 or 1)
  std::vector<int32_t> token_state_slots;  // T, or empty (LinearAttnMetadata::token_state_slots)
};

// Builds the metadata in `backend`'s scratch memory (valid until reset_scratch).
LinearAttnMetadata upload_linear_attn_metadata(Backend& backend, LinearAttnLayout layout);

}  // namespace tessera
