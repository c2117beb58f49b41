#include "engine/spec_decode.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/executor.h"

namespace tessera {

SpeculativeConfig validate_speculative_config(SpeculativeConfig c) {
  if (c.method.empty() && c.num_speculative_tokens == 0) return c;
  if (c.method == "qwen3_next_mtp" || c.method == "qwen3_5_mtp") c.method = "mtp";
  if (c.method != "ngram" && c.method != "mtp")
    fail(ErrorKind::kInvalidArgument,
         "--speculative-config: method '{}' is not supported; tessera runs 'ngram' (prompt lookup) and 'mtp' (the "
         "checkpoint's multi-token-prediction layer; aliases qwen3_next_mtp, qwen3_5_mtp)",
         c.method);
  if (c.num_speculative_tokens < 1 || c.num_speculative_tokens > 16)
    fail(ErrorKind::kInvalidArgument, "--speculative-config: num_speculative_tokens must be in 1..16, got {}",
         c.num_speculative_tokens);
  if (c.disable_by_batch_size < SpeculativeConfig::kDisableAuto)
    fail(ErrorKind::kInvalidArgument,
         "--speculative-config: disable_by_batch_size must be >= 0 (0: never) or -1 (measured at startup, MTP), got {}",
         c.disable_by_batch_size);
  if (c.method == "ngram") {
    // Prompt lookup costs nothing to keep up, and its drafts on a calibration's random prompts
    // would say nothing: auto means never for ngram.
    if (c.disable_by_batch_size == SpeculativeConfig::kDisableAuto) c.disable_by_batch_size = 0;
    if (c.prompt_lookup_min <= 0 && c.prompt_lookup_max <= 0)
      c.prompt_lookup_min = c.prompt_lookup_max = 5;
    else if (c.prompt_lookup_min <= 0)
      c.prompt_lookup_min = c.prompt_lookup_max;
    else if (c.prompt_lookup_max <= 0)
      c.prompt_lookup_max = c.prompt_lookup_min;
    if (c.prompt_lookup_min < 1 || c.prompt_lookup_max < c.prompt_lookup_min)
      fail(ErrorKind::kInvalidArgument,
           "--speculative-config: need 1 <= prompt_lookup_min <= prompt_lookup_max, got {} and {}", c.prompt_lookup_min,
           c.prompt_lookup_max);
  } else if (c.prompt_lookup_min > 0 || c.prompt_lookup_max > 0) {
    fail(ErrorKind::kInvalidArgument, "--speculative-config: prompt_lookup_min/max belong to method 'ngram'");
  }
  return c;
}

std::string describe(const SpeculativeConfig& c) {
  if (!c.enabled()) return "off";
  const std::string off =
      c.disable_by_batch_size > 0 ? fmt::format(", disable_by_batch_size={}", c.disable_by_batch_size)
      : c.disable_by_batch_size == SpeculativeConfig::kDisableAuto ? ", drafting while it pays (measured at startup)"
                                                                   : "";
  if (c.method == "ngram")
    return fmt::format("ngram (num_speculative_tokens={}, prompt_lookup_min={}, prompt_lookup_max={}{})",
                       c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max, off);
  return fmt::format("{} (num_speculative_tokens={}{})", c.method, c.num_speculative_tokens, off);
}

std::vector<int32_t> NgramProposer::propose_tokens(const std::vector<int32_t>& t, int k) const {
  const int len = static_cast<int>(t.size());
  if (k <= 0) return {};
  for (int n = std::min(max_n_, len - 1); n >= min_n_; --n) {
    const int32_t* suffix = t.data() + len - n;
    // Earliest start i < len - n with t[i, i+n) == the suffix and at least one token after it.
    for (int i = 0; i + n < len; ++i) {
      if (!std::equal(suffix, suffix + n, t.data() + i)) continue;
      const int from = i + n, to = std::min(len, from + k);
      return std::vector<int32_t>(t.begin() + from, t.begin() + to);
    }
  }
  return {};
}

void NgramProposer::propose(const std::vector<Request*>& requests, const std::vector<int>& max_tokens) {
  std::vector<int32_t> tokens;
  for (size_t i = 0; i < requests.size(); ++i) {
    Request& r = *requests[i];
    tokens.assign(r.prompt.begin(), r.prompt.end());
    tokens.insert(tokens.end(), r.output.begin(), r.output.end());
    r.spec_tokens = propose_tokens(tokens, max_tokens[i]);
  }
}

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

std::string spec_decode_log_line(const SpecDecodeStats& now, const SpecDecodeStats& before, double seconds) {
  const double drafts = static_cast<double>(now.num_drafts - before.num_drafts);
  const double drafted = static_cast<double>(now.num_draft_tokens - before.num_draft_tokens);
  const double accepted = static_cast<double>(now.num_accepted_tokens - before.num_accepted_tokens);
  std::string per_pos;
  for (size_t i = 0; i < now.accepted_per_pos.size(); ++i) {
    const uint64_t was = i < before.accepted_per_pos.size() ? before.accepted_per_pos[i] : 0;
    per_pos += fmt::format("{}{:.3f}", i ? ", " : "", drafts > 0 ? (now.accepted_per_pos[i] - was) / drafts : 0.0);
  }
  const double secs = seconds > 0 ? seconds : 1;
  return fmt::format(
      "SpecDecoding metrics: Mean acceptance length: {:.2f}, Accepted throughput: {:.2f} tokens/s, Drafted "
      "throughput: {:.2f} tokens/s, Accepted: {} tokens, Drafted: {} tokens, Per-position acceptance rate: {}, Avg "
      "Draft acceptance rate: {:.1f}%",
      drafts > 0 ? 1 + accepted / drafts : 0.0, accepted / secs, drafted / secs, static_cast<uint64_t>(accepted),
      static_cast<uint64_t>(drafted), per_pos, drafted > 0 ? 100 * accepted / drafted : 0.0);
}

}  // namespace tessera
