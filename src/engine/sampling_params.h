// Per-request generation controls, by their OpenAI / vLLM names.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "engine/token_constraint.h"

namespace tessera {

struct SamplingParams {
  int n = 1;
  float temperature = 1.0f;  // 0 = greedy
  float top_p = 1.0f;
  int top_k = 0;  // 0 or -1 = off
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;  // HF style, over prompt and output
  float presence_penalty = 0.0f;    // OpenAI style, over output
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;  // stop strings (applied by the output processor)
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int max_tokens = 16;  // 0 only with prompt_logprobs: score the prompt, generate nothing
  int min_tokens = 0;
  int logprobs = -1;  // -1: none; k >= 0: the sampled token's logprob and the top k
  // vLLM's prompt_logprobs. -1: none; k >= 0: the logprob of every prompt token after the first (from
  // the logits of the position before it, as the model saw the prompt) and the top k there.
  int prompt_logprobs = -1;
  bool include_stop_str_in_output = false;
  // vLLM's allowed_token_ids: the next token always comes from this list. Empty: any.
  std::vector<int32_t> allowed_token_ids;
  // vLLM's bad_words, as token sequences: the last token of each is never taken right after the ones before it
  // (a one-token word is never taken at all).
  std::vector<std::vector<int32_t>> bad_words_ids;
  // Constrained decoding (structured output): each sequence's tokens come only from what its own
  // constraint (made by this factory) allows. Null: none.
  std::shared_ptr<const TokenConstraintFactory> constraint;
  // The constraint starts after the sequence has produced this token (the reasoning parser's end of
  // thinking, </think>), so the reasoning stays free; -1: from the first output token.
  int32_t constraint_after_token = -1;
  bool skip_special_tokens = true;
};

// The longest stop_token_ids list a request may send.
inline constexpr int kMaxStopTokenIds = 1024;

// Limits that keep one request from harming the others.
struct SamplingLimits {
  int max_n = 16;
  int max_logprobs = 20;
  int max_stop = 16;
  int max_stop_length = 256;
  int max_logit_bias = 1024;
  int max_bad_words = 256;
};

// Checks ranges; the message names the field and the allowed range.
Status validate_sampling_params(const SamplingParams& p, int vocab_size, const SamplingLimits& limits = {});

// The one validation of a generation request, at the engine's front door (AsyncEngine::submit;
// LLMEngine::add_request asserts it): a non-empty prompt of token ids inside the vocabulary, the
// prompt plus max_tokens within max_model_len, sampling parameters in range (above). Messages are
// vLLM's; `param`, when given, gets the request field at fault: "prompt", "max_tokens", or "" (a
// sampling parameter, named in the message). `limits`: the server's (--max-logprobs) where it has its own.
Status validate_request(const std::vector<int32_t>& prompt, const SamplingParams& p, int max_model_len, int vocab_size,
                        std::string* param = nullptr, const SamplingLimits& limits = {});

}  // namespace tessera
