#include "engine/model_runner.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "core/logging.h"
#include "distributed/communicator.h"
#include "engine/cache_groups.h"
#include "engine/executor.h"
#include "engine/spec/mtp_drafter.h"

namespace tessera {

ModelRunner::ModelRunner(Model& model, Backend& backend) : model_(model), backend_(backend) {
  if (model_.has_mtp()) mtp_ = std::make_unique<MtpDrafter>(*this);
}

ModelRunner::~ModelRunner() = default;

size_t ModelRunner::table_index() {
  for (size_t i = 0; i < kStepArrays.size(); ++i)
    if (kStepArrays[i].graph == GraphInput::kBlockTable) return i;
  return 0;
}

MtpDrafter& ModelRunner::mtp() {
  TESSERA_CHECK(mtp_ && cache_ready(), "MTP drafts from a model without its MTP layer");
  return *mtp_;
}

void ModelRunner::init_cache(const CacheInit& init) {
  kv_ = allocate_kv_cache(backend_, model_.cache_specs(), init);
  kv_groups_ = num_paged_groups(init.layer_groups);
  TESSERA_CHECK(!mtp_ || kv_groups_ == 1, "an MTP layer with {} KV cache groups (its drafting reads one)", kv_groups_);
  max_model_len_ = init.max_model_len;
  graphs_enabled_ =
      init.max_graph_batch > 0 && init.max_model_len > 0 && backend_.supports_graphs() && model_.graph_safe();
  step_graphs_.clear();
  buckets_.clear();
  max_q_ = std::max(1, init.graph_query_len);
  if (graphs_enabled_) init_step_graphs(init);
  if (mtp_) mtp_->init(init.max_graph_batch);
  if (!graphs_enabled_) return;
  const int mtp_batch = mtp_ ? mtp_->max_graph_batch() : 0;
  TLOG_INFO(
      "CUDA graphs: decode batches up to {} replay captured graphs ({} sizes, captured on first use{}); "
      "--enforce-eager turns them off",
      buckets_.back(), buckets_.size(),
      max_q_ > 1 ? fmt::format(", and verification steps of up to {} tokens a sequence{}", max_q_,
                               mtp_batch > 0 ? fmt::format(", MTP drafting up to batch {}", mtp_batch) : "")
                 : "");
}

void ModelRunner::init_step_graphs(const CacheInit& init) {
  for (int b : {1, 2, 4})
    if (b <= init.max_graph_batch) buckets_.push_back(b);
  for (int b = 8; b < init.max_graph_batch + 8; b += 8) buckets_.push_back(std::min(b, init.max_graph_batch));
  buckets_.erase(std::unique(buckets_.begin(), buckets_.end()), buckets_.end());
  max_blocks_ = (max_model_len_ + init.block_size - 1) / init.block_size;
  // Step graphs: every array, block tables last (one host-to-device copy of a prefix a step).
  const int64_t B = buckets_.back();
  step_layout_ = GraphLayout{};
  const int64_t end = lay_out_table(step_layout_, lay_out(step_layout_, 0, B, max_q_, true), B);
  graph_buf_ = backend_.alloc({end}, DType::kI32);
  h_step_.assign(static_cast<size_t>(end), 0);
}

namespace {

// Entries of a graph input array at bucket `b` of `q` tokens a sequence and G KV cache groups
// (not block tables).
int64_t graph_rows(const StepArray& f, int64_t b, int64_t q, bool logits_per_seq, int64_t G) {
  switch (f.extent) {
    case StepExtent::kSeqsPlusOne:
      return b + 1;
    case StepExtent::kTokens:
      return b * q;
    case StepExtent::kGroupTokens:
      return G * b * q;
    case StepExtent::kAnyCount:
      return logits_per_seq ? b : b * q;
    default:
      return b;
  }
}

}  // namespace

int64_t ModelRunner::lay_out(GraphLayout& g, int64_t off, int64_t B, int64_t Q, bool with_tokens) const {
  // 256-byte aligned segments.
  auto seg = [](int64_t n) { return (n + 63) / 64 * 64; };
  g.offset.assign(kStepArrays.size(), -1);
  for (size_t i = 0; i < kStepArrays.size(); ++i) {
    const StepArray& f = kStepArrays[i];
    if (f.graph == GraphInput::kNone || f.graph == GraphInput::kBlockTable || (!with_tokens && i == 0)) continue;
    g.offset[i] = off;
    off += seg(graph_rows(f, B, Q, g.logits_per_seq, kv_groups_));
  }
  return off;
}

int64_t ModelRunner::lay_out_table(GraphLayout& g, int64_t off, int64_t B) const {
  g.offset[table_index()] = off;
  return off + kv_groups_ * B * max_blocks_;
}

int ModelRunner::bucket_for(int batch) const {
  auto it = std::lower_bound(buckets_.begin(), buckets_.end(), batch);
  return it == buckets_.end() ? 0 : *it;
}

int ModelRunner::graph_query_len(const ModelInput& in) const {
  const AttentionLayout& a = in.attention;
  const int S = static_cast<int>(a.seq_lens.size()), T = static_cast<int>(in.token_ids.size());
  if (!graphs_enabled_ || S == 0 || T % S != 0 || T / S > max_q_ || a.max_blocks_per_seq > max_blocks_ ||
      a.num_kv_groups != kv_groups_)
    return 0;
  const int q = T / S;
  const LinearAttnLayout& l = in.linear;
  if (!(l.state_slots.empty() || l.state_slots.size() == static_cast<size_t>(S)) ||
      !(l.token_state_slots.empty() || (q > 1 && l.token_state_slots.size() == static_cast<size_t>(T))))
    return 0;
  // Every sequence q tokens, every token's logits in order.
  for (int s = 0; s <= S; ++s)
    if (a.query_start_loc[static_cast<size_t>(s)] != s * q) return 0;
  if (in.logits_indices.size() != static_cast<size_t>(q == 1 ? S : T)) return 0;
  for (size_t r = 0; r < in.logits_indices.size(); ++r)
    if (in.logits_indices[r] != static_cast<int32_t>(r)) return 0;
  return q;
}

int64_t ModelRunner::fill(const GraphLayout& g, const ModelInput& in, int b, int q,
                          std::vector<int32_t>& mirror) const {
  const AttentionLayout& a = in.attention;
  const int S = static_cast<int>(a.seq_lens.size());
  const int w = std::min(a.max_blocks_per_seq, max_blocks_);
  const int64_t G = kv_groups_, T = static_cast<int64_t>(in.token_ids.size());
  int64_t used = 0;
  for (size_t i = 0; i < kStepArrays.size(); ++i) {
    const StepArray& f = kStepArrays[i];
    if (g.offset[i] < 0) continue;
    const std::vector<int32_t>& src = host_array(f, in);
    int32_t* dst = mirror.data() + g.offset[i];
    const bool table = f.graph == GraphInput::kBlockTable;
    const int64_t n = table ? G * b * max_blocks_ : graph_rows(f, b, q, g.logits_per_seq, G);
    used = std::max(used, g.offset[i] + n);
    if (table) {  // group k's S rows at row k * b
      std::fill_n(dst, static_cast<size_t>(n), 0);
      for (int64_t k = 0; k < G; ++k)
        for (int s = 0; s < S; ++s)
          std::copy_n(src.begin() + (k * S + s) * a.max_blocks_per_seq, w, dst + (k * b + s) * max_blocks_);
    } else if (f.extent == StepExtent::kGroupTokens) {  // per group: its T real rows, then padding rows
      const int64_t rows = n / G;
      for (int64_t k = 0; k < G; ++k) {
        std::copy_n(src.begin() + k * T, std::min(rows, T), dst + k * rows);
        std::fill(dst + k * rows + std::min(rows, T), dst + (k + 1) * rows, f.pad);
      }
    } else if (f.graph == GraphInput::kShape && !(g.logits_per_seq && f.extent == StepExtent::kAnyCount)) {
      const int32_t step = f.extent == StepExtent::kSeqsPlusOne ? q : 1;  // query starts s * q; logits rows
      for (int64_t r = 0; r < n; ++r) dst[r] = static_cast<int32_t>(r) * step;
    } else {  // real rows, then padding rows (the first MTP pass's logits rows too: data, pad 0)
      const int64_t real = std::min<int64_t>(n, static_cast<int64_t>(src.size()));
      std::copy_n(src.begin(), real, dst);
      std::fill(dst + real, dst + n, f.pad == kPadQueryLen ? q : f.pad);
    }
  }
  return used;
}

StepInputs ModelRunner::views(const GraphLayout& g, const ModelInput& in, int b, int q, const Tensor& buf,
                              const std::vector<int32_t>& mirror) const {
  // (The block tables' host copy stays empty: no backend reads it on a graphed step.)
  StepInputs si;
  for (size_t i = 0; i < kStepArrays.size(); ++i) {
    const StepArray& f = kStepArrays[i];
    if (!f.device || g.offset[i] < 0 || (f.optional && host_array(f, in).empty())) continue;
    const int64_t at = g.offset[i];
    if (f.graph == GraphInput::kBlockTable) {
      *f.device(si) =
          buf.rows(at, at + int64_t{kv_groups_} * b * max_blocks_).view({int64_t{kv_groups_} * b, max_blocks_});
      continue;
    }
    const int64_t n = graph_rows(f, b, q, g.logits_per_seq, kv_groups_);
    *f.device(si) = buf.rows(at, at + n);
    if (f.host_copy) f.host_copy(si)->assign(mirror.data() + at, mirror.data() + at + n);
  }
  AttentionMetadata& m = si.attention;
  m.num_seqs = b;
  m.num_tokens = b * q;
  m.max_query_len = q;
  m.max_seq_len = max_model_len_;  // any length up to it; kernels read the real ones
  m.block_size = in.attention.block_size;
  m.max_blocks_per_seq = max_blocks_;
  m.num_kv_groups = kv_groups_;
  if (!in.linear.state_slots.empty()) {
    si.linear.num_seqs = b;
    si.linear.num_tokens = b * q;
    si.linear.max_query_len = q;
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
// The first n rows of a bucket's logits; a rank that computes no logits (a TP rank other
// than the gather root, a PP stage before the last) has an empty tensor and keeps it.
Tensor logits_rows(const Tensor& logits, int n) { return logits.ndim() == 0 ? logits : logits.rows(0, n); }
}  // namespace

Tensor ModelRunner::run_graph(GraphFamily& family, const GraphKey& key, bool decode,
                              const std::function<Tensor()>& body) {
  auto it = family.graphs.find(key);
  if (it != family.graphs.end()) {
    backend_.replay(*it->second.graph);
    for (dist::Communicator* c : watched_) c->watch_stream("decode graph replay");
    // Later scratch (sampling) must not overlap what the graph wrote.
    backend_.scratch({static_cast<int64_t>(it->second.scratch_bytes)}, DType::kU8);
    return it->second.out;
  }
  // First time at this shape: the eager run is this step's result; then capture.
  Tensor out = body();
  const size_t eager_bytes = backend_.scratch_in_use();
  try {
    backend_.reset_scratch();  // (may merge a grown arena; `out` keeps its memory)
    Graph g;
    backend_.begin_capture();
    try {
      g.out = body();
    } catch (...) {
      try {
        backend_.end_capture();
      } catch (...) {
      }
      throw;
    }
    g.graph = backend_.end_capture();
    g.scratch_bytes = std::max(backend_.scratch_in_use(), eager_bytes);
    family.graphs.emplace(key, std::move(g));
  } catch (const Error& e) {
    if (decode) {
      TLOG_WARN("CUDA graph capture of a decode step failed ({}); running eagerly from now on", e.what());
      graphs_enabled_ = false;
    } else {
      TLOG_WARN("CUDA graph capture of a speculative-decoding shape failed ({}); that shape runs eagerly from now on",
                e.what());
      family.eager.insert(key);
    }
  }
  // Keep later scratch clear of the eager result (same arena offsets as the capture).
  backend_.scratch({static_cast<int64_t>(eager_bytes)}, DType::kU8);
  return out;
}

Tensor ModelRunner::run(const ModelInput& in, const std::vector<int32_t>& argmax_rows) {
  return run_step(in, argmax_rows).logits;
}

ModelRunner::StepRun ModelRunner::run_step(const ModelInput& in, const std::vector<int32_t>& argmax_rows) {
  TESSERA_CHECK(cache_ready(), "a step before the KV cache was allocated");
  backend_.reset_scratch();
  if (!in.state_copies.empty()) apply_state_copies(in.state_copies);
  const int S = static_cast<int>(in.attention.seq_lens.size());
  const int q = graph_query_len(in);
  const int b = q > 0 ? bucket_for(S) : 0;
  const int64_t T = static_cast<int64_t>(in.token_ids.size());
  // Argmax rows matter only where the logits come from vocabulary shards.
  const bool picks = model_.shards_logits() && !argmax_rows.empty();
  const bool all_picks = picks && argmax_rows.size() == in.logits_indices.size();
  const GraphKey shape{b, q, all_picks ? 1 : 0};
  StepRun step;
  if (b == 0 || step_graphs_.eager.count(shape)) {
    if (!mtp_) {
      step.logits = picks ? model_.forward_argmax_rows(in, kv_, argmax_rows) : model_.forward(in, kv_);
      return step;
    }
    step.inputs = upload_step_inputs(backend_, in, model_.config().vocab_size, max_model_len_);
    step.inputs.hidden_states = mtp_->step_hidden(T, T);
    if (picks) step.inputs.argmax_rows = argmax_rows;
    step.logits = model_.run(step.inputs, kv_);
    return step;
  }
  check_step_input(in, model_.config().vocab_size, max_model_len_);
  const int64_t used = fill(step_layout_, in, b, q, h_step_);
  backend_.copy_from_host(graph_buf_.rows(0, used), h_step_.data());
  StepInputs si = views(step_layout_, in, b, q, graph_buf_, h_step_);
  // (The MTP drafter reserved the hidden states of every graphed shape at init: the graphs write into it.)
  if (mtp_) si.hidden_states = mtp_->step_hidden(static_cast<int64_t>(b) * q, T);
  si.argmax_all = all_picks;  // (a step that mixes argmax rows and whole ones gathers every row whole)
  const Tensor logits = run_graph(step_graphs_, shape, q == 1, [&] { return model_.run(si, kv_); });
  // The step ran on the bucket's padded rows (si), captured or not: what follows it (MTP
  // drafting) takes that layout, also after a failed capture.
  step.bucket = b;
  step.inputs = std::move(si);
  step.logits = logits_rows(logits, static_cast<int>(T));
  return step;
}

}  // namespace tessera
