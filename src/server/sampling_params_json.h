// Sampling parameters from a request's JSON (the server's and `tessera generate --input`'s): the
// JSON side of engine/sampling_params.h, which stays typed. Ranges are the engine's to check
// (validate_request, at AsyncEngine::submit); this checks types and narrowing.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "engine/sampling_params.h"

namespace tessera::server {

// Reads OpenAI / vLLM field names (max_tokens or max_completion_tokens, temperature,
// top_p, top_k, min_p, presence/frequency/repetition_penalty, seed, stop (string or
// list), stop_token_ids, ignore_eos, include_stop_str_in_output, skip_special_tokens, min_tokens, n,
// logprobs (bool or int) +
// top_logprobs, prompt_logprobs (int), logit_bias {"id": bias}) over `p`. Wrong types fail with the
// field name. max_tokens 0 is read (validate_sampling_params allows it only with prompt_logprobs).
Status sampling_params_from_json(const nlohmann::json& j, SamplingParams& p);

// The names of the fields sampling_params_from_json reads, from its table (the server copies only these out
// of a request body).
std::vector<std::string_view> sampling_field_names();

// The most logprob entries one request's answer may hold (each an object in the response body, tens of
// bytes of JSON): 2^20, enough to score a 40,960-token prompt with prompt_logprobs 20.
inline constexpr int64_t kMaxLogprobEntries = int64_t{1} << 20;

// vLLM's --max-logprobs check, in its words: "Requested sample logprobs of 21, which is greater than max allowed:
// 20" (*param "logprobs"; logprobs of completions, top_logprobs of chat) or "Requested prompt logprobs of ..."
// (*param "prompt_logprobs"). `max_logprobs` -1: the vocabulary.
Status check_max_logprobs(const SamplingParams& p, int max_logprobs, int vocab_size, std::string* param);

// Bounds the logprob entries of one request (all its prompts, `params[i]` for `prompt_lengths[i]`): per prompt
// and each of its n choices, max_tokens x (logprobs + 1) when logprobs are asked for, plus prompt tokens x
// (prompt_logprobs + 1) when prompt logprobs are. Over `limit`, an error naming the count, the limit and
// what to lower, with *param the field that asks for the most ("logprobs" or "prompt_logprobs").
Status check_logprob_budget(const std::vector<size_t>& prompt_lengths, const std::vector<SamplingParams>& params,
                            int64_t limit, std::string* param);

}  // namespace tessera::server
