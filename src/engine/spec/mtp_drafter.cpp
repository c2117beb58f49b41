#include "engine/spec/mtp_drafter.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace tessera {

namespace {

constexpr int kMtpMaxGraphBatch = 64;  // MTP drafting graphs up to this batch

}  // namespace

MtpDrafter::MtpDrafter(ModelRunner& runner) : runner_(runner), model_(runner.model_), backend_(runner.backend_) {}

void MtpDrafter::init(int max_graph_batch) {
  graphs_.clear();
  fused_graphs_.clear();
  fused_buf_ = Tensor();
  fused_consts_ = {};
  const int max_q = runner_.max_q_;
  hidden_ = Tensor();
  hidden_rows_ = 0;
  reserve_hidden(std::max(256, max_graph_batch) * max_q);
  max_b_ = 0;
  if (!runner_.graphs_enabled_ || max_q <= 1) return;
  const int64_t B = runner_.buckets_.back();
  max_b_ = std::min<int>(static_cast<int>(B), kMtpMaxGraphBatch);
  const int64_t Bm = runner_.bucket_for(max_b_);
  first_ = ModelRunner::GraphLayout{};
  first_.logits_per_seq = true;
  int64_t off = runner_.lay_out(first_, 0, Bm, max_q, true);
  order_first_ = off;
  off += 2 * Bm * max_q;
  order_chained_ = off;
  off += 2 * Bm;
  chained_.assign(static_cast<size_t>(max_q - 2), ModelRunner::GraphLayout{});
  for (ModelRunner::GraphLayout& c : chained_) off = runner_.lay_out(c, off, Bm, 1, false);
  off = runner_.lay_out_table(first_, off, Bm);
  const size_t table = ModelRunner::table_index();
  for (ModelRunner::GraphLayout& c : chained_) c.offset[table] = first_.offset[table];
  buf_ = backend_.alloc({off}, DType::kI32);
  h_buf_.assign(static_cast<size_t>(off), 0);
}

Tensor MtpDrafter::step_hidden(int64_t rows, int64_t tokens) {
  reserve_hidden(rows);
  last_tokens_ = tokens;
  return hidden_.rows(0, rows);
}

void MtpDrafter::reserve_hidden(int64_t rows) {
  if (rows <= hidden_rows_) return;
  hidden_rows_ = std::max<int64_t>(rows, 2 * hidden_rows_);
  hidden_ = backend_.alloc({hidden_rows_, model_.config().hidden_size}, backend_.compute_dtype());
  runner_.step_graphs_.clear();  // captured with the old buffer
  graphs_.clear();
  fused_graphs_.clear();
}

Tensor MtpDrafter::passes(StepInputs& first, const Tensor& hidden, std::vector<StepInputs>& chained, int64_t S,
                          const Tensor* drafts_out) {
  KvCache& kv = runner_.kv_;
  const int64_t T = first.token_ids.numel(), H = model_.config().hidden_size;
  const DType dt = backend_.compute_dtype();
  const int64_t passes = 1 + static_cast<int64_t>(chained.size());
  Tensor drafts = drafts_out ? *drafts_out : backend_.scratch({std::max<int64_t>(1, passes * S)}, DType::kI32);
  // Pass 1: every position the step computed, with the target's hidden states there.
  Tensor out = backend_.scratch({T, H}, dt);
  Tensor logits = model_.run_mtp(first, hidden, out, kv);
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
    Tensor lg = model_.run_mtp(cs, prev, next, kv);
    pick(lg, drafts.rows(static_cast<int64_t>(j + 1) * S, static_cast<int64_t>(j + 2) * S));
    prev = next;
  }
  return drafts.rows(0, passes * S).view({passes, S});
}

bool MtpDrafter::graphable(const MtpDraftInput& in, int& b, int& q) const {
  const ModelInput& p = in.prefill;
  const int S = static_cast<int>(p.attention.seq_lens.size()), T = static_cast<int>(p.token_ids.size());
  const int max_q = runner_.max_q_, max_blocks = runner_.max_blocks_;
  if (max_b_ == 0 || !runner_.graphs_enabled_ || S == 0 || (in.num_drafting != S && in.num_drafting != 0) ||
      S > max_b_ || T % S != 0 || T > last_tokens_ || static_cast<int>(in.chained.size()) > max_q - 2 ||
      p.attention.max_blocks_per_seq > max_blocks || p.attention.num_kv_groups != 1)
    return false;
  q = T / S;
  if (q > max_q) return false;
  for (int s = 0; s <= S; ++s)
    if (p.attention.query_start_loc[static_cast<size_t>(s)] != s * q) return false;
  for (int r = 0; r < T; ++r)  // pass 1's rows are the step's rows
    if (in.hidden_rows[static_cast<size_t>(r)] != r) return false;
  for (const ModelInput& c : in.chained)
    if (static_cast<int>(c.token_ids.size()) != S || c.attention.max_blocks_per_seq > max_blocks) return false;
  b = runner_.bucket_for(S);
  return b > 0 && b <= runner_.bucket_for(max_b_);
}

Tensor MtpDrafter::draft_graph(const MtpDraftInput& in, int b, int q) {
  check_step_input(in.prefill, model_.config().vocab_size, runner_.max_model_len_);
  for (const ModelInput& c : in.chained) {
    const std::string layout = step_input_layout_error(c);
    TESSERA_CHECK(layout.empty(), "MTP pass: {}", layout);
  }
  int64_t used = runner_.fill(first_, in.prefill, b, q, h_buf_);
  mtp_fc_order(static_cast<int64_t>(b) * q, h_buf_.data() + order_first_);
  mtp_fc_order(b, h_buf_.data() + order_chained_);
  for (size_t j = 0; j < in.chained.size(); ++j)
    used = std::max(used, runner_.fill(chained_[j], in.chained[j], b, 1, h_buf_));
  backend_.copy_from_host(buf_.rows(0, used), h_buf_.data());

  StepInputs first = runner_.views(first_, in.prefill, b, q, buf_, h_buf_);
  first.mtp_fc_order = buf_.rows(order_first_, order_first_ + 2 * static_cast<int64_t>(b) * q);
  std::vector<StepInputs> chained;
  for (size_t j = 0; j < in.chained.size(); ++j) {
    chained.push_back(runner_.views(chained_[j], in.chained[j], b, 1, buf_, h_buf_));
    chained.back().mtp_fc_order = buf_.rows(order_chained_, order_chained_ + 2 * static_cast<int64_t>(b));
  }
  const Tensor hidden = hidden_.rows(0, static_cast<int64_t>(b) * q);
  const ModelRunner::GraphKey key{b, q, static_cast<int>(in.chained.size()) + 1};
  return runner_.run_graph(graphs_, key, false, [&] { return passes(first, hidden, chained, b); });
}

Tensor MtpDrafter::draft(const MtpDraftInput& in) {
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
  if (graphable(in, b, q) && !graphs_.eager.count({b, q, static_cast<int>(in.chained.size()) + 1}))
    return draft_graph(in, b, q);
  const int vocab = model_.config().vocab_size, max_len = runner_.max_model_len_;
  Tensor rows = backend_.scratch({T}, DType::kI32);
  backend_.copy_from_host(rows, in.hidden_rows.data());
  Tensor hidden = backend_.scratch({T, H}, backend_.compute_dtype());
  backend_.gather_rows(hidden_.rows(0, last_tokens_), rows, hidden);
  StepInputs first = upload_step_inputs(backend_, in.prefill, vocab, max_len);
  std::vector<StepInputs> chained;
  for (const ModelInput& c : in.chained) chained.push_back(upload_step_inputs(backend_, c, vocab, max_len));
  return passes(first, hidden, chained, S);
}

bool MtpDrafter::step_fusable(const ModelInput& in) const {
  const AttentionLayout& a = in.attention;
  const int S = static_cast<int>(a.seq_lens.size()), T = static_cast<int>(in.token_ids.size());
  if (!runner_.cache_ready() || S == 0 || T % S != 0 || T / S > runner_.max_q_ || a.num_kv_groups != 1 ||
      a.query_start_loc.size() != static_cast<size_t>(S) + 1 || in.logits_indices.size() != static_cast<size_t>(T))
    return false;
  const int q = T / S;
  for (int s = 0; s <= S; ++s)
    if (a.query_start_loc[static_cast<size_t>(s)] != s * q) return false;
  for (int r = 0; r < T; ++r)
    if (in.logits_indices[static_cast<size_t>(r)] != r) return false;
  return true;
}

MtpDrafter::FusedLayout MtpDrafter::fused_layout(int64_t W, int64_t Q, int64_t P) {
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

Tensor MtpDrafter::fused_drafting(const StepInputs& step, const FusedLayout& L, int64_t W, int q, int passes,
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
    m.max_seq_len = runner_.max_model_len_;  // any length up to it; kernels read the real ones
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
  return this->passes(first, hidden_.rows(0, W * q), chained, passes > 0 ? W : 0, &drafts);
}

void MtpDrafter::prepare_fused(const FusedLayout& L, int64_t W, int q) {
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
  if (consts == fused_consts_) return;
  h_fused_.assign(static_cast<size_t>(L.chain - L.order1), 0);
  mtp_fc_order(W * q, h_fused_.data());
  mtp_fc_order(W, h_fused_.data() + (L.order2 - L.order1));
  std::iota(h_fused_.begin() + (L.qsl - L.order1), h_fused_.begin() + (L.qsl - L.order1) + W + 1, 0);
  std::iota(h_fused_.begin() + (L.lidx - L.order1), h_fused_.begin() + (L.lidx - L.order1) + W, 0);
  backend_.copy_from_host(fused_buf_.rows(L.order1, L.chain), h_fused_.data());
  fused_consts_ = consts;
}

void MtpDrafter::run_with_step(const ModelInput& in, int passes, const SampleFn& sample, MtpStepResult& result) {
  TESSERA_CHECK(step_fusable(in) && passes >= 0, "run_with_step: a step it does not take ({} passes)", passes);
  const int S = static_cast<int>(in.attention.seq_lens.size()), T = static_cast<int>(in.token_ids.size()), q = T / S;
  const ModelRunner::StepRun step = runner_.run_step(in);
  const int b = step.bucket;
  const ModelRunner::GraphKey key{b, q, passes};
  const int max_q = runner_.max_q_;
  const bool graph = b > 0 && runner_.graphs_enabled_ && max_b_ > 0 && b <= runner_.bucket_for(max_b_) &&
                     passes <= max_q - 1 && !fused_graphs_.eager.count(key);
  // Rows: the step's (its bucket when it ran as a graph). A graph's offsets are those of the
  // largest shape it may take; an eager run's its own.
  const int64_t W = b > 0 ? b : S;
  const FusedLayout L = graph ? fused_layout(runner_.bucket_for(max_b_), max_q, max_q - 1) : fused_layout(W, q, passes);
  prepare_fused(L, W, q);
  sample(step.logits, fused_buf_.rows(L.ids, L.ids + T));
  if (graph) {
    backend_.reset_scratch();  // the logits are sampled (stream order)
    runner_.run_graph(fused_graphs_, key, false, [&] { return fused_drafting(step.inputs, L, W, q, passes, false); });
  } else {
    fused_drafting(step.inputs, L, W, q, passes, true);
  }
  download_fused(L, W, S, T, q, passes, result);
}

void MtpDrafter::download_fused(const FusedLayout& L, int64_t W, int S, int T, int q, int passes,
                                MtpStepResult& result) {
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
