// Engine-side state of one sequence. Owned by the engine thread only.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/sampling_params.h"

namespace tessera {

enum class RequestStatus { kWaiting, kRunning, kPreempted, kFinished };
enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
// "stop", "length", "abort", "error" (inline: the server's fuzz target uses it without the engine library).
inline const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "";
}

// A token's logprob and the k most likely tokens at its position (best first).
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  int rank = 0;  // 1 + the number of tokens more likely than `token` (vLLM's Logprob.rank)
  std::vector<std::pair<int32_t, float>> top;  // best first
};

// A block-table entry that holds no block: a sliding-window group freed it (no future token
// attends to its positions) or a prefix hit never needed it.
inline constexpr int32_t kNullBlock = -1;

// What a request holds in one cache group.
struct CacheGroupTable {
  // Paged groups: the block of positions [b * block_size, (b + 1) * block_size) at index b
  // (kNullBlock where the group needs none).
  std::vector<int32_t> blocks;
  // The state group (linear-attention layers of hybrid models): the slot held, and with
  // speculative decoding k more, where a verification step keeps the state after each draft;
  // the one after the last accepted token becomes state_slot.
  int32_t state_slot = -1;
  std::vector<int32_t> draft_state_slots;
  // The state group with prefix caching: where the prompt's match in the paged groups' cache
  // ended at admission when it went past the last state checkpoint (a prefix shared with an
  // earlier prompt, e.g. a system prompt); the prefill stops there once to checkpoint the
  // state, so later prompts sharing that prefix hit. 0 = none.
  int shared_prefix_end = 0;
  // The state group with prefix caching, once the sequence is past its prompt's last checkpoint: the
  // block boundary of its latest rolling checkpoint (the state after its last full block of prompt and
  // output, which a continuation of it, the next turn of a conversation, restores) and that block's
  // hash, which keys it; 0 = none yet. It moves at most every checkpoint_interval tokens (CacheGroupSpec).
  int rolling_checkpoint_end = 0;
  uint64_t rolling_checkpoint_hash = 0;
  // Speculative decoding: accepted drafts passed block boundary `boundary_state_pos` without ending
  // there; `boundary_state_slot` (a draft slot) holds the state at it until the next step. -1 = none.
  int32_t boundary_state_slot = -1;
  int boundary_state_pos = 0;
};

struct Request {
  std::string id;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  SamplingParams params;
  RequestStatus status = RequestStatus::kWaiting;
  FinishReason finish = FinishReason::kNone;
  std::optional<int32_t> stop_token;  // the stop/eos token that finished it

  int num_computed_tokens = 0;  // tokens whose K/V are in the cache
  int num_cached_tokens = 0;    // of the prompt, found in the prefix cache at admission
  // One table per cache group of the KvCacheCoordinator (engine/kv_cache_coordinator.h), in its
  // group order: paged-attention groups first, then the state group of hybrid models. Empty
  // until the request first holds cache.
  std::vector<CacheGroupTable> cache_tables;
  // Paged group g's blocks (the step's block table of that group); empty when it holds none.
  const std::vector<int32_t>& block_ids(size_t g = 0) const {
    static const std::vector<int32_t> kNone;
    return g < cache_tables.size() ? cache_tables[g].blocks : kNone;
  }
  // Hybrid models: the linear-attention state slot held (the state group's); -1 when none.
  int32_t state_slot() const { return cache_tables.empty() ? -1 : cache_tables.back().state_slot; }
  // The paged-KV slot of position p in paged group g (block_size tokens a block).
  int32_t kv_slot(int p, int block_size, size_t g = 0) const {
    return block_ids(g)[static_cast<size_t>(p / block_size)] * block_size + p % block_size;
  }
  // Appends this request's row of a step's block table of paged group g: its blocks, padded with
  // block 0 to `width` (blocks a sliding window freed read as block 0 too: the window never reaches them).
  void append_block_table(std::vector<int32_t>& table, int width, size_t g = 0) const {
    const std::vector<int32_t>& blocks = block_ids(g);
    for (int b = 0; b < width; ++b)
      table.push_back(b < static_cast<int>(blocks.size()) ? std::max(blocks[static_cast<size_t>(b)], 0) : 0);
  }
  std::vector<uint64_t> block_hashes;  // chained hashes of the full blocks so far (shared by every group)
  int num_preemptions = 0;
  uint64_t arrival_order = 0;
  // When a step first computed any of it (its time in the waiting queue ends there); the epoch until then.
  std::chrono::steady_clock::time_point scheduled_at{};
  uint64_t sample_seed = 0;  // keys the request's random draws (params.seed + n-index, or from the engine)
  // params.prompt_logprobs >= 0: the entries so far, one per prompt token from the second on; position p's
  // logits give entry p (the logprob of prompt[p + 1]). Handed out with the request's first output;
  // prompt_logprobs_done counts them, so a prefill recomputed after preemption asks only for the
  // positions not done yet.
  std::vector<TokenLogprob> prompt_logprobs;
  int prompt_logprobs_done = 0;
  // Speculative decoding: draft tokens proposed after its last output token, verified by the
  // next step (positions num_tokens() ..); cleared when verified or the request is preempted.
  std::vector<int32_t> spec_tokens;
  // MTP speculative decoding: it ran a step while drafting was off (disable_by_batch_size), so the
  // MTP layer's KV misses positions; it gets no drafts and no MTP pass from then on.
  bool spec_off = false;
  // Constrained decoding: this sequence's constraint (made from params.constraint at admission), and
  // whether it applies yet (after params.constraint_after_token was produced).
  std::shared_ptr<TokenConstraint> constraint;
  bool constraint_active = false;
  // The constraint threw while the step's masks were filled: what it said (the engine ends the sequence
  // with finish_reason error at that step instead of taking its token).
  std::string constraint_error;

  int num_tokens() const { return static_cast<int>(prompt.size() + output.size()); }
  // The next prompt position whose logits are still wanted for prompt_logprobs; the end of that range
  // (prompt.size() - 1: the last prompt position's logits give the first output token, not a prompt
  // logprob). next == end: none wanted.
  int prompt_logprob_next() const { return prompt_logprobs_done; }
  int prompt_logprob_end() const { return params.prompt_logprobs >= 0 ? static_cast<int>(prompt.size()) - 1 : 0; }
  bool wants_prompt_logprobs() const { return prompt_logprob_next() < prompt_logprob_end(); }
  // Token i of prompt + output, then the drafts (i >= num_tokens()).
  int32_t token_at(int i) const {
    const int p = static_cast<int>(prompt.size()), o = static_cast<int>(output.size());
    return i < p ? prompt[i] : i < p + o ? output[i - p] : spec_tokens[static_cast<size_t>(i - p - o)];
  }
};

}  // namespace tessera
