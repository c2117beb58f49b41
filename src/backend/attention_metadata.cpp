#include "backend/attention_metadata.h"

#include <algorithm>

#include "core/error.h"

namespace tessera {

namespace {
Tensor upload_i32(Backend& be, const std::vector<int32_t>& v, Shape shape) {
  Tensor t = be.scratch(shape, DType::kI32);
  if (!v.empty()) be.copy_from_host(t, v.data());
  return t;
}
}  // namespace

AttentionMetadata upload_attention_metadata(Backend& be, AttentionLayout layout) {
  AttentionMetadata m;
  m.num_seqs = static_cast<int>(layout.seq_lens.size());
  TESSERA_CHECK(layout.query_start_loc.size() == layout.seq_lens.size() + 1, "query_start_loc must have S+1 entries");
  m.num_tokens = layout.query_start_loc.back();
  TESSERA_CHECK(static_cast<int>(layout.slot_mapping.size()) == m.num_tokens, "slot_mapping must have T entries");
  TESSERA_CHECK(layout.block_tables.size() == static_cast<size_t>(m.num_seqs) * layout.max_blocks_per_seq,
                "block_tables must be S x max_blocks_per_seq");
  m.block_size = layout.block_size;
  m.max_blocks_per_seq = layout.max_blocks_per_seq;
  for (int s = 0; s < m.num_seqs; ++s) {
    m.max_query_len = std::max(m.max_query_len, layout.query_start_loc[s + 1] - layout.query_start_loc[s]);
    m.max_seq_len = std::max(m.max_seq_len, layout.seq_lens[s]);
  }
  m.query_start_loc = upload_i32(be, layout.query_start_loc, {m.num_seqs + 1});
  m.seq_lens = upload_i32(be, layout.seq_lens, {m.num_seqs});
  m.block_tables = upload_i32(be, layout.block_tables, {m.num_seqs, std::max(1, m.max_blocks_per_seq)});
  m.slot_mapping = upload_i32(be, layout.slot_mapping, {m.num_tokens});
  m.host_query_start_loc = std::move(layout.query_start_loc);
  m.host_seq_lens = std::move(layout.seq_lens);
  m.host_block_tables = std::move(layout.block_tables);
  m.host_slot_mapping = std::move(layout.slot_mapping);
  return m;
}

LinearAttnMetadata upload_linear_attn_metadata(Backend& be, LinearAttnLayout layout) {
  LinearAttnMetadata m;
  m.num_seqs = static_cast<int>(layout.state_slots.size());
  TESSERA_CHECK(layout.query_start_loc.size() == layout.state_slots.size() + 1,
                "query_start_loc must have S+1 entries");
  TESSERA_CHECK(layout.has_initial_state.size() == layout.state_slots.size(), "has_initial_state must have S entries");
  TESSERA_CHECK(layout.query_start_loc[0] == 0, "query_start_loc must start at 0");
  m.num_tokens = layout.query_start_loc.back();
  for (int s = 0; s < m.num_seqs; ++s) {
    const int len = layout.query_start_loc[s + 1] - layout.query_start_loc[s];
    TESSERA_CHECK(len >= 0, "query_start_loc must not decrease");
    m.max_query_len = std::max(m.max_query_len, len);
  }
  m.query_start_loc = upload_i32(be, layout.query_start_loc, {m.num_seqs + 1});
  m.state_slots = upload_i32(be, layout.state_slots, {std::max(1, m.num_seqs)});
  m.has_initial_state = upload_i32(be, layout.has_initial_state, {std::max(1, m.num_seqs)});
  m.host_query_start_loc = std::move(layout.query_start_loc);
  m.host_state_slots = std::move(layout.state_slots);
  m.host_has_initial_state = std::move(layout.has_initial_state);
  if (!layout.token_state_slots.empty()) {
    TESSERA_CHECK(static_cast<int>(layout.token_state_slots.size()) == m.num_tokens,
                  "token_state_slots must have one entry per token");
    m.token_state_slots = upload_i32(be, layout.token_state_slots, {m.num_tokens});
    m.host_token_state_slots = std::move(layout.token_state_slots);
  }
  return m;
}

}  // namespace tessera
