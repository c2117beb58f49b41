#include "engine/spec/spec_config.h"

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
  if (c.disable_by_batch_size < SpeculativeConfig::kDisableAuto)
    fail(ErrorKind::kInvalidArgument,
         "--speculative-config: disable_by_batch_size must be >= 0 (0: never) or -1 (measured at startup, MTP), got {}",
         c.disable_by_batch_size);
  if (c.method == "ngram") {
    // Prompt lookup costs nothing to keep up, and its drafts on a calibration's random prompts
    // would say nothing: auto means never for ngram.
    if (c.disable_by_batch_size == SpeculativeConfig::kDisableAuto) c.disable_by_batch_size = 0;
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

std::string describe(const SpeculativeConfig& c) {
  if (!c.enabled()) return "off";
  const std::string off =
      c.disable_by_batch_size > 0 ? fmt::format(", disable_by_batch_size={}", c.disable_by_batch_size)
      : c.disable_by_batch_size == SpeculativeConfig::kDisableAuto ? ", drafting while it pays (measured at startup)"
                                                                   : "";
  if (c.method == "ngram")
    return fmt::format("ngram (num_speculative_tokens={}, prompt_lookup_min={}, prompt_lookup_max={}{})",
                       c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max, off);
  return fmt::format("{} (num_speculative_tokens={}{})", c.method, c.num_speculative_tokens, off);
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
