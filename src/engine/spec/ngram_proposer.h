#pragma once
#include <cstdint>
#include <vector>

#include "engine/spec/proposer.h"

namespace tessera {

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

}  // namespace tessera
