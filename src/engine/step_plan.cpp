#include "engine/step_plan.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "distributed/wire.h"

namespace tessera {

namespace {

constexpr uint32_t kPlanMagic = 0x504c5354;
constexpr uint8_t kPlanVersion = 6;
constexpr size_t kSamplingRowBytes = 4 * 4 + 2 * 8;

void check(bool ok, const char* what) {
  if (!ok) fail(ErrorKind::kCorrupt, "step plan: {}", what);
}

void write_input(dist::WireWriter& w, const ModelInput& in) {
  w.i32(in.attention.block_size);
  w.i32(in.attention.max_blocks_per_seq);
  w.i32(in.attention.num_kv_groups);
  for (const StepArray& f : kStepArrays) w.i32s(host_array(f, in));
}

void write_step(dist::WireWriter& w, uint64_t step, const ModelInput& in, const StepSampling& sampling) {
  w.u64(step);
  write_input(w, in);
  w.u32(static_cast<uint32_t>(sampling.rows.size()));
  for (const SamplingRow& s : sampling.rows) {
    w.f32(s.temperature);
    w.i32(s.top_k);
    w.f32(s.top_p);
    w.f32(s.min_p);
    w.u64(s.seed);
    w.u64(s.position);
  }
  w.i32s(sampling.host_rows);
  w.i32s(sampling.constrained_rows);
  w.i32s(sampling.mask_rows);
  w.i32(sampling.mask_words);
  w.i32s(sampling.masks);
}

void write_mtp(dist::WireWriter& w, uint64_t step, const MtpDraftInput& m) {
  w.u64(step);
  write_input(w, m.prefill);
  w.i32s(m.hidden_rows);
  w.i32(m.num_drafting);
  w.u32(static_cast<uint32_t>(m.chained.size()));
  for (const ModelInput& c : m.chained) write_input(w, c);
}

void write_cache_init(dist::WireWriter& w, const CacheInit& c) {
  w.i32(c.num_blocks);
  w.i32(c.block_size);
  w.u8(static_cast<uint8_t>(c.dtype));
  w.f32(c.k_scale);
  w.f32(c.v_scale);
  w.i32(c.max_model_len);
  w.i32(c.max_graph_batch);
  w.i32(c.graph_query_len);
  w.i32(c.num_state_slots);
  w.u8(static_cast<uint8_t>(c.conv_dtype));
  w.u8(static_cast<uint8_t>(c.ssm_dtype));
  w.i32s(std::vector<int32_t>(c.layer_groups.begin(), c.layer_groups.end()));
}

// The most entries an array of `extent` may claim in a plan of at most `cap` tokens.
uint32_t array_limit(StepExtent extent, size_t cap) {
  switch (extent) {
    case StepExtent::kSeqsPlusOne:
      return static_cast<uint32_t>(cap + 1);
    case StepExtent::kBlockTable:
      return 1u << 28;
    case StepExtent::kGroupTokens:
      return static_cast<uint32_t>(std::min<size_t>(cap * kMaxKvGroups, 1u << 28));
    case StepExtent::kPairs:
      return static_cast<uint32_t>(2 * cap);
    default:
      return static_cast<uint32_t>(cap);
  }
}

void read_sampling(dist::WireReader& r, size_t logits_rows, StepSampling& sampling) {
  const uint32_t nrows = r.u32();
  check(nrows == logits_rows && nrows <= r.remaining() / kSamplingRowBytes, "sampling rows count");
  sampling.rows.resize(nrows);
  for (SamplingRow& s : sampling.rows) {
    s.temperature = r.f32();
    s.top_k = r.i32();
    s.top_p = r.f32();
    s.min_p = r.f32();
    s.seed = r.u64();
    s.position = r.u64();
    check(std::isfinite(s.temperature) && s.temperature >= 0 && std::isfinite(s.top_p) && s.top_p > 0 &&
              std::isfinite(s.min_p) && s.min_p >= 0 && s.min_p <= 1,
          "sampling row values");
  }
  std::vector<int32_t>& host = sampling.host_rows;
  host = r.i32s("host_rows", nrows);
  for (size_t i = 0; i < host.size(); ++i)
    check(host[i] >= 0 && static_cast<uint32_t>(host[i]) < nrows && (i == 0 || host[i] > host[i - 1]),
          "host row numbers");
  std::vector<int32_t>& constrained = sampling.constrained_rows;
  constrained = r.i32s("constrained_rows", nrows);
  for (size_t i = 0; i < constrained.size(); ++i)
    check(constrained[i] >= 0 && static_cast<uint32_t>(constrained[i]) < nrows &&
              (i == 0 || constrained[i] > constrained[i - 1]),
          "constrained row numbers");
  std::vector<int32_t>& masked = sampling.mask_rows;
  masked = r.i32s("mask_rows", nrows);
  for (size_t i = 0; i < masked.size(); ++i)
    check(masked[i] >= 0 && static_cast<uint32_t>(masked[i]) < nrows && (i == 0 || masked[i] > masked[i - 1]),
          "mask row numbers");
  sampling.mask_words = r.i32();
  check(sampling.mask_words >= 0 && sampling.mask_words <= (1 << 20) && (masked.empty() || sampling.mask_words > 0),
        "mask width");
  const uint64_t words = static_cast<uint64_t>(masked.size()) * static_cast<uint64_t>(sampling.mask_words);
  check(words <= r.remaining() / 4, "mask words count");
  sampling.masks = r.i32s("masks", static_cast<uint32_t>(words));
  check(sampling.masks.size() == words, "mask words count");
}

// Every sequence's query range and length fit its block table; ids and indices in range.
void check_sequences(const ModelInput& in, const PlanLimits& lim) {
  const AttentionLayout& a = in.attention;
  const size_t T = in.token_ids.size();
  for (size_t s = 0; s < a.seq_lens.size(); ++s) {
    int32_t q = a.query_start_loc[s + 1] - a.query_start_loc[s];
    check(q >= 0, "query_start_loc decreases");
    check(a.seq_lens[s] >= q, "a sequence shorter than its new tokens");
    check(static_cast<int64_t>(a.seq_lens[s]) <= static_cast<int64_t>(a.max_blocks_per_seq) * a.block_size,
          "a sequence longer than its block table");
  }
  for (int32_t t : in.token_ids) check(t >= 0 && (lim.vocab_size == 0 || t < lim.vocab_size), "token id range");
  for (int32_t t : in.positions) check(t >= 0, "negative position");
  for (int32_t i : in.logits_indices) check(i >= 0 && static_cast<size_t>(i) < T, "logits index range");
  if (lim.num_blocks > 0) {
    for (int32_t b : a.block_tables) check(b >= 0 && b < lim.num_blocks, "block id beyond the cache");
    const int64_t slots = static_cast<int64_t>(lim.num_blocks) * a.block_size;
    for (int32_t s : a.slot_mapping) check(s >= -1 && s < slots, "slot beyond the cache");
  }
}

// The linear layout (absent, or one entry per sequence with attention's query ranges), its
// state slots distinct, and the state copies within the slots.
void check_state_slots(const ModelInput& in, const PlanLimits& lim) {
  const LinearAttnLayout& l = in.linear;
  if (!l.state_slots.empty()) {
    check(l.query_start_loc == in.attention.query_start_loc, "linear-attention layout does not match the sequences");
    for (int32_t h : l.has_initial_state) check(h == 0 || h == 1, "has_initial_state is not 0 or 1");
    std::vector<int32_t> used;
    for (int32_t slot : l.state_slots) {
      check(slot >= -1, "negative state slot");
      if (slot >= 0) used.push_back(slot);
    }
    std::sort(used.begin(), used.end());
    check(std::adjacent_find(used.begin(), used.end()) == used.end(), "two sequences share a state slot");
  }
  for (int32_t slot : l.token_state_slots) check(slot >= -1, "negative token state slot");
  for (int32_t c : in.state_copies) check(c >= 0, "negative state slot in a copy");
  if (lim.num_state_slots > 0) {
    for (int32_t slot : l.state_slots) check(slot < lim.num_state_slots, "state slot beyond the cache");
    for (int32_t slot : l.token_state_slots) check(slot < lim.num_state_slots, "token state slot beyond the cache");
    for (int32_t c : in.state_copies) check(c < lim.num_state_slots, "state slot beyond the cache");
  }
}

void read_input(dist::WireReader& r, const PlanLimits& lim, ModelInput& in) {
  AttentionLayout& a = in.attention;
  a.block_size = r.i32();
  a.max_blocks_per_seq = r.i32();
  a.num_kv_groups = r.i32();
  check(a.block_size > 0 && a.block_size <= 4096, "block size out of range");
  check(a.max_blocks_per_seq >= 0, "negative blocks per sequence");
  check(a.num_kv_groups >= 1 && a.num_kv_groups <= kMaxKvGroups, "KV cache group count out of range");
  for (const StepArray& f : kStepArrays) f.host(in) = r.i32s(f.name, array_limit(f.extent, lim.max_tokens));
}

// What read_input read, once the whole plan is in.
void check_input(const ModelInput& in, const PlanLimits& lim) {
  check(!in.token_ids.empty(), "no tokens");
  const std::string layout = step_input_layout_error(in);
  if (!layout.empty()) fail(ErrorKind::kCorrupt, "step plan: {}", layout);
  check_sequences(in, lim);
  check_state_slots(in, lim);
}

void read_step(dist::WireReader& r, const PlanLimits& lim, StepPlan& p) {
  p.step = r.u64();
  read_input(r, lim, p.input);
  read_sampling(r, p.input.logits_indices.size(), p.sampling);
  r.expect_end();
  check_input(p.input, lim);
}

// The MTP passes: the first over T positions (its hidden rows, one a token), each chained pass one
// token per drafting sequence.
void read_mtp(dist::WireReader& r, const PlanLimits& lim, StepPlan& p) {
  MtpDraftInput& m = p.mtp;
  p.step = r.u64();
  read_input(r, lim, m.prefill);
  m.hidden_rows = r.i32s("hidden_rows", static_cast<uint32_t>(lim.max_tokens));
  m.num_drafting = r.i32();
  const uint32_t chained = r.u32();
  check(chained < static_cast<uint32_t>(std::max(lim.max_mtp_passes, 1)), "MTP pass count");
  m.chained.resize(chained);
  for (ModelInput& c : m.chained) read_input(r, lim, c);
  r.expect_end();
  check_input(m.prefill, lim);
  const size_t T = m.prefill.token_ids.size();
  check(m.hidden_rows.size() == T, "MTP hidden rows count");
  for (int32_t h : m.hidden_rows) check(h >= 0 && static_cast<size_t>(h) < lim.max_tokens, "MTP hidden row range");
  check(m.num_drafting >= 0 && static_cast<size_t>(m.num_drafting) <= m.prefill.attention.seq_lens.size() &&
            (m.num_drafting == 0 || m.prefill.logits_indices.size() == static_cast<size_t>(m.num_drafting)),
        "MTP drafting sequences");
  for (const ModelInput& c : m.chained) {
    check(c.token_ids.size() == static_cast<size_t>(m.num_drafting) && m.num_drafting > 0, "MTP chained pass size");
    check_input(c, lim);
  }
}

void read_cache_init(dist::WireReader& r, CacheInit& c) {
  c.num_blocks = r.i32();
  c.block_size = r.i32();
  const uint8_t dt = r.u8();
  c.k_scale = r.f32();
  c.v_scale = r.f32();
  c.max_model_len = r.i32();
  c.max_graph_batch = r.i32();
  c.graph_query_len = r.i32();
  c.num_state_slots = r.i32();
  const uint8_t conv_dt = r.u8(), ssm_dt = r.u8();
  const std::vector<int32_t> groups = r.i32s("layer_groups", 1u << 16);
  r.expect_end();
  for (int32_t g : groups) check(g >= -1 && g < kMaxKvGroups, "layer group out of range");
  c.layer_groups.assign(groups.begin(), groups.end());
  check(c.num_state_slots >= 0 && c.num_state_slots <= (1 << 24), "state slot count");
  for (uint8_t d : {conv_dt, ssm_dt})
    check(d == static_cast<uint8_t>(DType::kF32) || d == static_cast<uint8_t>(DType::kBF16), "state dtype");
  c.conv_dtype = static_cast<DType>(conv_dt);
  c.ssm_dtype = static_cast<DType>(ssm_dt);
  check(c.max_model_len >= 0 && c.max_graph_batch >= 0 && c.max_graph_batch <= 4096 && c.graph_query_len >= 1 &&
            c.graph_query_len <= 17,
        "graph sizes");
  check(c.num_blocks > 0 && c.block_size > 0 && c.block_size <= 4096, "cache size");
  check(dt <= static_cast<uint8_t>(DType::kF8E5M2), "cache dtype");
  c.dtype = static_cast<DType>(dt);
}

}  // namespace

std::vector<int32_t> argmax_rows(const StepSampling& s) {
  std::vector<int32_t> rows;
  size_t host = 0, con = 0;
  for (size_t i = 0; i < s.rows.size(); ++i) {
    const int32_t r = static_cast<int32_t>(i);
    while (host < s.host_rows.size() && s.host_rows[host] < r) ++host;
    while (con < s.constrained_rows.size() && s.constrained_rows[con] < r) ++con;
    const bool whole = (host < s.host_rows.size() && s.host_rows[host] == r) ||
                       (con < s.constrained_rows.size() && s.constrained_rows[con] == r);
    if (!whole && s.rows[i].temperature < 1e-5f) rows.push_back(r);
  }
  return rows;
}

std::vector<uint8_t> encode_step_plan(const StepPlan& p) {
  dist::WireWriter w;
  w.u32(kPlanMagic);
  w.u8(kPlanVersion);
  w.u8(static_cast<uint8_t>(p.kind));
  w.u16(0);
  switch (p.kind) {
    case PlanKind::kStep:
      write_step(w, p.step, p.input, p.sampling);
      break;
    case PlanKind::kInitCache:
      write_cache_init(w, p.cache);
      break;
    case PlanKind::kShutdown:
      break;
    case PlanKind::kMtpDraft:
      write_mtp(w, p.step, p.mtp);
      break;
  }
  return w.take();
}

StepPlan decode_step_plan(std::span<const uint8_t> bytes, const PlanLimits& lim) {
  dist::WireReader r(bytes, "step plan");
  check(r.u32() == kPlanMagic, "bad magic");
  check(r.u8() == kPlanVersion, "unknown version");
  const uint8_t kind = r.u8();
  check(r.u16() == 0, "reserved bits set");
  StepPlan p;
  switch (kind) {
    case static_cast<uint8_t>(PlanKind::kStep):
      p.kind = PlanKind::kStep;
      read_step(r, lim, p);
      break;
    case static_cast<uint8_t>(PlanKind::kInitCache):
      p.kind = PlanKind::kInitCache;
      read_cache_init(r, p.cache);
      break;
    case static_cast<uint8_t>(PlanKind::kShutdown):
      p.kind = PlanKind::kShutdown;
      r.expect_end();
      break;
    case static_cast<uint8_t>(PlanKind::kMtpDraft):
      p.kind = PlanKind::kMtpDraft;
      read_mtp(r, lim, p);
      break;
    default:
      fail(ErrorKind::kCorrupt, "step plan: unknown kind {}", kind);
  }
  return p;
}

}  // namespace tessera
