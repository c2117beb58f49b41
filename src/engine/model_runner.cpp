#include "engine/model_runner.h"

#include <algorithm>
#include <numeric>

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
  hidden_ = Tensor();
  hidden_rows_ = 0;
  if (model_.has_mtp()) reserve_hidden(std::max(256, init.max_graph_batch));
  if (!graphs_enabled_) return;
  for (int b : {1, 2, 4})
    if (b <= init.max_graph_batch) buckets_.push_back(b);
  for (int b = 8; b < init.max_graph_batch + 8; b += 8) buckets_.push_back(std::min(b, init.max_graph_batch));
  buckets_.erase(std::unique(buckets_.begin(), buckets_.end()), buckets_.end());
  max_blocks_ = (max_model_len_ + init.block_size - 1) / init.block_size;
  layout_graph_inputs(buckets_.back());
  TLOG_INFO(
      "CUDA graphs: decode batches up to {} replay captured graphs ({} sizes, captured on first use); "
      "--enforce-eager turns them off",
      buckets_.back(), buckets_.size());
}

namespace {

// Entries of a graph input array at bucket `b` (block tables: per row).
int64_t graph_rows(const StepArray& f, int64_t b) { return f.extent == StepExtent::kSeqsPlusOne ? b + 1 : b; }

}  // namespace

void ModelRunner::layout_graph_inputs(int64_t B) {
  // 256-byte aligned segments for B = the largest bucket: first the arrays written once
  // (kIota), then the ones every step rewrites (per-row arrays, then block tables), so one
  // host-to-device copy of a prefix of the second part updates a step.
  auto seg = [](int64_t n) { return (n + 63) / 64 * 64; };
  graph_offset_.assign(kStepArrays.size(), -1);
  int64_t off = 0;
  for (GraphInput pass : {GraphInput::kIota, GraphInput::kPerRow, GraphInput::kBlockTable}) {
    if (pass == GraphInput::kPerRow) step_begin_ = off;
    for (size_t i = 0; i < kStepArrays.size(); ++i) {
      const StepArray& f = kStepArrays[i];
      if (f.graph != pass) continue;
      graph_offset_[i] = off;
      off += pass == GraphInput::kBlockTable ? B * max_blocks_ : seg(graph_rows(f, B));
    }
  }
  graph_buf_ = backend_.alloc({off}, DType::kI32);
  std::vector<int32_t> iota(static_cast<size_t>(B + 1));
  std::iota(iota.begin(), iota.end(), 0);
  for (size_t i = 0; i < kStepArrays.size(); ++i)
    if (kStepArrays[i].graph == GraphInput::kIota) {
      const int64_t at = graph_offset_[i];
      backend_.copy_from_host(graph_buf_.rows(at, at + graph_rows(kStepArrays[i], B)), iota.data());
    }
  h_step_.assign(static_cast<size_t>(off - step_begin_), 0);
}

int ModelRunner::bucket_for(int batch) const {
  auto it = std::lower_bound(buckets_.begin(), buckets_.end(), batch);
  return it == buckets_.end() ? 0 : *it;
}

StepInputs ModelRunner::fill_graph_inputs(const ModelInput& in, int b) {
  const AttentionLayout& a = in.attention;
  const int S = static_cast<int>(a.seq_lens.size());
  const int w = std::min(a.max_blocks_per_seq, max_blocks_);
  // The rewritten arrays into their host mirror: real rows, then padding rows.
  int64_t used = 0;
  for (size_t i = 0; i < kStepArrays.size(); ++i) {
    const StepArray& f = kStepArrays[i];
    if (f.graph != GraphInput::kPerRow && f.graph != GraphInput::kBlockTable) continue;
    const std::vector<int32_t>& src = host_array(f, in);
    int32_t* dst = h_step_.data() + (graph_offset_[i] - step_begin_);
    if (f.graph == GraphInput::kPerRow) {
      for (int s = 0; s < b; ++s) dst[s] = s < S && !src.empty() ? src[static_cast<size_t>(s)] : f.pad;
      used = std::max(used, graph_offset_[i] - step_begin_ + b);
      continue;
    }
    std::fill_n(dst, static_cast<size_t>(b) * max_blocks_, 0);
    for (int s = 0; s < S; ++s)
      std::copy_n(src.begin() + static_cast<ptrdiff_t>(s) * a.max_blocks_per_seq, w,
                  dst + static_cast<ptrdiff_t>(s) * max_blocks_);
    used = std::max(used, graph_offset_[i] - step_begin_ + static_cast<int64_t>(b) * max_blocks_);
  }
  backend_.copy_from_host(graph_buf_.rows(step_begin_, step_begin_ + used), h_step_.data());

  // The step's views of the buffer, and host copies of the per-row and once-written arrays
  // (the block tables' host copy stays empty: no backend reads it on a decode step).
  StepInputs si;
  for (size_t i = 0; i < kStepArrays.size(); ++i) {
    const StepArray& f = kStepArrays[i];
    if (!f.device || graph_offset_[i] < 0 || (f.optional && host_array(f, in).empty())) continue;
    const int64_t at = graph_offset_[i];
    if (f.graph == GraphInput::kBlockTable) {
      *f.device(si) = graph_buf_.rows(at, at + static_cast<int64_t>(b) * max_blocks_).view({b, max_blocks_});
      continue;
    }
    const int64_t n = graph_rows(f, b);
    *f.device(si) = graph_buf_.rows(at, at + n);
    if (!f.host_copy) continue;
    std::vector<int32_t>& host = *f.host_copy(si);
    if (f.graph == GraphInput::kIota) {
      host.resize(static_cast<size_t>(n));
      std::iota(host.begin(), host.end(), 0);
    } else {
      const int32_t* mirror = h_step_.data() + (at - step_begin_);
      host.assign(mirror, mirror + n);
    }
  }
  AttentionMetadata& m = si.attention;
  m.num_seqs = b;
  m.num_tokens = b;
  m.max_query_len = 1;
  m.max_seq_len = max_model_len_;  // any length up to it; kernels read the real ones
  m.block_size = a.block_size;
  m.max_blocks_per_seq = max_blocks_;
  if (!in.linear.state_slots.empty()) {
    si.linear.num_seqs = b;
    si.linear.num_tokens = b;
    si.linear.max_query_len = 1;
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
                      (in.linear.state_slots.empty() || in.linear.state_slots.size() == static_cast<size_t>(S)) &&
                      in.linear.token_state_slots.empty();
  int b = decode ? bucket_for(S) : 0;
  for (int s = 0; s < S && b > 0; ++s)
    if (in.logits_indices[s] != s) b = 0;
  const int64_t T = static_cast<int64_t>(in.token_ids.size());
  if (b == 0) {
    if (!model_.has_mtp()) return model_.forward(in, kv_);
    reserve_hidden(T);
    StepInputs si = upload_step_inputs(backend_, in, model_.config().vocab_size, max_model_len_);
    si.hidden_states = hidden_.rows(0, T);
    last_tokens_ = T;
    return model_.run(si, kv_);
  }
  check_step_input(in, model_.config().vocab_size, max_model_len_);

  StepInputs si = fill_graph_inputs(in, b);
  if (model_.has_mtp()) {  // (reserved at init for every bucket: the graphs write into it)
    si.hidden_states = hidden_.rows(0, b);
    last_tokens_ = S;
  }
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

void ModelRunner::reserve_hidden(int64_t rows) {
  if (rows <= hidden_rows_) return;
  hidden_rows_ = std::max<int64_t>(rows, 2 * hidden_rows_);
  hidden_ = backend_.alloc({hidden_rows_, model_.config().hidden_size}, backend_.compute_dtype());
  graphs_.clear();  // captured with the old buffer
}

Tensor ModelRunner::run_mtp(const MtpDraftInput& in) {
  TESSERA_CHECK(model_.has_mtp() && cache_ready(), "MTP drafts from a model without its MTP layer");
  const int64_t T = static_cast<int64_t>(in.prefill.token_ids.size()), S = in.num_drafting;
  const int64_t H = model_.config().hidden_size;
  TESSERA_CHECK(T > 0 && in.hidden_rows.size() == static_cast<size_t>(T), "MTP pass: {} tokens, {} hidden rows", T,
                in.hidden_rows.size());
  for (int32_t r : in.hidden_rows)
    TESSERA_CHECK(r >= 0 && r < last_tokens_, "MTP pass: hidden row {} of a step of {} tokens", r, last_tokens_);
  const int vocab = model_.config().vocab_size;
  const DType dt = backend_.compute_dtype();
  backend_.reset_scratch();  // the last step's results are on the host; its hidden states in hidden_
  const int64_t passes = 1 + static_cast<int64_t>(in.chained.size());
  Tensor drafts = backend_.scratch({std::max<int64_t>(1, passes * S)}, DType::kI32);
  // Pass 1: every position the step computed, with the target's hidden states there.
  Tensor rows = backend_.scratch({T}, DType::kI32);
  backend_.copy_from_host(rows, in.hidden_rows.data());
  Tensor hidden = backend_.scratch({T, H}, dt);
  backend_.gather_rows(hidden_.rows(0, last_tokens_), rows, hidden);
  StepInputs si = upload_step_inputs(backend_, in.prefill, vocab, max_model_len_);
  Tensor out = backend_.scratch({T, H}, dt);
  Tensor logits = model_.run_mtp(si, hidden, out, kv_);
  if (S == 0) return drafts.rows(0, 0);
  const std::vector<SamplingRow> greedy(static_cast<size_t>(S));
  backend_.sample(logits, greedy, drafts.rows(0, S));
  // Passes 2..k: each drafting sequence's last draft at the next position, with the MTP layer's
  // own output hidden state (vLLM feeds its normed output back the same way).
  Tensor prev = backend_.scratch({S, H}, dt);
  backend_.gather_rows(out, si.logits_indices, prev);
  for (size_t j = 0; j < in.chained.size(); ++j) {
    const ModelInput& c = in.chained[j];
    TESSERA_CHECK(static_cast<int64_t>(c.token_ids.size()) == S, "MTP pass {}: {} tokens for {} sequences", j + 2,
                  c.token_ids.size(), S);
    StepInputs cs = upload_step_inputs(backend_, c, vocab, max_model_len_);
    cs.token_ids = drafts.rows(static_cast<int64_t>(j) * S, static_cast<int64_t>(j + 1) * S);
    Tensor next = backend_.scratch({S, H}, dt);
    Tensor lg = model_.run_mtp(cs, prev, next, kv_);
    backend_.sample(lg, greedy, drafts.rows(static_cast<int64_t>(j + 1) * S, static_cast<int64_t>(j + 2) * S));
    prev = next;
  }
  return drafts.rows(0, passes * S);
}

}  // namespace tessera
