// Turns one row of next-token logits into a token, on the host. Order as vLLM:
// logit bias and min_tokens masking, penalties, (logprobs), temperature, top-k,
// top-p, min-p, then a draw from the request's own generator (so a seeded request
// gives the same tokens whatever else is in the batch).
#pragma once
#include <random>
#include <vector>

#include "engine/request.h"

namespace tessera {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // best first
};

struct SampleResult {
  int32_t token = 0;
  std::optional<TokenLogprob> logprob;
};

class Sampler {
 public:
  explicit Sampler(uint64_t seed = 0) : rng_(seed) {}
  // `logits` is modified in place. eos_ids: masked while below min_tokens.
  SampleResult sample(float* logits, int vocab, Request& r, const std::vector<int32_t>& eos_ids);

 private:
  std::mt19937_64 rng_;  // for requests without a seed
  std::vector<int32_t> order_;
  std::vector<float> probs_;
};

}  // namespace tessera
