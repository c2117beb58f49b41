// The step plan's binary format: round trip, and every damaged plan refused (no crash, no
// over-read, no huge allocation).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "engine/step_plan.h"

namespace tessera {
namespace {

StepPlan sample_plan() {
  StepPlan p;
  p.kind = PlanKind::kStep;
  p.step = 42;
  ModelInput& in = p.input;
  in.token_ids = {5, 6, 7, 8};
  in.positions = {0, 1, 2, 9};
  in.attention.block_size = 16;
  in.attention.max_blocks_per_seq = 2;
  in.attention.query_start_loc = {0, 3, 4};
  in.attention.seq_lens = {3, 10};
  in.attention.block_tables = {0, 0, 1, 2};
  in.attention.slot_mapping = {0, 1, 2, 25};
  in.logits_indices = {2, 3};
  SamplingRow greedy, drawn;
  drawn.temperature = 0.7f;
  drawn.top_k = 50;
  drawn.top_p = 0.9f;
  drawn.min_p = 0.05f;
  drawn.seed = 0x1234567890abcdefull;
  drawn.position = 17;
  p.sampling.rows = {greedy, drawn};
  p.sampling.host_rows = {1};
  p.sampling.constrained_rows = {0};
  return p;
}

TEST(StepPlan, RoundTrip) {
  StepPlan p = sample_plan();
  StepPlan q = decode_step_plan(encode_step_plan(p), PlanLimits{256, 4});
  EXPECT_EQ(q.kind, PlanKind::kStep);
  EXPECT_EQ(q.step, 42u);
  EXPECT_EQ(q.input.token_ids, p.input.token_ids);
  EXPECT_EQ(q.input.positions, p.input.positions);
  EXPECT_EQ(q.input.attention.query_start_loc, p.input.attention.query_start_loc);
  EXPECT_EQ(q.input.attention.seq_lens, p.input.attention.seq_lens);
  EXPECT_EQ(q.input.attention.block_tables, p.input.attention.block_tables);
  EXPECT_EQ(q.input.attention.slot_mapping, p.input.attention.slot_mapping);
  EXPECT_EQ(q.input.logits_indices, p.input.logits_indices);
  EXPECT_EQ(q.input.attention.max_blocks_per_seq, 2);
  ASSERT_EQ(q.sampling.rows.size(), 2u);
  EXPECT_EQ(q.sampling.rows[0].temperature, 0.0f);
  EXPECT_EQ(q.sampling.rows[1].temperature, 0.7f);
  EXPECT_EQ(q.sampling.rows[1].top_k, 50);
  EXPECT_EQ(q.sampling.rows[1].top_p, 0.9f);
  EXPECT_EQ(q.sampling.rows[1].min_p, 0.05f);
  EXPECT_EQ(q.sampling.rows[1].seed, 0x1234567890abcdefull);
  EXPECT_EQ(q.sampling.rows[1].position, 17u);
  EXPECT_EQ(q.sampling.host_rows, p.sampling.host_rows);
  EXPECT_EQ(q.sampling.constrained_rows, p.sampling.constrained_rows);

  StepPlan init;
  init.kind = PlanKind::kInitCache;
  init.cache = CacheInit{100, 16, DType::kBF16, 0.5f, 2.0f};
  init.cache.max_graph_batch = 64;
  init.cache.graph_query_len = 4;
  StepPlan j = decode_step_plan(encode_step_plan(init), {});
  EXPECT_EQ(j.cache.num_blocks, 100);
  EXPECT_EQ(j.cache.max_graph_batch, 64);
  EXPECT_EQ(j.cache.graph_query_len, 4);
  EXPECT_EQ(j.cache.dtype, DType::kBF16);
  EXPECT_EQ(j.cache.v_scale, 2.0f);
  StepPlan s;
  s.kind = PlanKind::kShutdown;
  EXPECT_EQ(decode_step_plan(encode_step_plan(s), {}).kind, PlanKind::kShutdown);
}

// A model with several KV cache groups (full attention beside windowed layers): a block table and a
// slot mapping per group, one after the other, and each layer's group in the cache's init.
TEST(StepPlan, KvCacheGroupsRoundTrip) {
  StepPlan p = sample_plan();
  AttentionLayout& a = p.input.attention;
  a.num_kv_groups = 2;
  a.block_tables = {0, 0, 1, 2, 3, 0, 0, 3};  // group 1: block 0 freed by its window in sequence 1
  a.slot_mapping = {0, 1, 2, 25, 48, 49, 50, 57};
  StepPlan q = decode_step_plan(encode_step_plan(p), PlanLimits{256, 4});
  EXPECT_EQ(q.input.attention.num_kv_groups, 2);
  EXPECT_EQ(q.input.attention.block_tables, a.block_tables);
  EXPECT_EQ(q.input.attention.slot_mapping, a.slot_mapping);
  // One group's worth of slots for two groups: refused.
  a.slot_mapping.resize(4);
  EXPECT_THROW(decode_step_plan(encode_step_plan(p), PlanLimits{256, 4}), Error);
  a.slot_mapping = {0, 1, 2, 25, 48, 49, 50, 57};
  a.num_kv_groups = 0;
  EXPECT_THROW(decode_step_plan(encode_step_plan(p), PlanLimits{256, 4}), Error);

  StepPlan init;
  init.kind = PlanKind::kInitCache;
  init.cache = CacheInit{100, 16, DType::kBF16, 1.0f, 1.0f};
  init.cache.layer_groups = {0, 1, 2, -1};
  EXPECT_EQ(decode_step_plan(encode_step_plan(init), {}).cache.layer_groups, init.cache.layer_groups);
  init.cache.layer_groups = {0, kMaxKvGroups};
  EXPECT_THROW(decode_step_plan(encode_step_plan(init), {}), Error);
}

// A hybrid model's step: the linear-attention layout and state copies travel too.
StepPlan hybrid_plan() {
  StepPlan p = sample_plan();
  p.input.linear.query_start_loc = p.input.attention.query_start_loc;
  p.input.linear.state_slots = {3, 0};
  p.input.linear.has_initial_state = {0, 1};
  p.input.state_copies = {1, 0, 2, 3};
  return p;
}

TEST(StepPlan, LinearAttentionLayoutAndStateSlotsRoundTrip) {
  StepPlan p = hybrid_plan();
  PlanLimits lim{256, 4};
  lim.num_state_slots = 4;
  StepPlan q = decode_step_plan(encode_step_plan(p), lim);
  EXPECT_EQ(q.input.linear.query_start_loc, p.input.linear.query_start_loc);
  EXPECT_EQ(q.input.linear.state_slots, p.input.linear.state_slots);
  EXPECT_EQ(q.input.linear.has_initial_state, p.input.linear.has_initial_state);
  EXPECT_EQ(q.input.state_copies, p.input.state_copies);
  EXPECT_EQ(q.input.token_ids, p.input.token_ids);
  EXPECT_TRUE(decode_step_plan(encode_step_plan(sample_plan()), lim).input.linear.state_slots.empty());
  EXPECT_TRUE(q.input.linear.token_state_slots.empty());
  // Speculative decoding: the slot each token's state goes to.
  p.input.linear.token_state_slots.assign(p.input.token_ids.size(), -1);
  p.input.linear.token_state_slots[0] = 2;
  p.input.linear.token_state_slots.back() = 1;
  EXPECT_EQ(decode_step_plan(encode_step_plan(p), lim).input.linear.token_state_slots,
            p.input.linear.token_state_slots);

  StepPlan init;
  init.kind = PlanKind::kInitCache;
  init.cache.num_blocks = 10;
  init.cache.num_state_slots = 80;
  init.cache.conv_dtype = DType::kBF16;
  init.cache.ssm_dtype = DType::kF32;
  StepPlan j = decode_step_plan(encode_step_plan(init), {});
  EXPECT_EQ(j.cache.num_state_slots, 80);
  EXPECT_EQ(j.cache.conv_dtype, DType::kBF16);
  EXPECT_EQ(j.cache.ssm_dtype, DType::kF32);
  init.cache.ssm_dtype = DType::kI32;
  EXPECT_THROW(decode_step_plan(encode_step_plan(init), {}), Error);
  init.cache.ssm_dtype = DType::kF32;
  init.cache.num_state_slots = -1;
  EXPECT_THROW(decode_step_plan(encode_step_plan(init), {}), Error);
}

TEST(StepPlan, RefusesBadLinearAttentionLayouts) {
  PlanLimits lim{256, 4};
  lim.num_state_slots = 4;
  auto refused = [&](auto damage) {
    StepPlan p = hybrid_plan();
    damage(p.input);
    EXPECT_THROW(decode_step_plan(encode_step_plan(p), lim), Error);
  };
  refused([](ModelInput& in) { in.linear.state_slots = {4, 0}; });         // beyond the slots
  refused([](ModelInput& in) { in.linear.state_slots = {1, 1}; });         // shared
  refused([](ModelInput& in) { in.linear.state_slots = {-2, 0}; });        // negative
  refused([](ModelInput& in) { in.linear.state_slots.pop_back(); });       // not one per sequence
  refused([](ModelInput& in) { in.linear.has_initial_state = {0, 2}; });   // not a flag
  refused([](ModelInput& in) { in.linear.query_start_loc = {0, 2, 4}; });  // other ranges than attention's
  refused([](ModelInput& in) { in.state_copies = {1, 0, 2}; });            // not pairs
  refused([](ModelInput& in) { in.state_copies = {1, 9}; });               // beyond the slots
  refused([](ModelInput& in) { in.linear.token_state_slots = {1}; });      // not one per token
  refused([](ModelInput& in) { in.linear.token_state_slots.assign(in.token_ids.size(), 7); });   // beyond
  refused([](ModelInput& in) { in.linear.token_state_slots.assign(in.token_ids.size(), -3); });  // negative
  StepPlan pad = hybrid_plan();
  pad.input.linear.state_slots = {-1, -1};  // padding sequences may both be -1
  EXPECT_NO_THROW(decode_step_plan(encode_step_plan(pad), lim));
}

TEST(StepPlan, RefusesIndicesBeyondWhatTheRankHas) {
  StepPlan p = sample_plan();
  EXPECT_THROW(decode_step_plan(encode_step_plan(p), PlanLimits{8, 4}), Error);    // token 8 >= vocab 8
  EXPECT_THROW(decode_step_plan(encode_step_plan(p), PlanLimits{256, 2}), Error);  // block 2 of 2
  p.input.logits_indices = {4};
  EXPECT_THROW(decode_step_plan(encode_step_plan(p), {}), Error);
  p = sample_plan();
  p.input.attention.query_start_loc = {0, 5, 4};
  EXPECT_THROW(decode_step_plan(encode_step_plan(p), {}), Error);
  p = sample_plan();
  p.input.positions.pop_back();
  EXPECT_THROW(decode_step_plan(encode_step_plan(p), {}), Error);
  p = sample_plan();
  p.sampling.rows.pop_back();  // one row per logits index
  EXPECT_THROW(decode_step_plan(encode_step_plan(p), {}), Error);
  p = sample_plan();
  p.sampling.host_rows = {2};
  EXPECT_THROW(decode_step_plan(encode_step_plan(p), {}), Error);
  p = sample_plan();
  p.sampling.rows[1].top_p = std::nanf("");
  EXPECT_THROW(decode_step_plan(encode_step_plan(p), {}), Error);
}

// MTP drafting after a step (kMtpDraft): the first pass over the step's positions, its hidden
// rows, and the chained passes, one token per drafting sequence.
StepPlan mtp_plan() {
  StepPlan p;
  p.kind = PlanKind::kMtpDraft;
  p.step = 9;
  MtpDraftInput& m = p.mtp;
  ModelInput& pre = m.prefill;
  pre.token_ids = {6, 7, 8, 30};
  pre.positions = {0, 1, 2, 9};
  pre.attention.block_size = 16;
  pre.attention.max_blocks_per_seq = 2;
  pre.attention.query_start_loc = {0, 3, 4};
  pre.attention.seq_lens = {3, 10};
  pre.attention.block_tables = {0, 0, 1, 2};
  pre.attention.slot_mapping = {0, 1, 2, 25};
  pre.logits_indices = {2, 3};
  m.hidden_rows = {0, 1, 2, 3};
  m.num_drafting = 2;
  ModelInput c;
  c.token_ids = {0, 0};
  c.positions = {3, 10};
  c.attention.block_size = 16;
  c.attention.max_blocks_per_seq = 2;
  c.attention.query_start_loc = {0, 1, 2};
  c.attention.seq_lens = {4, 11};
  c.attention.block_tables = {0, 0, 1, 2};
  c.attention.slot_mapping = {3, -1};
  c.logits_indices = {0, 1};
  m.chained = {c};
  return p;
}

TEST(StepPlan, MtpDraftRoundTripAndRefusals) {
  const StepPlan p = mtp_plan();
  const StepPlan q = decode_step_plan(encode_step_plan(p), PlanLimits{256, 4});
  ASSERT_EQ(q.kind, PlanKind::kMtpDraft);
  EXPECT_EQ(q.step, 9u);
  EXPECT_EQ(q.mtp.prefill.token_ids, p.mtp.prefill.token_ids);
  EXPECT_EQ(q.mtp.prefill.positions, p.mtp.prefill.positions);
  EXPECT_EQ(q.mtp.prefill.attention.slot_mapping, p.mtp.prefill.attention.slot_mapping);
  EXPECT_EQ(q.mtp.prefill.attention.block_tables, p.mtp.prefill.attention.block_tables);
  EXPECT_EQ(q.mtp.prefill.logits_indices, p.mtp.prefill.logits_indices);
  EXPECT_EQ(q.mtp.hidden_rows, p.mtp.hidden_rows);
  EXPECT_EQ(q.mtp.num_drafting, 2);
  ASSERT_EQ(q.mtp.chained.size(), 1u);
  EXPECT_EQ(q.mtp.chained[0].positions, p.mtp.chained[0].positions);
  EXPECT_EQ(q.mtp.chained[0].attention.seq_lens, p.mtp.chained[0].attention.seq_lens);
  EXPECT_EQ(q.mtp.chained[0].attention.slot_mapping, p.mtp.chained[0].attention.slot_mapping);
  // No drafting sequence: the first pass alone (its KV), one unused logits row.
  StepPlan none = mtp_plan();
  none.mtp.num_drafting = 0;
  none.mtp.chained.clear();
  none.mtp.prefill.logits_indices = {0};
  EXPECT_EQ(decode_step_plan(encode_step_plan(none), {}).mtp.num_drafting, 0);

  StepPlan bad = mtp_plan();
  bad.mtp.hidden_rows.pop_back();  // one hidden row a position
  EXPECT_THROW(decode_step_plan(encode_step_plan(bad), {}), Error);
  bad = mtp_plan();
  bad.mtp.hidden_rows[1] = -1;
  EXPECT_THROW(decode_step_plan(encode_step_plan(bad), {}), Error);
  bad = mtp_plan();
  bad.mtp.num_drafting = 3;  // more than the sequences
  EXPECT_THROW(decode_step_plan(encode_step_plan(bad), {}), Error);
  bad = mtp_plan();
  bad.mtp.chained[0].token_ids.push_back(0);  // a chained pass is one token a drafting sequence
  bad.mtp.chained[0].positions.push_back(11);
  EXPECT_THROW(decode_step_plan(encode_step_plan(bad), {}), Error);
  bad = mtp_plan();
  bad.mtp.chained[0].attention.slot_mapping[0] = 64;  // beyond 4 blocks of 16
  EXPECT_THROW(decode_step_plan(encode_step_plan(bad), PlanLimits{256, 4}), Error);
  bad = mtp_plan();
  bad.mtp.chained.assign(16, bad.mtp.chained[0]);  // k is at most 16: 15 chained passes
  EXPECT_THROW(decode_step_plan(encode_step_plan(bad), {}), Error);
  const std::vector<uint8_t> b = encode_step_plan(mtp_plan());
  for (size_t n = 0; n < b.size(); ++n)
    EXPECT_THROW(decode_step_plan(std::vector<uint8_t>(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n)), {}),
                 Error)
        << n;
}

TEST(StepPlan, TruncatedTrailingAndRandomBytesAreRefused) {
  std::vector<uint8_t> b = encode_step_plan(sample_plan());
  for (size_t n = 0; n < b.size(); ++n) {
    std::vector<uint8_t> t(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(decode_step_plan(t, {}), Error) << n;
  }
  std::vector<uint8_t> longer = b;
  longer.push_back(0);
  EXPECT_THROW(decode_step_plan(longer, {}), Error);
  // A count that claims more entries than bytes remain.
  std::vector<uint8_t> lying = b;
  lying[8 + 8 + 8] = 0xff;  // low byte of token_ids' count
  lying[8 + 8 + 8 + 3] = 0x7f;
  EXPECT_THROW(decode_step_plan(lying, {}), Error);
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> m = b;
    m[rng() % m.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    try {
      StepPlan q = decode_step_plan(m, PlanLimits{256, 4});
      EXPECT_EQ(q.input.positions.size(), q.input.token_ids.size());
    } catch (const Error&) {
    }
  }
}

// The rows whose greedy pick alone is read (what tensor parallelism gathers as (max, id) pairs):
// temperature 0 and neither a host row nor a row of a constrained sequence (which may be masked).
TEST(StepPlan, ArgmaxRowsAreTheGreedyRowsThatNeedNothingElse) {
  StepSampling s;
  s.rows.resize(7);
  s.rows[2].temperature = 0.7f;   // drawn
  s.rows[5].temperature = 1e-6f;  // below SamplingRow's greedy threshold: greedy
  s.host_rows = {1, 4};           // logprobs, penalties and the like (their SamplingRow is greedy)
  s.constrained_rows = {3};       // structured output (the masks may not be filled yet)
  EXPECT_EQ(argmax_rows(s), (std::vector<int32_t>{0, 5, 6}));
  s.host_rows.clear();
  s.constrained_rows.clear();
  s.rows[2].temperature = 0;
  EXPECT_EQ(argmax_rows(s), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(argmax_rows(StepSampling{}).empty());
}

}  // namespace
}  // namespace tessera
