#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

namespace tessera {

namespace {

void apply_penalties(float* logits, int vocab, const Request& r) {
  const SamplingParams& p = r.params;
  if (p.repetition_penalty != 1.0f) {
    std::vector<char> seen(static_cast<size_t>(vocab), 0);
    for (int i = 0; i < r.num_tokens(); ++i) {
      int32_t t = r.token_at(i);
      if (t < 0 || t >= vocab || seen[t]) continue;
      seen[t] = 1;
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

TokenLogprob logprobs_of(const float* logits, int vocab, int32_t token, int k) {
  float mx = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  TokenLogprob lp;
  lp.token = token;
  lp.logprob = logits[token] - lse;
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

int32_t argmax(const float* logits, int vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

}  // namespace

SampleResult Sampler::sample(float* logits, int vocab, Request& r, const std::vector<int32_t>& eos_ids) {
  const SamplingParams& p = r.params;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (const auto& [t, b] : p.logit_bias) logits[t] += b;
  if (static_cast<int>(r.output.size()) < p.min_tokens) {
    if (!p.ignore_eos)
      for (int32_t e : eos_ids)
        if (e >= 0 && e < vocab) logits[e] = neg_inf;
    for (int32_t t : p.stop_token_ids) logits[t] = neg_inf;
  }
  apply_penalties(logits, vocab, r);

  SampleResult res;
  if (p.temperature < 1e-5f) {
    res.token = argmax(logits, vocab);
  } else {
    // Candidates sorted by logit (descending); top-k then top-p then min-p cut the list.
    const int k = (p.top_k > 0 && p.top_k < vocab) ? p.top_k : vocab;
    order_.resize(static_cast<size_t>(vocab));
    std::iota(order_.begin(), order_.end(), 0);
    auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    const bool need_sorted = k < vocab || p.top_p < 1.0f || p.min_p > 0.0f;
    int n = vocab;
    if (need_sorted) {
      std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), by_logit);
      n = k;
    }
    const float inv_t = 1.0f / p.temperature;
    const float mx = logits[need_sorted ? order_[0] : argmax(logits, vocab)];
    probs_.resize(static_cast<size_t>(n));
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      probs_[i] = std::exp((logits[order_[i]] - mx) * inv_t);
      sum += probs_[i];
    }
    if (p.top_p < 1.0f) {
      double acc = 0;
      int keep = n;
      for (int i = 0; i < n; ++i) {
        acc += probs_[i] / sum;
        if (acc >= p.top_p) {
          keep = i + 1;
          break;
        }
      }
      n = keep;
    }
    if (p.min_p > 0.0f) {
      const float floor = probs_[0] * p.min_p;  // probs_[0] is the largest
      int keep = 1;
      while (keep < n && probs_[keep] >= floor) ++keep;
      n = keep;
    }
    double total = 0;
    for (int i = 0; i < n; ++i) total += probs_[i];
    std::mt19937_64& g = p.seed ? r.rng : rng_;
    double u = std::uniform_real_distribution<double>(0.0, total)(g);
    int pick = n - 1;
    for (int i = 0; i < n; ++i) {
      u -= probs_[i];
      if (u < 0) {
        pick = i;
        break;
      }
    }
    res.token = order_[pick];
  }
  if (p.logprobs >= 0) res.logprob = logprobs_of(logits, vocab, res.token, p.logprobs);
  return res;
}

}  // namespace tessera
