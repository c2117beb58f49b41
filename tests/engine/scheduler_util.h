// Requests and scheduler settings for the scheduler's unit tests (scheduler_test, state_slots_test).
#pragma once
#include <memory>
#include <numeric>
#include <string>

#include "engine/request.h"
#include "engine/scheduler.h"

namespace tessera::testing {

// A request whose prompt is `len` consecutive token ids from `first`.
inline std::unique_ptr<Request> make_request(const std::string& id, int len, int first = 1) {
  auto r = std::make_unique<Request>();
  r->id = id;
  r->prompt.resize(static_cast<size_t>(len));
  std::iota(r->prompt.begin(), r->prompt.end(), first);
  return r;
}

inline SchedulerConfig scheduler_config(int max_num_seqs, int budget, bool chunked = true, int max_model_len = 256) {
  SchedulerConfig c;
  c.max_num_seqs = max_num_seqs;
  c.max_num_batched_tokens = budget;
  c.max_model_len = max_model_len;
  c.enable_chunked_prefill = chunked;
  return c;
}

}  // namespace tessera::testing
