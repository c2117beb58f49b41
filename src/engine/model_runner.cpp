#include "engine/model_runner.h"

#include <algorithm>
#include <array>
#include <numeric>

#include <fmt/format.h>

#include "core/error.h"
#include "core/logging.h"
#include "dist/communicator.h"
#include "engine/executor.h"

namespace tessera {

ModelRunner::ModelRunner(Model& model, Backend& backend) : model_(model), backend_(backend) {}

ModelRunner::~ModelRunner() = default;

namespace {

constexpr int kMtpMaxGraphBatch = 64;  // MTP drafting graphs up to this batch

size_t table_index() {
  for (size_t i = 0; i < kStepArrays.size(); ++i)
    if (kStepArrays[i].graph == GraphInput::kBlockTable) return i;
  return 0;
}

}  // namespace

void ModelRunner::init_cache(const CacheInit& init) {
  kv_ = allocate_kv_cache(backend_, model_.cache_specs(), init);
  max_model_len_ = init.max_model_len;
  graphs_enabled_ =
      init.max_graph_batch > 0 && init.max_model_len > 0 && backend_.supports_graphs() && model_.graph_safe();
  graphs_.clear();
  eager_shapes_.clear();
  mtp_graphs_.clear();
  mtp_eager_.clear();
  fused_graphs_.clear();
  fused_eager_.clear();
  fused_buf_ = Tensor();
  fused_consts_ = {};
  buckets_.clear();
  max_q_ = std::max(1, init.graph_query_len);
  hidden_ = Tensor();
  hidden_rows_ = 0;
  if (model_.has_mtp()) reserve_hidden(std::max(256, init.max_graph_batch) * max_q_);
  if (!graphs_enabled_) return;
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
  // MTP drafting graphs, where speculation verifies drafts (graph_query_len > 1).
  mtp_max_b_ = 0;
  if (model_.has_mtp() && max_q_ > 1) {
    mtp_max_b_ = std::min<int>(static_cast<int>(B), kMtpMaxGraphBatch);
    const int64_t Bm = bucket_for(mtp_max_b_);
    mtp_first_ = GraphLayout{};
    mtp_first_.logits_per_seq = true;
    int64_t off = lay_out(mtp_first_, 0, Bm, max_q_, true);
    mtp_order_first_ = off;
    off += 2 * Bm * max_q_;
    mtp_order_chained_ = off;
    off += 2 * Bm;
    mtp_chained_.assign(static_cast<size_t>(max_q_ - 2), GraphLayout{});
    for (GraphLayout& c : mtp_chained_) off = lay_out(c, off, Bm, 1, false);
    off = lay_out_table(mtp_first_, off, Bm);
    for (GraphLayout& c : mtp_chained_) c.offset[table_index()] = mtp_first_.offset[table_index()];
    mtp_buf_ = backend_.alloc({off}, DType::kI32);
    h_mtp_.assign(static_cast<size_t>(off), 0);
  }
  TLOG_INFO(
      "CUDA graphs: decode batches up to {} replay captured graphs ({} sizes, captured on first use{}); "
      "--enforce-eager turns them off",
      buckets_.back(), buckets_.size(),
      max_q_ > 1 ? fmt::format(", and verification steps of up to {} tokens a sequence{}", max_q_,
                               mtp_max_b_ > 0 ? fmt::format(", MTP drafting up to batch {}", mtp_max_b_) : "")
                 : "");
}

namespace {

// Entries of a graph input array at bucket `b` of `q` tokens a sequence (not block tables).
int64_t graph_rows(const StepArray& f, int64_t b, int64_t q, bool logits_per_seq) {
  switch (f.extent) {
    case StepExtent::kSeqsPlusOne:
      return b + 1;
    case StepExtent::kTokens:
      return b * q;
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
    off += seg(graph_rows(f, B, Q, g.logits_per_seq));
  }
  return off;
}

int64_t ModelRunner::lay_out_table(GraphLayout& g, int64_t off, int64_t B) const {
  g.offset[table_index()] = off;
  return off + B * max_blocks_;
}

int ModelRunner::bucket_for(int batch) const {
  auto it = std::lower_bound(buckets_.begin(), buckets_.end(), batch);
  return it == buckets_.end() ? 0 : *it;
}

int ModelRunner::graph_query_len(const ModelInput& in) const {
  const AttentionLayout& a = in.attention;
  const int S = static_cast<int>(a.seq_lens.size()), T = static_cast<int>(in.token_ids.size());
  if (!graphs_enabled_ || S == 0 || T % S != 0 || T / S > max_q_ || a.max_blocks_per_seq > max_blocks_) return 0;
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
  int64_t used = 0;
  for (size_t i = 0; i < kStepArrays.size(); ++i) {
    const StepArray& f = kStepArrays[i];
    if (g.offset[i] < 0) continue;
    const std::vector<int32_t>& src = host_array(f, in);
    int32_t* dst = mirror.data() + g.offset[i];
    const bool table = f.graph == GraphInput::kBlockTable;
    const int64_t n = table ? static_cast<int64_t>(b) * max_blocks_ : graph_rows(f, b, q, g.logits_per_seq);
    used = std::max(used, g.offset[i] + n);
    if (table) {
      std::fill_n(dst, static_cast<size_t>(n), 0);
      for (int s = 0; s < S; ++s)
        std::copy_n(src.begin() + static_cast<ptrdiff_t>(s) * a.max_blocks_per_seq, w,
                    dst + static_cast<ptrdiff_t>(s) * max_blocks_);
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
      *f.device(si) = buf.rows(at, at + static_cast<int64_t>(b) * max_blocks_).view({b, max_blocks_});
      continue;
    }
    const int64_t n = graph_rows(f, b, q, g.logits_per_seq);
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

template <typename Key, typename Body>
Tensor ModelRunner::run_graph(std::map<Key, Graph>& graphs, std::set<Key>& eager, const Key& key, bool decode,
                              Body body) {
  auto it = graphs.find(key);
  if (it != graphs.end()) {
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
    graphs.emplace(key, std::move(g));
  } catch (const Error& e) {
    if (decode) {
      TLOG_WARN("CUDA graph capture of a decode step failed ({}); running eagerly from now on", e.what());
      graphs_enabled_ = false;
    } else {
      TLOG_WARN("CUDA graph capture of a speculative-decoding shape failed ({}); that shape runs eagerly from now on",
                e.what());
      eager.insert(key);
    }
  }
  // Keep later scratch clear of the eager result (same arena offsets as the capture).
  backend_.scratch({static_cast<int64_t>(eager_bytes)}, DType::kU8);
  return out;
}

Tensor ModelRunner::run(const ModelInput& in) {
  TESSERA_CHECK(cache_ready(), "a step before the KV cache was allocated");
  backend_.reset_scratch();
  if (!in.state_copies.empty()) apply_state_copies(in.state_copies);
  const int S = static_cast<int>(in.attention.seq_lens.size());
  const int q = graph_query_len(in);
  const int b = q > 0 ? bucket_for(S) : 0;
  const int64_t T = static_cast<int64_t>(in.token_ids.size());
  const std::pair<int, int> shape{b, q};
  last_bucket_ = 0;
  last_inputs_ = StepInputs();
  if (b == 0 || eager_shapes_.count(shape)) {
    if (!model_.has_mtp()) return model_.forward(in, kv_);
    reserve_hidden(T);
    StepInputs si = upload_step_inputs(backend_, in, model_.config().vocab_size, max_model_len_);
    si.hidden_states = hidden_.rows(0, T);
    last_tokens_ = T;
    Tensor logits = model_.run(si, kv_);
    last_inputs_ = std::move(si);
    return logits;
  }
  check_step_input(in, model_.config().vocab_size, max_model_len_);
  const int64_t used = fill(step_layout_, in, b, q, h_step_);
  backend_.copy_from_host(graph_buf_.rows(0, used), h_step_.data());
  StepInputs si = views(step_layout_, in, b, q, graph_buf_, h_step_);
  if (model_.has_mtp()) {  // (reserved at init for every shape: the graphs write into it)
    si.hidden_states = hidden_.rows(0, static_cast<int64_t>(b) * q);
    last_tokens_ = T;
  }
  const Tensor logits = run_graph(graphs_, eager_shapes_, shape, q == 1, [&] { return model_.run(si, kv_); });
  // The step ran on the bucket's padded rows (si), captured or not: what follows it (MTP
  // drafting) takes that layout, also after a failed capture.
  last_bucket_ = b;
  last_inputs_ = std::move(si);
  return logits_rows(logits, static_cast<int>(T));
}

void ModelRunner::reserve_hidden(int64_t rows) {
  if (rows <= hidden_rows_) return;
  hidden_rows_ = std::max<int64_t>(rows, 2 * hidden_rows_);
  hidden_ = backend_.alloc({hidden_rows_, model_.config().hidden_size}, backend_.compute_dtype());
  graphs_.clear();  // captured with the old buffer
  mtp_graphs_.clear();
  fused_graphs_.clear();
}

Tensor ModelRunner::mtp_passes(StepInputs& first, const Tensor& hidden, std::vector<StepInputs>& chained, int64_t S,
                               const Tensor* drafts_out) {
  const int64_t T = first.token_ids.numel(), H = model_.config().hidden_size;
  const DType dt = backend_.compute_dtype();
  const int64_t passes = 1 + static_cast<int64_t>(chained.size());
  Tensor drafts = drafts_out ? *drafts_out : backend_.scratch({std::max<int64_t>(1, passes * S)}, DType::kI32);
  // Pass 1: every position the step computed, with the target's hidden states there.
  Tensor out = backend_.scratch({T, H}, dt);
  Tensor logits = model_.run_mtp(first, hidden, out, kv_);
  if (S == 0) return drafts.rows(0, 0);
  // The greedy picks, made where the logits are (TP rank 0) and shared with the other TP ranks,
  // whose next pass embeds them too.
  auto pick = [&](const Tensor& lg, const Tensor& ids) {
    if (lg.defined()) backend_.argmax(lg, ids);
    model_.share_sampled(ids);
  };
  pick(logits, drafts.rows(0, S));
  // Passes 2..k: each drafting sequence's last draft at the next position, with the MTP layer's
  // own output hidden state (vLLM feeds its normed output back the same way).
  Tensor prev = backend_.scratch({S, H}, dt);
  backend_.gather_rows(out, first.logits_indices, prev);
  for (size_t j = 0; j < chained.size(); ++j) {
    StepInputs& cs = chained[j];
    cs.token_ids = drafts.rows(static_cast<int64_t>(j) * S, static_cast<int64_t>(j + 1) * S);
    Tensor next = backend_.scratch({S, H}, dt);
    Tensor lg = model_.run_mtp(cs, prev, next, kv_);
    pick(lg, drafts.rows(static_cast<int64_t>(j + 1) * S, static_cast<int64_t>(j + 2) * S));
    prev = next;
  }
  return drafts.rows(0, passes * S).view({passes, S});
}

bool ModelRunner::mtp_graphable(const MtpDraftInput& in, int& b, int& q) const {
  const ModelInput& p = in.prefill;
  const int S = static_cast<int>(p.attention.seq_lens.size()), T = static_cast<int>(p.token_ids.size());
  if (mtp_max_b_ == 0 || !graphs_enabled_ || S == 0 || (in.num_drafting != S && in.num_drafting != 0) ||
      S > mtp_max_b_ || T % S != 0 || T > last_tokens_ || static_cast<int>(in.chained.size()) > max_q_ - 2 ||
      p.attention.max_blocks_per_seq > max_blocks_)
    return false;
  q = T / S;
  if (q > max_q_) return false;
  for (int s = 0; s <= S; ++s)
    if (p.attention.query_start_loc[static_cast<size_t>(s)] != s * q) return false;
  for (int r = 0; r < T; ++r)  // pass 1's rows are the step's rows
    if (in.hidden_rows[static_cast<size_t>(r)] != r) return false;
  for (const ModelInput& c : in.chained)
    if (static_cast<int>(c.token_ids.size()) != S || c.attention.max_blocks_per_seq > max_blocks_) return false;
  b = bucket_for(S);
  return b > 0 && b <= bucket_for(mtp_max_b_);
}

Tensor ModelRunner::run_mtp_graph(const MtpDraftInput& in, int b, int q) {
  const int vocab = model_.config().vocab_size;
  check_step_input(in.prefill, vocab, max_model_len_);
  for (const ModelInput& c : in.chained) {
    const std::string layout = step_input_layout_error(c);
    TESSERA_CHECK(layout.empty(), "MTP pass: {}", layout);
  }
  int64_t used = fill(mtp_first_, in.prefill, b, q, h_mtp_);
  mtp_fc_order(static_cast<int64_t>(b) * q, h_mtp_.data() + mtp_order_first_);
  mtp_fc_order(b, h_mtp_.data() + mtp_order_chained_);
  for (size_t j = 0; j < in.chained.size(); ++j)
    used = std::max(used, fill(mtp_chained_[j], in.chained[j], b, 1, h_mtp_));
  backend_.copy_from_host(mtp_buf_.rows(0, used), h_mtp_.data());

  StepInputs first = views(mtp_first_, in.prefill, b, q, mtp_buf_, h_mtp_);
  first.mtp_fc_order = mtp_buf_.rows(mtp_order_first_, mtp_order_first_ + 2 * static_cast<int64_t>(b) * q);
  std::vector<StepInputs> chained;
  for (size_t j = 0; j < in.chained.size(); ++j) {
    chained.push_back(views(mtp_chained_[j], in.chained[j], b, 1, mtp_buf_, h_mtp_));
    chained.back().mtp_fc_order = mtp_buf_.rows(mtp_order_chained_, mtp_order_chained_ + 2 * static_cast<int64_t>(b));
  }
  const Tensor hidden = hidden_.rows(0, static_cast<int64_t>(b) * q);
  const std::tuple<int, int, int> key{b, q, static_cast<int>(in.chained.size()) + 1};
  return run_graph(mtp_graphs_, mtp_eager_, key, false, [&] { return mtp_passes(first, hidden, chained, b); });
}

Tensor ModelRunner::run_mtp(const MtpDraftInput& in) {
  TESSERA_CHECK(model_.has_mtp() && cache_ready(), "MTP drafts from a model without its MTP layer");
  const int64_t T = static_cast<int64_t>(in.prefill.token_ids.size()), S = in.num_drafting;
  const int64_t H = model_.config().hidden_size;
  TESSERA_CHECK(T > 0 && in.hidden_rows.size() == static_cast<size_t>(T), "MTP pass: {} tokens, {} hidden rows", T,
                in.hidden_rows.size());
  for (int32_t r : in.hidden_rows)
    TESSERA_CHECK(r >= 0 && r < last_tokens_, "MTP pass: hidden row {} of a step of {} tokens", r, last_tokens_);
  for (const ModelInput& c : in.chained)
    TESSERA_CHECK(static_cast<int64_t>(c.token_ids.size()) == S, "MTP pass: {} tokens for {} sequences",
                  c.token_ids.size(), S);
  backend_.reset_scratch();  // the last step's results are on the host; its hidden states in hidden_
  int b = 0, q = 0;
  if (mtp_graphable(in, b, q) && !mtp_eager_.count({b, q, static_cast<int>(in.chained.size()) + 1}))
    return run_mtp_graph(in, b, q);
  const int vocab = model_.config().vocab_size;
  Tensor rows = backend_.scratch({T}, DType::kI32);
  backend_.copy_from_host(rows, in.hidden_rows.data());
  Tensor hidden = backend_.scratch({T, H}, backend_.compute_dtype());
  backend_.gather_rows(hidden_.rows(0, last_tokens_), rows, hidden);
  StepInputs first = upload_step_inputs(backend_, in.prefill, vocab, max_model_len_);
  std::vector<StepInputs> chained;
  for (const ModelInput& c : in.chained) chained.push_back(upload_step_inputs(backend_, c, vocab, max_model_len_));
  return mtp_passes(first, hidden, chained, S);
}

bool ModelRunner::mtp_step_fusable(const ModelInput& in) const {
  const AttentionLayout& a = in.attention;
  const int S = static_cast<int>(a.seq_lens.size()), T = static_cast<int>(in.token_ids.size());
  if (!model_.has_mtp() || !cache_ready() || S == 0 || T % S != 0 || T / S > max_q_ ||
      a.query_start_loc.size() != static_cast<size_t>(S) + 1 || in.logits_indices.size() != static_cast<size_t>(T))
    return false;
  const int q = T / S;
  for (int s = 0; s <= S; ++s)
    if (a.query_start_loc[static_cast<size_t>(s)] != s * q) return false;
  for (int r = 0; r < T; ++r)
    if (in.logits_indices[static_cast<size_t>(r)] != r) return false;
  return true;
}

ModelRunner::FusedLayout ModelRunner::fused_layout(int64_t W, int64_t Q, int64_t P) {
  // The download (tokens, rows, drafts) first and contiguous; then what the passes read.
  FusedLayout L;
  L.ids = 0;
  L.rows = W * Q;
  L.drafts = L.rows + W;
  L.order1 = L.drafts + std::max<int64_t>(P, 1) * W;
  L.order2 = L.order1 + 2 * W * Q;
  L.qsl = L.order2 + 2 * W;
  L.lidx = L.qsl + W + 1;
  L.chain = L.lidx + W;
  L.end = L.chain + 3 * std::max<int64_t>(P - 1, 0) * W;
  return L;
}

Tensor ModelRunner::fused_drafting(const StepInputs& step, const FusedLayout& L, int64_t W, int q, int passes,
                                   bool host_copies) {
  auto region = [&](int64_t at, int64_t n) { return fused_buf_.rows(at, at + n); };
  const Tensor ids = region(L.ids, W * q), rows = region(L.rows, W);
  backend_.accept_drafts(ids, step.token_ids, q, rows);
  // Pass 1: the step's rows, each with the token sampled there; logits at each accepted row.
  StepInputs first = step;
  first.token_ids = ids;
  first.logits_indices = rows;
  first.mtp_fc_order = region(L.order1, 2 * W * q);
  first.hidden_states = Tensor();
  std::vector<StepInputs> chained;
  for (int j = 1; j < passes; ++j) {
    StepInputs c;
    const int64_t at = L.chain + 3 * static_cast<int64_t>(j - 1) * W;
    c.positions = region(at, W);
    AttentionMetadata& m = c.attention;
    m.slot_mapping = region(at + W, W);
    m.seq_lens = region(at + 2 * W, W);
    backend_.draft_positions(rows, step.positions, step.attention.slot_mapping, step.attention.block_tables, q,
                             step.attention.block_size, j, c.positions, m.slot_mapping, m.seq_lens);
    m.query_start_loc = region(L.qsl, W + 1);
    m.block_tables = step.attention.block_tables;
    c.logits_indices = region(L.lidx, W);
    c.mtp_fc_order = region(L.order2, 2 * W);
    m.num_seqs = static_cast<int>(W);
    m.num_tokens = static_cast<int>(W);
    m.max_query_len = 1;
    m.max_seq_len = max_model_len_;  // any length up to it; kernels read the real ones
    m.block_size = step.attention.block_size;
    m.max_blocks_per_seq = step.attention.max_blocks_per_seq;
    m.host_query_start_loc.resize(static_cast<size_t>(W) + 1);
    std::iota(m.host_query_start_loc.begin(), m.host_query_start_loc.end(), 0);
    m.host_block_tables = step.attention.host_block_tables;
    m.host_seq_lens.assign(static_cast<size_t>(W), 1);
    m.host_slot_mapping.assign(static_cast<size_t>(W), -1);
    if (host_copies) {  // (eager: what the device computed, for the backends that read the host copies)
      backend_.copy_to_host(m.host_seq_lens.data(), m.seq_lens);
      backend_.copy_to_host(m.host_slot_mapping.data(), m.slot_mapping);
      backend_.synchronize();
    }
    chained.push_back(std::move(c));
  }
  const Tensor drafts = region(L.drafts, std::max(passes, 1) * W);
  return mtp_passes(first, hidden_.rows(0, W * q), chained, passes > 0 ? W : 0, &drafts);
}

void ModelRunner::run_with_mtp(const ModelInput& in, int passes, const SampleFn& sample, MtpStepResult& result) {
  TESSERA_CHECK(mtp_step_fusable(in) && passes >= 0, "run_with_mtp: a step it does not take ({} passes)", passes);
  const int S = static_cast<int>(in.attention.seq_lens.size()), T = static_cast<int>(in.token_ids.size()), q = T / S;
  const Tensor logits = run(in);
  const int b = last_bucket_;
  const std::tuple<int, int, int> key{b, q, passes};
  const bool graph = b > 0 && graphs_enabled_ && mtp_max_b_ > 0 && b <= bucket_for(mtp_max_b_) &&
                     passes <= max_q_ - 1 && !fused_eager_.count(key);
  // Rows: the step's (its bucket when it ran as a graph). A graph's offsets are those of the
  // largest shape it may take; an eager run's its own.
  const int64_t W = b > 0 ? b : S;
  const FusedLayout L = graph ? fused_layout(bucket_for(mtp_max_b_), max_q_, max_q_ - 1) : fused_layout(W, q, passes);
  if (!fused_buf_.defined() || fused_buf_.numel() < L.end) {
    const int64_t n = std::max<int64_t>(L.end, fused_buf_.defined() ? 2 * fused_buf_.numel() : 0);
    fused_buf_ = backend_.alloc({n}, DType::kI32);
    const std::vector<int32_t> zeros(static_cast<size_t>(n), 0);  // padding rows' tokens: a valid id
    backend_.copy_from_host(fused_buf_, zeros.data());
    fused_graphs_.clear();  // captured with the old buffer
    fused_consts_ = {};
  }
  // The arrays of the passes that follow from the shape alone (uploaded when the shape changes).
  const std::array<int64_t, 5> consts{W, q, L.order1, L.order2, L.qsl};
  if (consts != fused_consts_) {
    h_fused_.assign(static_cast<size_t>(L.chain - L.order1), 0);
    mtp_fc_order(W * q, h_fused_.data());
    mtp_fc_order(W, h_fused_.data() + (L.order2 - L.order1));
    std::iota(h_fused_.begin() + (L.qsl - L.order1), h_fused_.begin() + (L.qsl - L.order1) + W + 1, 0);
    std::iota(h_fused_.begin() + (L.lidx - L.order1), h_fused_.begin() + (L.lidx - L.order1) + W, 0);
    backend_.copy_from_host(fused_buf_.rows(L.order1, L.chain), h_fused_.data());
    fused_consts_ = consts;
  }
  sample(logits, fused_buf_.rows(L.ids, L.ids + T));
  if (graph) {
    const StepInputs step = last_inputs_;  // views of the step graph's input buffer
    backend_.reset_scratch();              // the logits are sampled (stream order)
    run_graph(fused_graphs_, fused_eager_, key, false, [&] { return fused_drafting(step, L, W, q, passes, false); });
  } else {
    fused_drafting(last_inputs_, L, W, q, passes, true);
  }
  const int64_t used = L.drafts + static_cast<int64_t>(passes) * W;
  std::vector<int32_t>& host = h_fused_;  // (its constants are on the device by now)
  host.resize(static_cast<size_t>(used));
  backend_.copy_to_host(host.data(), fused_buf_.rows(0, used));
  backend_.synchronize();
  result.passes = passes;
  result.tokens.assign(host.begin(), host.begin() + T);
  result.accepted.resize(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) result.accepted[static_cast<size_t>(s)] = host[static_cast<size_t>(L.rows + s)] - s * q;
  result.drafts.resize(static_cast<size_t>(passes) * S);
  for (int j = 0; j < passes; ++j)
    for (int s = 0; s < S; ++s)
      result.drafts[static_cast<size_t>(j) * S + s] = host[static_cast<size_t>(L.drafts + j * W + s)];
}

}  // namespace tessera
