// The proposer interface of speculative decoding (engine/spec/spec_decoder.h owns one): after
// every step it gives each sequence that decodes next up to its room of draft tokens.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/request.h"

namespace tessera {

// What a step computed for one sequence that goes on: positions [begin, end) are now in its
// cache (rejected drafts excluded), and position p's row in the step's tokens is row0 + p - begin;
// the step had `rows` rows of it (end - begin plus the rejected drafts).
struct ComputedSpan {
  Request* request;
  int begin, end;
  int row0;
  int rows;
};

// Proposes draft tokens for decoding sequences (NgramProposer, MtpProposer; tests bring their
// own). Implementations write r->spec_tokens. The capabilities below are read by SpecDecoder only.
class Proposer {
 public:
  virtual ~Proposer() = default;
  // After every step, before propose(): the sequences it computed that go on.
  virtual void observe_step(const std::vector<ComputedSpan>& spans) { (void)spans; }
  // Whether drafts need KV slots at the positions from the last token on before they are
  // verified (MTP writes its own KV there while drafting): SpecDecoder then gives each request
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
  // SpecDecoder calls take_step_drafts instead of observe_step, and propose() hands them out.
  virtual bool drafts_in_step() const { return false; }
  // The drafts the step computed: sequences[s] (the step's, in order; pointers only compared)
  // got drafts[j * S + s] for j < passes.
  virtual void take_step_drafts(std::vector<const Request*> sequences, std::vector<int32_t> drafts, int passes) {
    (void)sequences, (void)drafts, (void)passes;
  }
};

}  // namespace tessera
