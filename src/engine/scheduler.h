// vLLM v1-style scheduling: no prefill or decode phase. Every request has tokens
// computed and tokens known; each step lets running requests catch up first, then
// admits waiting ones, within a token budget (chunked prefill) and a sequence cap.
// When blocks run out, the most recently admitted running request is preempted
// (what it holds in every cache group freed; it is recomputed later from its prompt and output so far).
// Hybrid models: a sequence is admitted only with a state slot; with prefix caching its
// prefill stops where its KV match in the prefix cache ended at admission (past its last
// checkpointed block) and at the prompt's last full-block boundary: the checkpoints a later
// prefix hit restores (see KvCacheCoordinator).
// Requests that want prompt logprobs never take a prefix-cache hit (every prompt position's logits
// are needed), and their prefill chunks are cut so that a step carries at most
// max_prompt_logprob_rows prompt positions whose logits go to the host.
#pragma once
#include <deque>
#include <memory>
#include <vector>

#include "engine/kv_cache_coordinator.h"
#include "engine/request.h"

namespace tessera {

struct SchedulerConfig {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 8192;
  int max_model_len = 4096;
  bool enable_chunked_prefill = true;
  // Prompt-logprob logits rows ([rows, vocab] f32, copied to the host) per step, over all requests.
  int max_prompt_logprob_rows = 256;
};

struct ScheduledRequest {
  Request* request;
  int num_new_tokens;  // includes num_draft_tokens
  // Hybrid models: the sequence's state slot, and whether this step continues from the state
  // in it (the sequence has computed tokens before this step, or restores a prefix-cache
  // checkpoint into it); -1 / false for other models.
  int32_t state_slot = -1;
  bool has_initial_state = false;
  // Speculative decoding: the last num_draft_tokens of the new tokens are r->spec_tokens (the
  // drafts this step verifies; drafts that did not fit the budget or max_model_len were dropped).
  int num_draft_tokens = 0;
};

struct SchedulerOutput {
  std::vector<ScheduledRequest> scheduled;  // running ones first, in running order
  std::vector<Request*> preempted;
  std::vector<int32_t> state_copies;  // (src, dst) slot pairs to copy before the step, in order
  int num_tokens() const {
    int n = 0;
    for (const auto& s : scheduled) n += s.num_new_tokens;
    return n;
  }
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, KvCacheCoordinator& cache);

  void add(Request* r);  // to the waiting queue (FCFS)
  // Removes a request wherever it is and frees its blocks.
  void remove(Request* r);
  SchedulerOutput schedule();
  // After the step ran: every scheduled request computed its new tokens (drafts excepted:
  // they count once verified, accept_drafts).
  void on_step_done(const SchedulerOutput& out);
  // After verification: the first `accepted` drafts of r were right (their KV stays; the
  // rejected ones' is overwritten later), and r's drafts are consumed.
  void accept_drafts(Request& r, int accepted);

  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  uint64_t num_preemptions() const { return num_preemptions_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  void preempt(Request* r);
  // num_new for r, starting at `start` computed tokens, cut at its next checkpoint position (`hit`:
  // the prefix hit of a request being admitted).
  int cut_at_checkpoint(const Request& r, int start, int num_new, const CacheHit& hit = {}) const;
  // num_new for r, starting at `start`, cut so that its prompt-logprob rows fit `rows_left` (which it
  // then takes them from).
  static int cut_at_prompt_logprob_rows(const Request& r, int start, int num_new, int& rows_left);
  SchedulerConfig config_;
  KvCacheCoordinator& cache_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;
  uint64_t num_preemptions_ = 0;
};

}  // namespace tessera
