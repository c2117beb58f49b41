// Speculative decoding's configuration and counters (vLLM's --speculative-config): a proposer
// guesses the next k tokens of a decoding sequence, the target model runs them as one
// (k+1)-token chunk of that sequence, and the verification keeps the longest prefix of the
// guesses that the target's own sampled tokens agree with, plus the target's token after it
// (the engine's take_tokens; the component is engine/spec/spec_decoder.h, docs/engine.md).
//
// Drafts are point masses (the proposers pick one token per position, as vLLM v1's ngram and
// MTP proposers do). Verification samples the target's token at each position with the
// request's own sampling rule and keys (backend/sampling.h: seed, output position) and accepts
// a draft iff it equals that token. For a point-mass draft q = 1[d] this is the standard
// speculative rejection sampling: the draft is accepted with probability min(1, p(d)/q(d)) =
// p(d), and on rejection the token is distributed as p restricted to tokens other than d,
// renormalised, i.e. norm(max(0, p - q)). Since the draws are keyed by (seed, position), a
// seeded request's tokens are the very tokens it gets without speculation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

struct SpeculativeConfig {
  // "" (off), "ngram" or "mtp" (the aliases qwen3_next_mtp and qwen3_5_mtp are normalised to it).
  std::string method;
  int num_speculative_tokens = 0;
  // ngram: the n-gram sizes tried, longest first.
  int prompt_lookup_min = 0, prompt_lookup_max = 0;
  // vLLM's disable_by_batch_size: no drafts in a step after which this many sequences or more are
  // running (large batches are compute-bound: verifying drafts costs more than it saves); 0: never;
  // kDisableAuto (MTP; what the CLI sets when the field is absent): the engine measures a step with
  // drafts against one without at startup and drafts while that pays (LLMEngine, docs/engine.md).
  static constexpr int kDisableAuto = -1;
  int disable_by_batch_size = 0;
  bool enabled() const { return !method.empty() && num_speculative_tokens > 0; }
};

// Normalises aliases and fills vLLM's defaults (ngram without sizes: min = max = 5; one of
// them given: the other takes its value); fails (kInvalidArgument) on a method tessera does
// not run or on bad sizes, naming the field and what works.
SpeculativeConfig validate_speculative_config(SpeculativeConfig c);
// "ngram (k=3, prompt_lookup 2..5)" for the startup log.
std::string describe(const SpeculativeConfig& c);

// Counts for /metrics and the periodic log line (vLLM's spec_decode_* metrics).
struct SpecDecodeStats {
  uint64_t num_drafts = 0;                 // verification steps of a sequence with at least one draft
  uint64_t num_draft_tokens = 0;           // drafts verified
  uint64_t num_accepted_tokens = 0;        // drafts accepted
  std::vector<uint64_t> accepted_per_pos;  // [k]: drafts accepted at position i
  uint64_t steps_drafting_in_step = 0;     // MTP: steps that ran their drafting with them
  void add(int drafts, int accepted) {
    if (drafts <= 0) return;
    ++num_drafts;
    num_draft_tokens += static_cast<uint64_t>(drafts);
    num_accepted_tokens += static_cast<uint64_t>(accepted);
    if (accepted_per_pos.size() < static_cast<size_t>(drafts)) accepted_per_pos.resize(static_cast<size_t>(drafts));
    for (int i = 0; i < accepted; ++i) ++accepted_per_pos[static_cast<size_t>(i)];
  }
};

// vLLM's "SpecDecoding metrics: Mean acceptance length: ..., Accepted throughput: ..." line
// for the counts gained since `before`, over `seconds`.
std::string spec_decode_log_line(const SpecDecodeStats& now, const SpecDecodeStats& before, double seconds);

}  // namespace tessera
