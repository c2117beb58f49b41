#include "engine/scheduler.h"

#include <algorithm>

namespace tessera {

Scheduler::Scheduler(SchedulerConfig config, KvCacheCoordinator& cache) : config_(config), cache_(cache) {}

void Scheduler::add(Request* r) {
  r->status = RequestStatus::kWaiting;
  waiting_.push_back(r);
}

void Scheduler::remove(Request* r) {
  auto w = std::find(waiting_.begin(), waiting_.end(), r);
  if (w != waiting_.end()) waiting_.erase(w);
  auto it = std::find(running_.begin(), running_.end(), r);
  if (it != running_.end()) running_.erase(it);
  cache_.free(*r);
}

void Scheduler::preempt(Request* r) {
  cache_.free(*r);
  r->spec_tokens.clear();
  r->status = RequestStatus::kPreempted;
  ++r->num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(r);
}

int Scheduler::cut_at_checkpoint(const Request& r, int start, int num_new, const CacheHit& hit) const {
  const int boundary = cache_.next_checkpoint(r, start, hit);
  return boundary > 0 && start + num_new > boundary ? boundary - start : num_new;
}

int Scheduler::cut_at_prompt_logprob_rows(const Request& r, int start, int num_new, int& rows_left) {
  if (!r.wants_prompt_logprobs() || num_new <= 0) return num_new;
  // Positions [max(start, next), end) of this chunk want rows; the chunk may reach that far plus rows_left.
  const int first = std::max(start, r.prompt_logprob_next()), end = r.prompt_logprob_end();
  const int limit = first + std::max(rows_left, 0);
  if (limit < end) num_new = std::min(num_new, limit - start);
  rows_left -= std::max(0, std::min(start + num_new, end) - first);
  return num_new;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int budget = config_.max_num_batched_tokens;
  int logprob_rows = config_.max_prompt_logprob_rows;

  // 1. Running requests catch up (decode: one token; unfinished chunked prefill: more).
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    const int with_drafts = r->num_tokens() + static_cast<int>(r->spec_tokens.size());
    int num_new = std::min(with_drafts - r->num_computed_tokens, budget);
    num_new = std::min(num_new, config_.max_model_len - r->num_computed_tokens);
    num_new = cut_at_checkpoint(*r, r->num_computed_tokens, num_new);
    int rows_left = logprob_rows;
    num_new = cut_at_prompt_logprob_rows(*r, r->num_computed_tokens, num_new, rows_left);
    if (num_new <= 0) {
      ++i;
      continue;
    }
    bool fits = cache_.allocate(*r, num_new);
    while (!fits) {
      // Preempt the lowest-priority (last admitted) running request, possibly r itself.
      Request* victim = running_.back();
      running_.pop_back();
      preempt(victim);
      out.preempted.push_back(victim);
      if (victim == r) break;
      fits = cache_.allocate(*r, num_new);
    }
    if (!fits) break;  // r itself was preempted
    logprob_rows = rows_left;
    // Drafts past the budget or max_model_len are dropped.
    const int drafts = std::max(0, r->num_computed_tokens + num_new - r->num_tokens());
    r->spec_tokens.resize(static_cast<size_t>(drafts));
    out.scheduled.push_back({r, num_new, r->state_slot(), r->num_computed_tokens > 0, drafts});
    budget -= num_new;
    ++i;
  }

  // 2. Admit waiting requests, FCFS, unless this step had to preempt.
  while (out.preempted.empty() && !waiting_.empty() && budget > 0 &&
         static_cast<int>(running_.size()) < config_.max_num_seqs) {
    Request* r = waiting_.front();
    CacheHit cached;
    // Prompt logprobs need the logits of every prompt position: no prefix-cache hit (vLLM does the same).
    // (Hybrid: where the paged match goes past the last checkpoint, a prefix shared with an earlier
    // prompt, the prefill stops there first and checkpoints the state for later prompts:
    // cut_at_checkpoint with the hit.)
    if (r->num_computed_tokens == 0 && !cache_.holds_cache(*r) && r->params.prompt_logprobs < 0)
      cached = cache_.find_cached_prefix(*r);
    const int cached_tokens = cached.num_tokens;
    int num_new = r->num_tokens() - r->num_computed_tokens - cached_tokens;
    if (!config_.enable_chunked_prefill && num_new > budget) break;
    num_new = std::min(num_new, budget);
    num_new = cut_at_checkpoint(*r, r->num_computed_tokens + cached_tokens, num_new, cached);
    int rows_left = logprob_rows;
    num_new = cut_at_prompt_logprob_rows(*r, r->num_computed_tokens + cached_tokens, num_new, rows_left);
    if (num_new <= 0) break;  // no prompt-logprob rows left this step: it waits (FCFS)
    if (!cache_.allocate(*r, num_new, cached)) break;
    logprob_rows = rows_left;
    if (r->status == RequestStatus::kWaiting) r->num_cached_tokens = cached_tokens;
    waiting_.pop_front();
    r->status = RequestStatus::kRunning;
    running_.push_back(r);
    out.scheduled.push_back({r, num_new, r->state_slot(), r->num_computed_tokens > 0});
    budget -= num_new;
  }
  // (Copies wait for a step that runs: a step with nothing scheduled never reaches the model.)
  if (!out.scheduled.empty()) out.state_copies = cache_.take_state_copies();
  return out;
}

void Scheduler::on_step_done(const SchedulerOutput& out) {
  for (const auto& s : out.scheduled) {
    s.request->num_computed_tokens += s.num_new_tokens - s.num_draft_tokens;
    cache_.commit_computed(*s.request);
  }
}

void Scheduler::accept_drafts(Request& r, int accepted) {
  r.spec_tokens.clear();
  if (accepted <= 0) return;
  r.num_computed_tokens += accepted;
  cache_.accept_drafts(r, accepted);
}

}  // namespace tessera
