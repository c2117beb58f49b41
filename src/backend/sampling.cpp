#include "backend/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace tessera {

void apply_token_mask_host(float* logits, int64_t vocab, std::span<const uint32_t> mask) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < vocab; ++t) {
    const size_t w = static_cast<size_t>(t) >> 5;
    if (w >= mask.size() || !(mask[w] >> (t & 31) & 1u)) logits[t] = neg_inf;
  }
}

ShardBest shard_best_host(const float* row, int64_t width, int64_t first) {
  if (width <= 0) return {-std::numeric_limits<float>::infinity(), INT32_MAX};
  int64_t best = 0;
  for (int64_t i = 0; i < width; ++i) {
    if (logit_is_broken(row[i])) return {std::numeric_limits<float>::quiet_NaN(), kNoToken};
    if (row[i] > row[best]) best = i;
  }
  return {row[best], static_cast<int32_t>(first + best)};
}

ShardBest merge_shard_best(const ShardBest* shards, int64_t count) {
  ShardBest best{-std::numeric_limits<float>::infinity(), INT32_MAX};
  for (int64_t s = 0; s < count; ++s) {
    const ShardBest& b = shards[s];
    if (b.id == kNoToken) return {std::numeric_limits<float>::quiet_NaN(), kNoToken};
    if (b.value > best.value || (b.value == best.value && b.id < best.id)) best = b;
  }
  return best;
}

int32_t sample_row_host(const float* logits, int64_t V, const SamplingRow& row) {
  // Any NaN or +inf logit means the numbers before it broke (NaN/Inf weights, an overflow):
  // no token is drawn (kNoToken), rather than whichever id the comparisons happen to leave.
  int64_t best = 0;
  for (int64_t i = 0; i < V; ++i) {
    if (logit_is_broken(logits[i])) return kNoToken;
    if (logits[i] > logits[best]) best = i;
  }
  if (row.temperature < 1e-5f || V == 1) return static_cast<int32_t>(best);
  const float m = logits[best], inv_t = 1.0f / row.temperature;
  std::vector<float> s(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) s[i] = (logits[i] - m) * inv_t;
  float tau = -std::numeric_limits<float>::infinity();
  const bool top_k = row.top_k > 0 && row.top_k < V, top_p = row.top_p < 1.0f;
  if (top_k || top_p) {
    std::vector<float> sorted = s;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    if (top_k) tau = sorted[static_cast<size_t>(row.top_k - 1)];
    if (top_p) {
      float z = 0;
      for (float v : sorted) {
        if (v < tau) break;
        z += std::exp(v);
      }
      const float target = row.top_p * z;
      // Mass at or above a value counts every copy of it: walk groups of equal values.
      float acc = 0;
      for (size_t i = 0; i < sorted.size() && sorted[i] >= tau;) {
        size_t j = i;
        while (j < sorted.size() && sorted[j] == sorted[i]) acc += std::exp(sorted[j++]);
        if (acc >= target) {
          tau = std::max(tau, sorted[i]);
          break;
        }
        i = j;
      }
    }
  }
  if (row.min_p > 0.0f) tau = std::max(tau, std::log(row.min_p));
  const uint64_t key = sampling_row_key(row.seed, row.position);
  int64_t pick = best;
  float pick_score = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < V; ++i) {
    if (!(s[i] >= tau)) continue;
    const float u = sampling_uniform(key, static_cast<uint32_t>(i));
    const float score = s[i] - std::log(-std::log(u));
    if (score > pick_score) {
      pick_score = score;
      pick = i;
    }
  }
  return static_cast<int32_t>(pick);
}

}  // namespace tessera
