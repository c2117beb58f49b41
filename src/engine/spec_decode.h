// Speculative decoding (vLLM's --speculative-config): a proposer guesses the next k tokens of
// a decoding sequence, the target model runs them as one (k+1)-token chunk of that sequence,
// and the verification keeps the longest prefix of the guesses that the target's own sampled
// tokens agree with, plus the target's token after it (engine.cpp, docs/engine.md).
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
#include <memory>
#include <string>
#include <vector>

#include "engine/request.h"

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

class Executor;

// What a step computed for one sequence that goes on: positions [begin, end) are now in its
// cache (rejected drafts excluded), and position p's row in the step's tokens is row0 + p - begin;
// the step had `rows` rows of it (end - begin plus the rejected drafts).
struct ComputedSpan {
  Request* request;
  int begin, end;
  int row0;
  int rows;
};

// Proposes draft tokens for decoding sequences; an engine component (the target model's step
// runs them). Implementations write r->spec_tokens.
class Proposer {
 public:
  virtual ~Proposer() = default;
  // After every step, before propose(): the sequences it computed that go on.
  virtual void observe_step(const std::vector<ComputedSpan>& spans) { (void)spans; }
  // Whether drafts need KV slots at the positions from the last token on before they are
  // verified (MTP writes its own KV there while drafting): the engine then gives each request
  // the blocks for max_tokens - 1 positions past its computed tokens, or lowers max_tokens to
  // what its blocks hold.
  virtual bool needs_lookahead_slots() const { return false; }
  // Whether a sequence can be drafted for only if the proposer saw every step it ran (MTP: its
  // layer's KV is written by the pass after each step). Such a sequence that runs a step while
  // drafting is off stops drafting for good (Request::spec_off) and the proposer skips it.
  virtual bool needs_every_step() const { return false; }
  // For each request: at most max_tokens[i] drafts that may follow its tokens so far. Called
  // after every step (requests may be empty).
  virtual void propose(const std::vector<Request*>& requests, const std::vector<int>& max_tokens) = 0;
  // Whether the executor may run the drafting with the target's step (MTP): after such a step
  // the engine calls take_step_drafts instead of observe_step, and propose() hands them out.
  virtual bool drafts_in_step() const { return false; }
  // The drafts the step computed: sequences[s] (the step's, in order; pointers only compared)
  // got drafts[j * S + s] for j < passes.
  virtual void take_step_drafts(std::vector<const Request*> sequences, std::vector<int32_t> drafts, int passes) {
    (void)sequences, (void)drafts, (void)passes;
  }
};

// Multi-token prediction (vLLM's mtp method for Qwen3-Next / Qwen3.5): the checkpoint's MTP layer
// (Model::run_mtp) drafts from the target's hidden states. After each step, one pass runs the
// layer over every position the step computed (token after each position, the target's final
// hidden state there), which writes the layer's KV for those positions (its cache holds every
// position the target has, prompt included) and gives each decoding sequence its first draft
// (greedy) at its last position; passes 2..k chain one token each on the previous draft and the
// layer's own normed output hidden state, writing KV at the draft positions (overwritten by a
// later pass once those positions are computed). The executor runs the passes on the device;
// only the drafts come back.
class MtpProposer : public Proposer {
 public:
  MtpProposer(Executor& executor, int block_size) : executor_(executor), block_size_(block_size) {}
  void observe_step(const std::vector<ComputedSpan>& spans) override { spans_ = spans; }
  bool needs_lookahead_slots() const override { return true; }
  bool needs_every_step() const override { return true; }
  void propose(const std::vector<Request*>& requests, const std::vector<int>& max_tokens) override;
  bool drafts_in_step() const override { return true; }
  void take_step_drafts(std::vector<const Request*> sequences, std::vector<int32_t> drafts, int passes) override;

 private:
  Executor& executor_;
  int block_size_;
  std::vector<ComputedSpan> spans_;
  std::vector<int32_t> drafts_;
  // take_step_drafts's, until the next propose().
  std::vector<const Request*> step_sequences_;
  int step_passes_ = -1;  // -1: none
};

// Prompt lookup (vLLM's ngram): the last n tokens of the sequence (n from prompt_lookup_max
// down to prompt_lookup_min) are looked up among its earlier tokens, prompt and output; at the
// earliest earlier occurrence of the longest n that has one, the tokens that followed it are
// proposed (up to k; fewer at the end of the sequence). No match: no drafts.
class NgramProposer : public Proposer {
 public:
  NgramProposer(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {}
  void propose(const std::vector<Request*>& requests, const std::vector<int>& max_tokens) override;
  // The drafts for one token sequence (the algorithm above; exposed for tests).
  std::vector<int32_t> propose_tokens(const std::vector<int32_t>& tokens, int k) const;

 private:
  int min_n_, max_n_;
};

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
