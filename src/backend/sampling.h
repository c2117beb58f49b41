// The one sampling rule every backend follows (Backend::sample), written once for the
// host; the CUDA kernels (backend/cuda/sampling.cu) compute the same thing in parallel.
//
// Per row, with s_i = (logit_i - max) / temperature:
//   threshold = max(k-th largest s          (top-k),
//                   largest t with sum_{s_i >= t} e^{s_i} >= top_p * sum over what top-k kept  (top-p),
//                   log(min_p)              (min-p: p_i >= min_p * p_max));
//   token = argmax over s_i >= threshold of s_i + g_i, g_i = -log(-log(u_i)) (Gumbel-max),
// u_i = sampling_uniform(seed, position, i). Gumbel-max draws exactly from the softmax of the
// kept s_i, and since u depends only on (seed, position, token id), a seeded request gets
// the same token whatever batch it is in and whichever backend runs it (up to rounding).
// Ties at a threshold keep every equal value. Greedy rows take the first maximal id.
// A row with a NaN or +inf logit draws no token: kNoToken (-1), on every backend.
#pragma once
#include <bit>
#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "backend/sampling_hash.h"

namespace tessera {

// What Backend::sample and argmax write for a row whose logits hold a NaN or +inf.
inline constexpr int32_t kNoToken = -1;

// NaN or +inf (tested on the bits, so no compiler flag can fold it away); -inf is a masked token.
inline bool logit_is_broken(float v) {
  const uint32_t u = std::bit_cast<uint32_t>(v);
  return (u & 0x7fffffffu) >= 0x7f800000u && u != 0xff800000u;
}

// Structured output's token mask on one row: -inf at every token whose bit is clear (token t: bit t % 32 of word
// t / 32; words past the mask's end count as clear). Backend::apply_token_mask does this per masked row.
void apply_token_mask_host(float* logits, int64_t vocab, std::span<const uint32_t> mask);

// One row of f32 logits -> token id, or kNoToken.
int32_t sample_row_host(const float* logits, int64_t vocab, const SamplingRow& row);

// Tensor parallelism's greedy rows (Backend::shard_argmax, merge_shard_argmax): one shard's best
// (value, global id) of a row, and the merge of every shard's, written once for the host.
struct ShardBest {
  float value = 0;
  int32_t id = 0;  // kNoToken: the shard saw a NaN or +inf
};
// The best of row[0, width) (the vocabulary's ids first .. first + width - 1): the lowest id
// among equal maxima; {NaN, kNoToken} for a broken logit; {-inf, INT32_MAX} when width is 0.
ShardBest shard_best_host(const float* row, int64_t width, int64_t first);
// The pick over the shards (in vocabulary order): kNoToken when any is broken, else the largest
// value, the lower id among equal ones.
ShardBest merge_shard_best(const ShardBest* shards, int64_t count);

}  // namespace tessera
