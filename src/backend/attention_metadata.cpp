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
  const int G = layout.num_kv_groups;
  TESSERA_CHECK(G >= 1 && G <= kMaxKvGroups, "{} KV cache groups", G);
  TESSERA_CHECK(static_cast<int64_t>(layout.slot_mapping.size()) == int64_t{G} * m.num_tokens,
                "slot_mapping must have G x T entries");
  TESSERA_CHECK(layout.block_tables.size() == static_cast<size_t>(G) * m.num_seqs * layout.max_blocks_per_seq,
                "block_tables must be G x S x max_blocks_per_seq");
  m.block_size = layout.block_size;
  m.max_blocks_per_seq = layout.max_blocks_per_seq;
  m.num_kv_groups = G;
  for (int s = 0; s < m.num_seqs; ++s) {
    m.max_query_len = std::max(m.max_query_len, layout.query_start_loc[s + 1] - layout.query_start_loc[s]);
    m.max_seq_len = std::max(m.max_seq_len, layout.seq_lens[s]);
  }
  m.query_start_loc = upload_i32(be, layout.query_start_loc, {m.num_seqs + 1});
  m.seq_lens = upload_i32(be, layout.seq_lens, {m.num_seqs});
  m.block_tables = upload_i32(be, layout.block_tables, {G * m.num_seqs, std::max(1, m.max_blocks_per_seq)});
  m.slot_mapping = upload_i32(be, layout.slot_mapping, {G * m.num_tokens});
  m.host_query_start_loc = std::move(layout.query_start_loc);
  m.host_seq_lens = std::move(layout.seq_lens);
  m.host_block_tables = std::move(layout.block_tables);
  m.host_slot_mapping = std::move(layout.slot_mapping);
  return m;
}

AttentionMetadata attention_group(const AttentionMetadata& m, int g) {
  TESSERA_CHECK(g >= 0 && g < m.num_kv_groups, "KV cache group {} of a step with {}", g, m.num_kv_groups);
  if (m.num_kv_groups == 1) return m;
  const int64_t S = m.num_seqs, T = m.num_tokens;
  AttentionMetadata r = m.sizes();
  r.query_start_loc = m.query_start_loc;
  r.seq_lens = m.seq_lens;
  r.block_tables = m.block_tables.rows(g * S, (g + 1) * S);
  r.slot_mapping = m.slot_mapping.rows(g * T, (g + 1) * T);
  r.host_query_start_loc = m.host_query_start_loc;
  r.host_seq_lens = m.host_seq_lens;
  auto slice = [g](const std::vector<int32_t>& v, int64_t n) {
    if (v.empty()) return std::vector<int32_t>{};
    return std::vector<int32_t>(v.begin() + g * n, v.begin() + (g + 1) * n);
  };
  r.host_block_tables = slice(m.host_block_tables, S * m.max_blocks_per_seq);
  r.host_slot_mapping = slice(m.host_slot_mapping, T);
  return r;
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
