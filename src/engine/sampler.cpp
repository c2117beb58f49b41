#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "backend/sampling.h"

namespace tessera {

SamplingRow sampling_row(const Request& r) {
  const SamplingParams& p = r.params;
  SamplingRow row;
  row.temperature = p.temperature < 1e-5f ? 0.0f : p.temperature;
  row.top_k = p.top_k;
  row.top_p = p.top_p;
  row.min_p = p.min_p;
  row.seed = r.sample_seed;
  row.position = r.output.size();
  return row;
}

bool needs_host_sampling(const Request& r) {
  const SamplingParams& p = r.params;
  return !p.logit_bias.empty() || static_cast<int>(r.output.size()) < p.min_tokens || p.repetition_penalty != 1.0f ||
         p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f || p.logprobs >= 0 || !p.allowed_token_ids.empty() ||
         !p.bad_words_ids.empty();
}

namespace {

void apply_penalties(float* logits, int vocab, const Request& r, std::vector<int32_t>& seen) {
  const SamplingParams& p = r.params;
  if (p.repetition_penalty != 1.0f) {
    // Each distinct token of prompt and output once (sorted ids: no vocabulary-sized table).
    seen.clear();
    for (int i = 0; i < r.num_tokens(); ++i) seen.push_back(r.token_at(i));
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int32_t t : seen) {
      if (t < 0 || t >= vocab) continue;
      logits[t] = logits[t] > 0 ? logits[t] / p.repetition_penalty : logits[t] * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : r.output) counts[t]++;
    for (auto [t, c] : counts)
      if (t >= 0 && t < vocab) logits[t] -= p.presence_penalty + p.frequency_penalty * static_cast<float>(c);
  }
}

// Tokens that would complete a bad word: for each word, its last token when the tokens before it end r's
// output (vLLM's bad_words rule).
void mask_bad_words(float* logits, int vocab, const Request& r) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const auto& out = r.output;
  for (const auto& w : r.params.bad_words_ids) {
    if (w.empty()) continue;
    const size_t before = w.size() - 1;
    if (before > out.size()) continue;
    if (!std::equal(w.begin(), w.end() - 1, out.end() - static_cast<std::ptrdiff_t>(before))) continue;
    if (w.back() >= 0 && w.back() < vocab) logits[w.back()] = neg_inf;
  }
}

}  // namespace

TokenLogprob token_logprobs(const float* logits, int vocab, int32_t token, int k) {
  float mx = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  TokenLogprob lp;
  lp.token = token;
  lp.logprob = logits[token] - lse;
  lp.rank = 1 + static_cast<int>(std::count_if(logits, logits + vocab, [&](float v) { return v > logits[token]; }));
  if (k > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    std::iota(idx.begin(), idx.end(), 0);
    k = std::min(k, vocab);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (int i = 0; i < k; ++i) lp.top.emplace_back(idx[i], logits[idx[i]] - lse);
  }
  return lp;
}

SampleResult Sampler::sample(float* logits, int vocab, const Request& r, const std::vector<int32_t>& eos_ids) {
  const SamplingParams& p = r.params;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (const auto& [t, b] : p.logit_bias) logits[t] += b;
  // A constraint's choices win over min_tokens, bad words and allowed_token_ids: when those leave none of
  // them, the constraint's own stay (a grammar that can only end here may end).
  if (r.constraint_active) scratch_.assign(logits, logits + vocab);
  if (static_cast<int>(r.output.size()) < p.min_tokens) {
    if (!p.ignore_eos)
      for (int32_t e : eos_ids)
        if (e >= 0 && e < vocab) logits[e] = neg_inf;
    for (int32_t t : p.stop_token_ids) logits[t] = neg_inf;
  }
  if (!p.allowed_token_ids.empty()) {
    mask_.assign((static_cast<size_t>(vocab) + 31) / 32, 0u);
    for (int32_t t : p.allowed_token_ids)
      if (t >= 0 && t < vocab) mask_[static_cast<size_t>(t) >> 5] |= 1u << (t & 31);
    apply_token_mask_host(logits, vocab, mask_);
  }
  if (!p.bad_words_ids.empty()) mask_bad_words(logits, vocab, r);
  if (r.constraint_active) {
    mask_.assign((static_cast<size_t>(vocab) + 31) / 32, 0u);
    r.constraint->fill_mask(mask_);
    apply_token_mask_host(logits, vocab, mask_);
    if (std::none_of(logits, logits + vocab, [&](float v) { return v > neg_inf; })) {
      std::copy(scratch_.begin(), scratch_.end(), logits);
      apply_token_mask_host(logits, vocab, mask_);
    }
  }
  apply_penalties(logits, vocab, r, seen_);
  SampleResult res;
  res.token = sample_row_host(logits, vocab, sampling_row(r));
  if (res.token < 0) return res;  // NaN or +inf logits: no token (the engine fails the request)
  if (p.logprobs >= 0) res.logprob = token_logprobs(logits, vocab, res.token, p.logprobs);
  return res;
}

}  // namespace tessera
