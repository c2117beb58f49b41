#include "engine/sampling_params.h"

#include <fmt/format.h>
#include <cmath>

namespace tessera {

Status validate_sampling_params(const SamplingParams& p, int vocab, const SamplingLimits& lim) {
  auto bad = [](std::string m) { return Status(ErrorKind::kInvalidArgument, std::move(m)); };
  if (p.n < 1 || p.n > lim.max_n) return bad(fmt::format("n must be between 1 and {}, got {}", lim.max_n, p.n));
  if (!(p.temperature >= 0 && p.temperature <= 100)) return bad("temperature must be between 0 and 100");
  if (!(p.top_p > 0 && p.top_p <= 1)) return bad("top_p must be in (0, 1]");
  if (p.top_k < -1 || p.top_k > vocab) return bad(fmt::format("top_k must be -1, 0 or at most {}", vocab));
  if (!(p.min_p >= 0 && p.min_p <= 1)) return bad("min_p must be in [0, 1]");
  if (!(p.repetition_penalty > 0 && p.repetition_penalty <= 10)) return bad("repetition_penalty must be in (0, 10]");
  if (!(std::fabs(p.presence_penalty) <= 2)) return bad("presence_penalty must be in [-2, 2]");
  if (!(std::fabs(p.frequency_penalty) <= 2)) return bad("frequency_penalty must be in [-2, 2]");
  if (p.max_tokens < 1 && !(p.max_tokens == 0 && p.prompt_logprobs >= 0))
    return bad(
        fmt::format("max_tokens must be at least 1, got {} (0 only when scoring the prompt: prompt_logprobs, "
                    "or echo with /v1/completions)",
                    p.max_tokens));
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens) return bad("min_tokens must be between 0 and max_tokens");
  if (p.logprobs > lim.max_logprobs)
    return bad(fmt::format("logprobs must be at most {}, got {}", lim.max_logprobs, p.logprobs));
  if (p.prompt_logprobs > lim.max_logprobs)
    return bad(fmt::format("prompt_logprobs must be at most {}, got {}", lim.max_logprobs, p.prompt_logprobs));
  if (static_cast<int>(p.stop.size()) > lim.max_stop) return bad(fmt::format("at most {} stop strings", lim.max_stop));
  for (const auto& s : p.stop) {
    if (s.empty()) return bad("stop strings must not be empty");
    if (static_cast<int>(s.size()) > lim.max_stop_length)
      return bad(fmt::format("stop strings must be at most {} bytes", lim.max_stop_length));
  }
  if (static_cast<int>(p.logit_bias.size()) > lim.max_logit_bias)
    return bad(fmt::format("logit_bias may hold at most {} entries", lim.max_logit_bias));
  for (const auto& [tok, b] : p.logit_bias) {
    if (tok < 0 || tok >= vocab) return bad(fmt::format("logit_bias token {} is outside the vocabulary", tok));
    if (!(b >= -100 && b <= 100)) return bad("logit_bias values must be in [-100, 100]");
  }
  if (p.stop_token_ids.size() > static_cast<size_t>(kMaxStopTokenIds))
    return bad(fmt::format("stop_token_ids may hold at most {} entries", kMaxStopTokenIds));
  for (int32_t t : p.stop_token_ids)
    if (t < 0 || t >= vocab) return bad(fmt::format("stop_token_ids entry {} is outside the vocabulary", t));
  if (p.allowed_token_ids.size() > static_cast<size_t>(vocab))
    return bad(fmt::format("allowed_token_ids may hold at most {} entries (the vocabulary)", vocab));
  for (int32_t t : p.allowed_token_ids)
    if (t < 0 || t >= vocab) return bad(fmt::format("allowed_token_ids entry {} is outside the vocabulary", t));
  if (p.bad_words_ids.size() > static_cast<size_t>(lim.max_bad_words))
    return bad(fmt::format("bad_words may hold at most {} entries", lim.max_bad_words));
  for (const auto& w : p.bad_words_ids)
    for (int32_t t : w)
      if (t < 0 || t >= vocab) return bad(fmt::format("a bad_words token id {} is outside the vocabulary", t));
  return Status::Ok();
}

Status validate_request(const std::vector<int32_t>& prompt, const SamplingParams& p, int max_model_len, int vocab_size,
                        std::string* param, const SamplingLimits& limits) {
  auto bad = [&](const char* field, std::string m) {
    if (param) *param = field;
    return Status(ErrorKind::kInvalidArgument, std::move(m));
  };
  if (prompt.empty()) return bad("prompt", "The decoder prompt cannot be empty");
  for (int32_t t : prompt)
    if (t < 0 || t >= vocab_size)
      return bad("prompt", fmt::format("Token id {} is out of vocabulary (0..{})", t, vocab_size - 1));
  const int64_t L = max_model_len, P = static_cast<int64_t>(prompt.size()), M = p.max_tokens;
  if (P >= L)
    return bad("prompt", fmt::format("This model's maximum context length is {} tokens. However, your request has {} "
                                     "input tokens. Please reduce the length of the input messages.",
                                     L, P));
  if (P + M > L)
    return bad("max_tokens", fmt::format("'max_tokens' or 'max_completion_tokens' is too large: {}. This model's "
                                         "maximum context length is {} tokens and your request has {} input tokens "
                                         "({} > {} - {}).",
                                         M, L, P, M, L, P));
  if (Status s = validate_sampling_params(p, vocab_size, limits); !s.ok()) return bad("", s.message());
  if (param) param->clear();
  return Status::Ok();
}

}  // namespace tessera
