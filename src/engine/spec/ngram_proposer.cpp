#include "engine/spec/ngram_proposer.h"

#include <algorithm>

namespace tessera {

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

}  // namespace tessera
