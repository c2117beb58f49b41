#include "engine/model_runner.h"

#include <algorithm>
#include <numeric>

#include "core/env.h"
#include "core/error.h"
#include "core/logging.h"
#include "dist/communicator.h"
#include "engine/executor.h"

namespace tessera {

ModelRunner::ModelRunner(Model& model, Backend& backend) : model_(model), backend_(backend) {}

ModelRunner::~ModelRunner() = default;

void ModelRunner::init_cache(const CacheInit& init) {
  kv_ = allocate_kv_cache(backend_, model_.cache_specs(), init);
  max_model_len_ = init.max_model_len;
  graphs_enabled_ =
      init.max_graph_batch > 0 && init.max_model_len > 0 && backend_.supports_graphs() && model_.graph_safe();
  graphs_.clear();
  buckets_.clear();
  // Tensor-parallel ranks capture their collectives (NCCL, custom all-reduce) into the
  // graphs too; TESSERA_TP_GRAPHS=0 keeps them eager (--enforce-eager turns graphs off
  // everywhere).
  bool sharded = false;
  for (dist::Communicator* c : watched_) sharded = sharded || c->size() > 1;
  if (graphs_enabled_ && sharded && !env_switch("TESSERA_TP_GRAPHS", true)) {
    TLOG_INFO("CUDA graphs: off for tensor-parallel ranks (TESSERA_TP_GRAPHS=0)");
    graphs_enabled_ = false;
  }
  if (!graphs_enabled_) return;
  for (int b : {1, 2, 4})
    if (b <= init.max_graph_batch) buckets_.push_back(b);
  for (int b = 8; b < init.max_graph_batch + 8; b += 8) buckets_.push_back(std::min(b, init.max_graph_batch));
  buckets_.erase(std::unique(buckets_.begin(), buckets_.end()), buckets_.end());
  max_blocks_ = (max_model_len_ + init.block_size - 1) / init.block_size;
  // One device buffer for every graph input (256-byte aligned segments of B = the largest
  // bucket). The rows 0..B of query_start_loc and logits_indices never change: written once.
  // Each step rewrites tokens, positions, seq_lens, slots and block tables with one copy.
  const int64_t B = buckets_.back();
  auto seg = [](int64_t n) { return (n + 63) / 64 * 64; };
  const int64_t step_ints = 6 * seg(B) + B * max_blocks_;
  Tensor buf = backend_.alloc({seg(B + 1) + seg(B) + step_ints}, DType::kI32);
  int64_t off = 0;
  auto take = [&](int64_t n, int64_t stride) {
    Tensor t = buf.rows(off, off + n);
    off += stride;
    return t;
  };
  g_qsl_ = take(B + 1, seg(B + 1));
  g_logits_idx_ = take(B, seg(B));
  g_step_ = buf.rows(off, off + step_ints);
  g_tokens_ = take(B, seg(B));
  g_positions_ = take(B, seg(B));
  g_seq_lens_ = take(B, seg(B));
  g_slots_ = take(B, seg(B));
  g_state_slots_ = take(B, seg(B));
  g_has_initial_ = take(B, seg(B));
  g_block_tables_ = take(B * max_blocks_, B * max_blocks_);
  std::vector<int32_t> iota(static_cast<size_t>(B + 1));
  std::iota(iota.begin(), iota.end(), 0);
  backend_.copy_from_host(g_qsl_, iota.data());
  backend_.copy_from_host(g_logits_idx_, iota.data());
  h_step_.assign(static_cast<size_t>(step_ints), 0);
  TLOG_INFO(
      "CUDA graphs: decode batches up to {} replay captured graphs ({} sizes, captured on first use); "
      "--enforce-eager turns them off",
      buckets_.back(), buckets_.size());
}

int ModelRunner::bucket_for(int batch) const {
  auto it = std::lower_bound(buckets_.begin(), buckets_.end(), batch);
  return it == buckets_.end() ? 0 : *it;
}

StepInputs ModelRunner::fill_graph_inputs(const ModelInput& in, int b) {
  const AttentionLayout& a = in.attention;
  const int S = static_cast<int>(a.seq_lens.size());
  // h_step_ mirrors g_step_: tokens, positions, seq_lens, slots, state slots, has-initial-state
  // flags (stride seg), block tables.
  const size_t stride = static_cast<size_t>(g_positions_.offset_bytes() - g_tokens_.offset_bytes()) / 4;
  int32_t* tok = h_step_.data();
  int32_t *pos = tok + stride, *lens = pos + stride, *slots = lens + stride, *state_slots = slots + stride,
          *has_init = state_slots + stride, *tables = has_init + stride;
  const bool linear = !in.linear.state_slots.empty();
  const int w = std::min(a.max_blocks_per_seq, max_blocks_);
  std::fill_n(tables, static_cast<size_t>(b) * max_blocks_, 0);
  for (int s = 0; s < b; ++s) {
    const bool real = s < S;  // padding rows: token 0 at position 0, one cached key, no KV write
    tok[s] = real ? in.token_ids[s] : 0;
    pos[s] = real ? in.positions[s] : 0;
    lens[s] = real ? a.seq_lens[s] : 1;
    slots[s] = real ? a.slot_mapping[s] : -1;
    state_slots[s] = real && linear ? in.linear.state_slots[s] : -1;
    has_init[s] = real && linear ? in.linear.has_initial_state[s] : 0;
    if (real)
      std::copy_n(a.block_tables.begin() + static_cast<ptrdiff_t>(s) * a.max_blocks_per_seq, w,
                  tables + static_cast<ptrdiff_t>(s) * max_blocks_);
  }
  const int64_t used = static_cast<int64_t>(tables - tok) + static_cast<int64_t>(b) * max_blocks_;
  backend_.copy_from_host(g_step_.rows(0, used), h_step_.data());

  StepInputs si;
  si.token_ids = g_tokens_.rows(0, b);
  si.positions = g_positions_.rows(0, b);
  si.logits_indices = g_logits_idx_.rows(0, b);
  AttentionMetadata& m = si.attention;
  m.num_seqs = b;
  m.num_tokens = b;
  m.max_query_len = 1;
  m.max_seq_len = max_model_len_;  // any length up to it; kernels read the real ones
  m.block_size = a.block_size;
  m.max_blocks_per_seq = max_blocks_;
  m.query_start_loc = g_qsl_.rows(0, b + 1);
  m.seq_lens = g_seq_lens_.rows(0, b);
  m.block_tables = g_block_tables_.rows(0, static_cast<int64_t>(b) * max_blocks_).view({b, max_blocks_});
  m.slot_mapping = g_slots_.rows(0, b);
  if (linear) {
    LinearAttnMetadata& l = si.linear;
    l.num_seqs = b;
    l.num_tokens = b;
    l.max_query_len = 1;
    l.query_start_loc = g_qsl_.rows(0, b + 1);
    l.state_slots = g_state_slots_.rows(0, b);
    l.has_initial_state = g_has_initial_.rows(0, b);
    // Host copies for this step's eager run (a replay reads the device buffers only).
    l.host_query_start_loc.resize(static_cast<size_t>(b) + 1);
    std::iota(l.host_query_start_loc.begin(), l.host_query_start_loc.end(), 0);
    l.host_state_slots.assign(state_slots, state_slots + b);
    l.host_has_initial_state.assign(has_init, has_init + b);
  }
  return si;
}

void ModelRunner::apply_state_copies(const std::vector<int32_t>& pairs) {
  TESSERA_CHECK(pairs.size() % 2 == 0, "state copies must be (src, dst) pairs");
  for (size_t i = 0; i < pairs.size(); i += 2) {
    const int32_t src = pairs[i], dst = pairs[i + 1];
    TESSERA_CHECK(src >= 0 && dst >= 0 && src < kv_.num_state_slots && dst < kv_.num_state_slots,
                  "state copy {} -> {} outside the {} slots", src, dst, kv_.num_state_slots);
    if (src == dst) continue;
    for (const std::vector<Tensor>* states : {&kv_.conv_state, &kv_.ssm_state})
      for (const Tensor& t : *states)
        if (t.defined()) backend_.copy(t.rows(dst, dst + 1), t.rows(src, src + 1));
  }
}

namespace {
// The first S rows of a bucket's logits; a rank that computes no logits (a TP rank other
// than the gather root, a PP stage before the last) has an empty tensor and keeps it.
Tensor logits_rows(const Tensor& logits, int S) { return logits.ndim() == 0 ? logits : logits.rows(0, S); }
}  // namespace

Tensor ModelRunner::run(const ModelInput& in) {
  TESSERA_CHECK(cache_ready(), "a step before the KV cache was allocated");
  backend_.reset_scratch();
  if (!in.state_copies.empty()) apply_state_copies(in.state_copies);
  const int S = static_cast<int>(in.attention.seq_lens.size());
  const bool decode = graphs_enabled_ && S > 0 && static_cast<int>(in.token_ids.size()) == S &&
                      in.logits_indices.size() == static_cast<size_t>(S) &&
                      in.attention.max_blocks_per_seq <= max_blocks_ &&
                      (in.linear.state_slots.empty() || in.linear.state_slots.size() == static_cast<size_t>(S));
  const int b = decode ? bucket_for(S) : 0;
  if (b == 0) return model_.forward(in, kv_);
  for (int s = 0; s < S; ++s)
    if (in.logits_indices[s] != s) return model_.forward(in, kv_);
  check_step_input(in, model_.config().vocab_size, max_model_len_);

  StepInputs si = fill_graph_inputs(in, b);
  auto it = graphs_.find(b);
  if (it != graphs_.end()) {
    backend_.replay(*it->second.graph);
    for (dist::Communicator* c : watched_) c->watch_stream("decode graph replay");
    // Later scratch (sampling) must not overlap what the graph wrote.
    backend_.scratch({static_cast<int64_t>(it->second.scratch_bytes)}, DType::kU8);
    return logits_rows(it->second.logits, S);
  }
  // First time at this size: the eager run is this step's result; then capture.
  Tensor logits = model_.run(si, kv_);
  const size_t eager_bytes = backend_.scratch_in_use();
  try {
    backend_.reset_scratch();  // (may merge a grown arena; `logits` keeps its memory)
    Graph g;
    backend_.begin_capture();
    try {
      g.logits = model_.run(si, kv_);
    } catch (...) {
      try {
        backend_.end_capture();
      } catch (...) {
      }
      throw;
    }
    g.graph = backend_.end_capture();
    g.scratch_bytes = std::max(backend_.scratch_in_use(), eager_bytes);
    graphs_.emplace(b, std::move(g));
    TLOG_DEBUG("captured the decode graph for batch size {}", b);
  } catch (const Error& e) {
    TLOG_WARN("CUDA graph capture for batch size {} failed ({}); running eagerly from now on", b, e.what());
    graphs_enabled_ = false;
  }
  // Keep later scratch clear of the eager logits (same arena offsets as the capture).
  backend_.scratch({static_cast<int64_t>(eager_bytes)}, DType::kU8);
  return logits_rows(logits, S);
}

}  // namespace tessera
