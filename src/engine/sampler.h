// The host side of sampling. Most rows are sampled on the device (Backend::sample, rule in
// backend/sampling.h); a request whose next token needs logit bias, min_tokens masking,
// allowed_token_ids, bad words, a constraint (structured output), repetition/presence/frequency
// penalties or logprobs has its logits row brought to the host, where this class applies those in
// vLLM's order (logit bias, min_tokens masking, allowed ids, bad words, the constraint's mask,
// penalties, logprobs) and then draws with the same rule, so a request's tokens do not depend on
// which side sampled them.
#pragma once
#include <optional>
#include <vector>

#include "backend/sampling_row.h"
#include "engine/request.h"

namespace tessera {

struct SampleResult {
  int32_t token = 0;  // -1 (kNoToken): the logits held NaN or +inf, nothing was drawn
  std::optional<TokenLogprob> logprob;
};

// The device-side controls of r's next token.
SamplingRow sampling_row(const Request& r);
// Whether r's next token needs its logits on the host (see above).
bool needs_host_sampling(const Request& r);
// log_softmax(logits)[token] and the k best (ties: lower id first) of one row of raw logits.
TokenLogprob token_logprobs(const float* logits, int vocab, int32_t token, int k);

class Sampler {
 public:
  // `logits` is modified in place. eos_ids: masked while below min_tokens.
  SampleResult sample(float* logits, int vocab, const Request& r, const std::vector<int32_t>& eos_ids);

 private:
  std::vector<int32_t> seen_;   // scratch for the repetition penalty
  std::vector<uint32_t> mask_;  // a token bitmask (allowed_token_ids, the constraint)
  std::vector<float> scratch_;  // the logits before masking, while a constraint applies
};

}  // namespace tessera
