#include "model/step_inputs.h"

#include <algorithm>

#include "core/error.h"

namespace tessera {

namespace {
using HostArray = std::vector<int32_t>;
}  // namespace

// clang-format off
const std::array<StepArray, 12> kStepArrays = {{
    {"token_ids", StepExtent::kTokens, false, GraphInput::kPerRow, 0,
     [](ModelInput& in) -> HostArray& { return in.token_ids; },
     [](StepInputs& s) { return &s.token_ids; }, nullptr},
    {"positions", StepExtent::kTokens, false, GraphInput::kPerRow, 0,
     [](ModelInput& in) -> HostArray& { return in.positions; },
     [](StepInputs& s) { return &s.positions; }, nullptr},
    {"query_start_loc", StepExtent::kSeqsPlusOne, false, GraphInput::kShape, 0,
     [](ModelInput& in) -> HostArray& { return in.attention.query_start_loc; },
     [](StepInputs& s) { return &s.attention.query_start_loc; },
     [](StepInputs& s) { return &s.attention.host_query_start_loc; }},
    // A padding row reads q cached keys of block 0.
    {"seq_lens", StepExtent::kSeqs, false, GraphInput::kPerRow, kPadQueryLen,
     [](ModelInput& in) -> HostArray& { return in.attention.seq_lens; },
     [](StepInputs& s) { return &s.attention.seq_lens; },
     [](StepInputs& s) { return &s.attention.host_seq_lens; }},
    {"block_tables", StepExtent::kBlockTable, false, GraphInput::kBlockTable, 0,
     [](ModelInput& in) -> HostArray& { return in.attention.block_tables; },
     [](StepInputs& s) { return &s.attention.block_tables; },
     [](StepInputs& s) { return &s.attention.host_block_tables; }},
    // A padding row writes no KV.
    {"slot_mapping", StepExtent::kGroupTokens, false, GraphInput::kPerRow, -1,
     [](ModelInput& in) -> HostArray& { return in.attention.slot_mapping; },
     [](StepInputs& s) { return &s.attention.slot_mapping; },
     [](StepInputs& s) { return &s.attention.host_slot_mapping; }},
    {"logits_indices", StepExtent::kAnyCount, false, GraphInput::kShape, 0,
     [](ModelInput& in) -> HostArray& { return in.logits_indices; },
     [](StepInputs& s) { return &s.logits_indices; }, nullptr},
    {"linear query_start_loc", StepExtent::kSeqsPlusOne, true, GraphInput::kShape, 0,
     [](ModelInput& in) -> HostArray& { return in.linear.query_start_loc; },
     [](StepInputs& s) { return &s.linear.query_start_loc; },
     [](StepInputs& s) { return &s.linear.host_query_start_loc; }},
    // A padding row has no state slot (the linear-attention ops skip it).
    {"state_slots", StepExtent::kSeqs, true, GraphInput::kPerRow, -1,
     [](ModelInput& in) -> HostArray& { return in.linear.state_slots; },
     [](StepInputs& s) { return &s.linear.state_slots; },
     [](StepInputs& s) { return &s.linear.host_state_slots; }},
    {"has_initial_state", StepExtent::kSeqs, true, GraphInput::kPerRow, 0,
     [](ModelInput& in) -> HostArray& { return in.linear.has_initial_state; },
     [](StepInputs& s) { return &s.linear.has_initial_state; },
     [](StepInputs& s) { return &s.linear.host_has_initial_state; }},
    // Speculative decoding's verification steps: the slot of the state after each token (a
    // padding token keeps none).
    {"token_state_slots", StepExtent::kTokens, true, GraphInput::kPerRow, -1,
     [](ModelInput& in) -> HostArray& { return in.linear.token_state_slots; },
     [](StepInputs& s) { return &s.linear.token_state_slots; },
     [](StepInputs& s) { return &s.linear.host_token_state_slots; }},
    {"state_copies", StepExtent::kPairs, true, GraphInput::kNone, 0,
     [](ModelInput& in) -> HostArray& { return in.state_copies; }, nullptr, nullptr},
}};
// clang-format on

std::string step_input_layout_error(const ModelInput& in) {
  const AttentionLayout& a = in.attention;
  const size_t T = in.token_ids.size(), S = a.seq_lens.size();
  if (a.max_blocks_per_seq < 0) return "negative blocks per sequence";
  if (a.num_kv_groups < 1 || a.num_kv_groups > kMaxKvGroups)
    return fmt::format("{} KV cache groups (1 to {})", a.num_kv_groups, kMaxKvGroups);
  const size_t G = static_cast<size_t>(a.num_kv_groups);
  for (const StepArray& f : kStepArrays) {
    const HostArray& v = host_array(f, in);
    if (f.optional && v.empty()) continue;
    size_t want = 0;
    switch (f.extent) {
      case StepExtent::kTokens:
        want = T;
        break;
      case StepExtent::kGroupTokens:
        want = G * T;
        break;
      case StepExtent::kSeqs:
        want = S;
        break;
      case StepExtent::kSeqsPlusOne:
        want = S + 1;
        break;
      case StepExtent::kBlockTable:
        want = G * S * static_cast<size_t>(a.max_blocks_per_seq);
        break;
      case StepExtent::kAnyCount:
        continue;
      case StepExtent::kPairs:
        if (v.size() % 2 != 0) return fmt::format("{} are not pairs", f.name);
        continue;
    }
    if (v.size() != want)
      return fmt::format("{} has {} entries for {} tokens of {} sequences, not {}", f.name, v.size(), T, S, want);
  }
  const LinearAttnLayout& l = in.linear;
  if (l.query_start_loc.empty() != l.state_slots.empty() || l.state_slots.empty() != l.has_initial_state.empty() ||
      (!l.token_state_slots.empty() && l.state_slots.empty()))
    return "the linear-attention layout is incomplete";
  if (a.query_start_loc.front() != 0 || static_cast<size_t>(a.query_start_loc.back()) != T)
    return "query_start_loc does not run from 0 to the token count";
  return "";
}

void check_step_input(const ModelInput& in, int vocab, int max_positions) {
  TESSERA_CHECK(!in.token_ids.empty() && in.positions.size() == in.token_ids.size(), "forward: {} tokens, {} positions",
                in.token_ids.size(), in.positions.size());
  for (int32_t id : in.token_ids)
    if (id < 0 || id >= vocab) fail(ErrorKind::kInvalidArgument, "token id {} outside the vocabulary", id);
  for (int32_t p : in.positions)
    if (p < 0 || p >= max_positions)
      fail(ErrorKind::kInvalidArgument, "position {} is beyond the model's {} positions", p, max_positions);
}

namespace {

// The sizes and launch facts the kernels take from the host arrays.
void set_eager_metadata(const ModelInput& in, StepInputs& s) {
  const AttentionLayout& a = in.attention;
  AttentionMetadata& m = s.attention;
  m.num_seqs = static_cast<int>(a.seq_lens.size());
  m.num_tokens = a.query_start_loc.back();
  m.block_size = a.block_size;
  m.max_blocks_per_seq = a.max_blocks_per_seq;
  m.num_kv_groups = a.num_kv_groups;
  for (int i = 0; i < m.num_seqs; ++i) {
    m.max_query_len = std::max(m.max_query_len, a.query_start_loc[i + 1] - a.query_start_loc[i]);
    m.max_seq_len = std::max(m.max_seq_len, a.seq_lens[i]);
  }
  const LinearAttnLayout& l = in.linear;
  if (l.query_start_loc.empty()) return;
  LinearAttnMetadata& lm = s.linear;
  lm.num_seqs = static_cast<int>(l.state_slots.size());
  lm.num_tokens = l.query_start_loc.back();
  for (int i = 0; i < lm.num_seqs; ++i)
    lm.max_query_len = std::max(lm.max_query_len, l.query_start_loc[i + 1] - l.query_start_loc[i]);
}

}  // namespace

void mtp_fc_order(int64_t T, int32_t* out) {
  for (int64_t t = 0; t < T; ++t) {
    out[2 * t] = static_cast<int32_t>(t);
    out[2 * t + 1] = static_cast<int32_t>(T + t);
  }
}

StepInputs upload_step_inputs(Backend& be, const ModelInput& in, int vocab, int max_positions) {
  check_step_input(in, vocab, max_positions);
  const std::string layout = step_input_layout_error(in);
  TESSERA_CHECK(layout.empty(), "forward: {}", layout);
  StepInputs s;
  for (const StepArray& f : kStepArrays) {
    const HostArray& v = host_array(f, in);
    if (!f.device || (f.optional && v.empty())) continue;
    const int64_t n = static_cast<int64_t>(v.size());
    const int64_t table_rows = int64_t{in.attention.num_kv_groups} * static_cast<int64_t>(in.attention.seq_lens.size());
    const Shape shape = f.extent == StepExtent::kBlockTable
                            ? Shape{table_rows, std::max(1, in.attention.max_blocks_per_seq)}
                            : Shape{n};
    Tensor t = be.scratch(shape, DType::kI32);
    if (n > 0) be.copy_from_host(t, v.data());
    *f.device(s) = t;
    if (f.host_copy) *f.host_copy(s) = v;
  }
  set_eager_metadata(in, s);
  return s;
}

}  // namespace tessera
