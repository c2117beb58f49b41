#include "engine/spec_decode.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"

namespace tessera {

SpeculativeConfig validate_speculative_config(SpeculativeConfig c) {
  if (c.method.empty() && c.num_speculative_tokens == 0) return c;
  if (c.method == "qwen3_next_mtp" || c.method == "qwen3_5_mtp") c.method = "mtp";
  if (c.method != "ngram" && c.method != "mtp")
    fail(ErrorKind::kInvalidArgument,
         "--speculative-config: method '{}' is not supported; tessera runs 'ngram' (prompt lookup) and 'mtp' (the "
         "checkpoint's multi-token-prediction layer; aliases qwen3_next_mtp, qwen3_5_mtp)",
         c.method);
  if (c.num_speculative_tokens < 1 || c.num_speculative_tokens > 16)
    fail(ErrorKind::kInvalidArgument, "--speculative-config: num_speculative_tokens must be in 1..16, got {}",
         c.num_speculative_tokens);
  if (c.method == "ngram") {
    if (c.prompt_lookup_min <= 0 && c.prompt_lookup_max <= 0)
      c.prompt_lookup_min = c.prompt_lookup_max = 5;
    else if (c.prompt_lookup_min <= 0)
      c.prompt_lookup_min = c.prompt_lookup_max;
    else if (c.prompt_lookup_max <= 0)
      c.prompt_lookup_max = c.prompt_lookup_min;
    if (c.prompt_lookup_min < 1 || c.prompt_lookup_max < c.prompt_lookup_min)
      fail(ErrorKind::kInvalidArgument,
           "--speculative-config: need 1 <= prompt_lookup_min <= prompt_lookup_max, got {} and {}", c.prompt_lookup_min,
           c.prompt_lookup_max);
  } else if (c.prompt_lookup_min > 0 || c.prompt_lookup_max > 0) {
    fail(ErrorKind::kInvalidArgument, "--speculative-config: prompt_lookup_min/max belong to method 'ngram'");
  }
  return c;
}

void require_runnable(const SpeculativeConfig& c) {
  if (c.enabled() && c.method == "mtp")
    fail(ErrorKind::kUnsupported,
         "--speculative-config method 'mtp' is not built yet; use {{\"method\": \"ngram\", ...}} or run without "
         "--speculative-config");
}

std::string describe(const SpeculativeConfig& c) {
  if (!c.enabled()) return "off";
  if (c.method == "ngram")
    return fmt::format("ngram (num_speculative_tokens={}, prompt_lookup_min={}, prompt_lookup_max={})",
                       c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max);
  return fmt::format("{} (num_speculative_tokens={})", c.method, c.num_speculative_tokens);
}

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

std::string spec_decode_log_line(const SpecDecodeStats& now, const SpecDecodeStats& before, double seconds) {
  const double drafts = static_cast<double>(now.num_drafts - before.num_drafts);
  const double drafted = static_cast<double>(now.num_draft_tokens - before.num_draft_tokens);
  const double accepted = static_cast<double>(now.num_accepted_tokens - before.num_accepted_tokens);
  std::string per_pos;
  for (size_t i = 0; i < now.accepted_per_pos.size(); ++i) {
    const uint64_t was = i < before.accepted_per_pos.size() ? before.accepted_per_pos[i] : 0;
    per_pos += fmt::format("{}{:.3f}", i ? ", " : "", drafts > 0 ? (now.accepted_per_pos[i] - was) / drafts : 0.0);
  }
  const double secs = seconds > 0 ? seconds : 1;
  return fmt::format(
      "SpecDecoding metrics: Mean acceptance length: {:.2f}, Accepted throughput: {:.2f} tokens/s, Drafted "
      "throughput: {:.2f} tokens/s, Accepted: {} tokens, Drafted: {} tokens, Per-position acceptance rate: {}, Avg "
      "Draft acceptance rate: {:.1f}%",
      drafts > 0 ? 1 + accepted / drafts : 0.0, accepted / secs, drafted / secs, static_cast<uint64_t>(accepted),
      static_cast<uint64_t>(drafted), per_pos, drafted > 0 ? 100 * accepted / drafted : 0.0);
}

}  // namespace tessera
