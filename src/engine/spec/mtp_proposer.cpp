#include "engine/spec/mtp_proposer.h"

#include <algorithm>

#include "core/error.h"
#include "engine/executor.h"

namespace tessera {

void MtpProposer::take_step_drafts(std::vector<const Request*> sequences, std::vector<int32_t> drafts, int passes) {
  TESSERA_CHECK(passes >= 0 && drafts.size() == sequences.size() * static_cast<size_t>(passes),
                "MTP: {} drafts for {} sequences x {} passes", drafts.size(), sequences.size(), passes);
  step_sequences_ = std::move(sequences);
  drafts_ = std::move(drafts);
  step_passes_ = passes;
  spans_.clear();
}

void MtpProposer::propose(const std::vector<Request*>& requests, const std::vector<int>& max_tokens) {
  for (Request* r : requests) r->spec_tokens.clear();
  if (step_passes_ >= 0) {  // drafted with the step
    const size_t S = step_sequences_.size();
    for (size_t i = 0; i < requests.size(); ++i) {
      const auto it = std::find(step_sequences_.begin(), step_sequences_.end(), requests[i]);
      TESSERA_CHECK(it != step_sequences_.end(), "MTP drafts for {}, which the last step did not compute",
                    requests[i]->id);
      const size_t s = static_cast<size_t>(it - step_sequences_.begin());
      for (int j = 0; j < std::min(max_tokens[i], step_passes_); ++j)
        requests[i]->spec_tokens.push_back(drafts_[static_cast<size_t>(j) * S + s]);
    }
    step_passes_ = -1;
    step_sequences_.clear();
    return;
  }
  if (spans_.empty()) return;
  const int bs = block_size_;
  // After a sequence's tokens: its query end, length and block table.
  auto add_seq = [](ModelInput& in, const Request& r, int seq_len) {
    in.attention.query_start_loc.push_back(static_cast<int32_t>(in.token_ids.size()));
    in.attention.seq_lens.push_back(seq_len);
    r.append_block_table(in.attention.block_tables, in.attention.max_blocks_per_seq);
  };
  // The drafting sequences: those asked for drafts, in the order of their spans, each at the
  // last position of its span.
  std::vector<std::pair<size_t, size_t>> drafting;  // (span, request) indices
  int passes = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (max_tokens[i] <= 0) continue;
    const auto it =
        std::find_if(spans_.begin(), spans_.end(), [&](const ComputedSpan& s) { return s.request == requests[i]; });
    TESSERA_CHECK(it != spans_.end() && it->end == requests[i]->num_tokens() - 1,
                  "MTP drafts for {}, which the last step did not bring up to its last token", requests[i]->id);
    drafting.emplace_back(static_cast<size_t>(it - spans_.begin()), i);
    passes = std::max(passes, max_tokens[i]);
  }
  std::sort(drafting.begin(), drafting.end());
  // A step whose sequences all had q rows (decode, or verification of q - 1 drafts each), all
  // drafting now or none (disable_by_batch_size): the pass keeps that shape, q rows a sequence at
  // the step's rows (no KV written past a sequence's kept positions), so the executor may replay
  // it as a graph.
  const int q = spans_[0].rows;
  bool uniform = drafting.empty() || drafting.size() == spans_.size();
  for (size_t i = 0; i < spans_.size() && uniform; ++i)
    uniform = spans_[i].rows == q && spans_[i].row0 == static_cast<int>(i) * q;

  MtpDraftInput in;
  ModelInput& pre = in.prefill;
  pre.attention.block_size = bs;
  pre.attention.query_start_loc.push_back(0);
  for (const ComputedSpan& s : spans_)
    pre.attention.max_blocks_per_seq =
        std::max(pre.attention.max_blocks_per_seq, static_cast<int>(s.request->block_ids().size()));
  std::vector<int> last_row(spans_.size());
  for (size_t i = 0; i < spans_.size(); ++i) {
    const ComputedSpan& s = spans_[i];
    const Request& r = *s.request;
    const int to = uniform ? s.begin + q : s.end;
    for (int p = s.begin; p < to; ++p) {
      const bool kept = p < s.end;
      pre.token_ids.push_back(kept ? r.token_at(p + 1) : 0);
      pre.positions.push_back(p);
      pre.attention.slot_mapping.push_back(kept ? r.kv_slot(p, bs) : -1);
      in.hidden_rows.push_back(s.row0 + p - s.begin);
      if (p == s.end - 1) last_row[i] = static_cast<int>(pre.token_ids.size()) - 1;
    }
    add_seq(pre, r, to);
  }
  for (const auto& d : drafting) pre.logits_indices.push_back(last_row[d.first]);
  in.num_drafting = static_cast<int>(drafting.size());
  if (pre.logits_indices.empty()) pre.logits_indices.push_back(0);  // (unused)
  // Pass j + 1 (j >= 1) reads draft j at position num_tokens - 2 + j and writes its KV there.
  int width = 0;
  for (const auto& d : drafting) width = std::max(width, static_cast<int>(requests[d.second]->block_ids().size()));
  for (int j = 1; j < passes; ++j) {
    ModelInput c;
    c.attention.block_size = bs;
    c.attention.max_blocks_per_seq = width;
    c.attention.query_start_loc.push_back(0);
    for (size_t k = 0; k < drafting.size(); ++k) {
      const Request& r = *requests[drafting[k].second];
      const int m = max_tokens[drafting[k].second];
      const bool wanted = j < m;
      const int pos = r.num_tokens() - 2 + (wanted ? j : m - 1);
      c.token_ids.push_back(0);  // the previous pass's draft, on the device
      c.positions.push_back(pos);
      c.attention.slot_mapping.push_back(wanted ? r.kv_slot(pos, bs) : -1);
      c.logits_indices.push_back(static_cast<int32_t>(k));
      add_seq(c, r, pos + 1);
    }
    in.chained.push_back(std::move(c));
  }
  executor_.propose_mtp(in, drafts_);
  const size_t S = drafting.size();
  TESSERA_CHECK(drafts_.size() == S * static_cast<size_t>(std::max(passes, 1)) || S == 0, "MTP: {} drafts for {} x {}",
                drafts_.size(), S, passes);
  for (size_t k = 0; k < S; ++k) {
    Request& r = *requests[drafting[k].second];
    for (int j = 0; j < max_tokens[drafting[k].second]; ++j)
      r.spec_tokens.push_back(drafts_[static_cast<size_t>(j) * S + k]);
  }
  spans_.clear();
}

}  // namespace tessera
