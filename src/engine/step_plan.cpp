#include "engine/step_plan.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace tessera {

namespace {

constexpr uint32_t kPlanMagic = 0x504c5354;
constexpr uint8_t kPlanVersion = 4;

struct Writer {
  std::vector<uint8_t> out;
  template <typename T>
  void put(T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
    out.insert(out.end(), b, b + sizeof(T));
  }
  void array(const std::vector<int32_t>& v) {
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (int32_t x : v) put<int32_t>(x);
  }
};

struct Reader {
  std::span<const uint8_t> in;
  size_t pos = 0;
  size_t left() const { return in.size() - pos; }
  template <typename T>
  T get(const char* what) {
    if (left() < sizeof(T)) fail(ErrorKind::kCorrupt, "step plan: truncated at {} (offset {})", what, pos);
    T v;
    std::memcpy(&v, in.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::vector<int32_t> array(const char* what, size_t max_count) {
    uint32_t n = get<uint32_t>(what);
    if (n > left() / 4 || n > max_count)
      fail(ErrorKind::kCorrupt, "step plan: {} claims {} entries, {} bytes remain (limit {})", what, n, left(),
           max_count);
    std::vector<int32_t> v(n);
    if (n) std::memcpy(v.data(), in.data() + pos, static_cast<size_t>(n) * 4);
    pos += static_cast<size_t>(n) * 4;
    return v;
  }
};

void check(bool ok, const char* what) {
  if (!ok) fail(ErrorKind::kCorrupt, "step plan: {}", what);
}

}  // namespace

std::vector<uint8_t> encode_step_plan(const StepPlan& p) {
  Writer w;
  w.put<uint32_t>(kPlanMagic);
  w.put<uint8_t>(kPlanVersion);
  w.put<uint8_t>(static_cast<uint8_t>(p.kind));
  w.put<uint16_t>(0);
  switch (p.kind) {
    case PlanKind::kStep: {
      const ModelInput& in = p.input;
      w.put<uint64_t>(p.step);
      w.put<int32_t>(in.attention.block_size);
      w.put<int32_t>(in.attention.max_blocks_per_seq);
      w.array(in.token_ids);
      w.array(in.positions);
      w.array(in.attention.query_start_loc);
      w.array(in.attention.seq_lens);
      w.array(in.attention.block_tables);
      w.array(in.attention.slot_mapping);
      w.array(in.logits_indices);
      w.array(in.linear.query_start_loc);
      w.array(in.linear.state_slots);
      w.array(in.linear.has_initial_state);
      w.array(in.linear.token_state_slots);
      w.array(in.state_copies);
      w.put<uint32_t>(static_cast<uint32_t>(p.sampling.rows.size()));
      for (const SamplingRow& s : p.sampling.rows) {
        w.put<float>(s.temperature);
        w.put<int32_t>(s.top_k);
        w.put<float>(s.top_p);
        w.put<float>(s.min_p);
        w.put<uint64_t>(s.seed);
        w.put<uint64_t>(s.position);
      }
      w.array(p.sampling.host_rows);
      break;
    }
    case PlanKind::kInitCache:
      w.put<int32_t>(p.cache.num_blocks);
      w.put<int32_t>(p.cache.block_size);
      w.put<uint8_t>(static_cast<uint8_t>(p.cache.dtype));
      w.put<float>(p.cache.k_scale);
      w.put<float>(p.cache.v_scale);
      w.put<int32_t>(p.cache.max_model_len);
      w.put<int32_t>(p.cache.max_graph_batch);
      w.put<int32_t>(p.cache.num_state_slots);
      w.put<uint8_t>(static_cast<uint8_t>(p.cache.conv_dtype));
      w.put<uint8_t>(static_cast<uint8_t>(p.cache.ssm_dtype));
      break;
    case PlanKind::kShutdown:
      break;
  }
  return std::move(w.out);
}

StepPlan decode_step_plan(std::span<const uint8_t> bytes, const PlanLimits& lim) {
  Reader r{bytes};
  check(r.get<uint32_t>("magic") == kPlanMagic, "bad magic");
  check(r.get<uint8_t>("version") == kPlanVersion, "unknown version");
  uint8_t kind = r.get<uint8_t>("kind");
  check(r.get<uint16_t>("reserved") == 0, "reserved bits set");
  StepPlan p;
  switch (kind) {
    case static_cast<uint8_t>(PlanKind::kStep): {
      p.kind = PlanKind::kStep;
      ModelInput& in = p.input;
      AttentionLayout& a = in.attention;
      p.step = r.get<uint64_t>("step");
      a.block_size = r.get<int32_t>("block_size");
      a.max_blocks_per_seq = r.get<int32_t>("max_blocks_per_seq");
      check(a.block_size > 0 && a.block_size <= 4096, "block size out of range");
      check(a.max_blocks_per_seq >= 0, "negative blocks per sequence");
      const size_t cap = lim.max_tokens;
      in.token_ids = r.array("token_ids", cap);
      in.positions = r.array("positions", cap);
      a.query_start_loc = r.array("query_start_loc", cap + 1);
      a.seq_lens = r.array("seq_lens", cap);
      a.block_tables = r.array("block_tables", 1u << 28);
      a.slot_mapping = r.array("slot_mapping", cap);
      in.logits_indices = r.array("logits_indices", cap);
      LinearAttnLayout& l = in.linear;
      l.query_start_loc = r.array("linear query_start_loc", cap + 1);
      l.state_slots = r.array("state_slots", cap);
      l.has_initial_state = r.array("has_initial_state", cap);
      l.token_state_slots = r.array("token_state_slots", cap);
      in.state_copies = r.array("state_copies", 2 * cap);
      const uint32_t nrows = r.get<uint32_t>("sampling rows");
      constexpr size_t kRowBytes = 4 * 4 + 2 * 8;
      check(nrows == in.logits_indices.size() && nrows <= r.left() / kRowBytes, "sampling rows count");
      p.sampling.rows.resize(nrows);
      for (SamplingRow& s : p.sampling.rows) {
        s.temperature = r.get<float>("temperature");
        s.top_k = r.get<int32_t>("top_k");
        s.top_p = r.get<float>("top_p");
        s.min_p = r.get<float>("min_p");
        s.seed = r.get<uint64_t>("seed");
        s.position = r.get<uint64_t>("position");
        check(std::isfinite(s.temperature) && s.temperature >= 0 && std::isfinite(s.top_p) && s.top_p > 0 &&
                  std::isfinite(s.min_p) && s.min_p >= 0 && s.min_p <= 1,
              "sampling row values");
      }
      p.sampling.host_rows = r.array("host_rows", nrows);
      for (size_t i = 0; i < p.sampling.host_rows.size(); ++i)
        check(p.sampling.host_rows[i] >= 0 && static_cast<uint32_t>(p.sampling.host_rows[i]) < nrows &&
                  (i == 0 || p.sampling.host_rows[i] > p.sampling.host_rows[i - 1]),
              "host row numbers");
      check(r.left() == 0, "trailing bytes");
      const size_t T = in.token_ids.size(), S = a.seq_lens.size();
      check(T > 0, "no tokens");
      check(in.positions.size() == T && a.slot_mapping.size() == T, "token arrays differ in length");
      check(a.query_start_loc.size() == S + 1, "query_start_loc is not one longer than seq_lens");
      check(a.block_tables.size() == S * static_cast<size_t>(a.max_blocks_per_seq), "block table size");
      check(a.query_start_loc[0] == 0 && static_cast<size_t>(a.query_start_loc[S]) == T, "query_start_loc ends");
      for (size_t s = 0; s < S; ++s) {
        int32_t q = a.query_start_loc[s + 1] - a.query_start_loc[s];
        check(q >= 0, "query_start_loc decreases");
        check(a.seq_lens[s] >= q, "a sequence shorter than its new tokens");
        check(static_cast<int64_t>(a.seq_lens[s]) <= static_cast<int64_t>(a.max_blocks_per_seq) * a.block_size,
              "a sequence longer than its block table");
      }
      for (int32_t t : in.token_ids) check(t >= 0 && (lim.vocab_size == 0 || t < lim.vocab_size), "token id range");
      for (int32_t t : in.positions) check(t >= 0, "negative position");
      for (int32_t i : in.logits_indices) check(i >= 0 && static_cast<size_t>(i) < T, "logits index range");
      // The linear layout: absent, or one entry per sequence with the same query ranges.
      if (!l.state_slots.empty() || !l.query_start_loc.empty() || !l.has_initial_state.empty()) {
        check(l.state_slots.size() == S && l.has_initial_state.size() == S && l.query_start_loc == a.query_start_loc,
              "linear-attention layout does not match the sequences");
        for (int32_t h : l.has_initial_state) check(h == 0 || h == 1, "has_initial_state is not 0 or 1");
        std::vector<int32_t> used;
        for (int32_t slot : l.state_slots) {
          check(slot >= -1, "negative state slot");
          if (slot >= 0) used.push_back(slot);
        }
        std::sort(used.begin(), used.end());
        check(std::adjacent_find(used.begin(), used.end()) == used.end(), "two sequences share a state slot");
      }
      check(l.token_state_slots.empty() || (l.token_state_slots.size() == T && !l.state_slots.empty()),
            "token_state_slots is not one per token");
      for (int32_t slot : l.token_state_slots) check(slot >= -1, "negative token state slot");
      check(in.state_copies.size() % 2 == 0, "state copies are not pairs");
      for (int32_t c : in.state_copies) check(c >= 0, "negative state slot in a copy");
      if (lim.num_state_slots > 0) {
        for (int32_t slot : l.state_slots) check(slot < lim.num_state_slots, "state slot beyond the cache");
        for (int32_t slot : l.token_state_slots) check(slot < lim.num_state_slots, "token state slot beyond the cache");
        for (int32_t c : in.state_copies) check(c < lim.num_state_slots, "state slot beyond the cache");
      }
      if (lim.num_blocks > 0) {
        for (int32_t b : a.block_tables) check(b >= 0 && b < lim.num_blocks, "block id beyond the cache");
        const int64_t slots = static_cast<int64_t>(lim.num_blocks) * a.block_size;
        for (int32_t s : a.slot_mapping) check(s >= -1 && s < slots, "slot beyond the cache");
      }
      break;
    }
    case static_cast<uint8_t>(PlanKind::kInitCache): {
      p.kind = PlanKind::kInitCache;
      p.cache.num_blocks = r.get<int32_t>("num_blocks");
      p.cache.block_size = r.get<int32_t>("block_size");
      uint8_t dt = r.get<uint8_t>("dtype");
      p.cache.k_scale = r.get<float>("k_scale");
      p.cache.v_scale = r.get<float>("v_scale");
      p.cache.max_model_len = r.get<int32_t>("max_model_len");
      p.cache.max_graph_batch = r.get<int32_t>("max_graph_batch");
      p.cache.num_state_slots = r.get<int32_t>("num_state_slots");
      const uint8_t conv_dt = r.get<uint8_t>("conv state dtype"), ssm_dt = r.get<uint8_t>("ssm state dtype");
      check(r.left() == 0, "trailing bytes");
      check(p.cache.num_state_slots >= 0 && p.cache.num_state_slots <= (1 << 24), "state slot count");
      for (uint8_t d : {conv_dt, ssm_dt})
        check(d == static_cast<uint8_t>(DType::kF32) || d == static_cast<uint8_t>(DType::kBF16), "state dtype");
      p.cache.conv_dtype = static_cast<DType>(conv_dt);
      p.cache.ssm_dtype = static_cast<DType>(ssm_dt);
      check(p.cache.max_model_len >= 0 && p.cache.max_graph_batch >= 0 && p.cache.max_graph_batch <= 4096,
            "graph sizes");
      check(p.cache.num_blocks > 0 && p.cache.block_size > 0 && p.cache.block_size <= 4096, "cache size");
      check(dt <= static_cast<uint8_t>(DType::kF8E5M2), "cache dtype");
      p.cache.dtype = static_cast<DType>(dt);
      break;
    }
    case static_cast<uint8_t>(PlanKind::kShutdown):
      p.kind = static_cast<PlanKind>(kind);
      check(r.left() == 0, "trailing bytes");
      break;
    default:
      fail(ErrorKind::kCorrupt, "step plan: unknown kind {}", kind);
  }
  return p;
}

}  // namespace tessera
