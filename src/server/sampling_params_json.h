// Sampling parameters from a request's JSON (the server's and `tessera generate --input`'s): the
// JSON side of engine/sampling_params.h, which stays typed. Ranges are the engine's to check
// (validate_request, at AsyncEngine::submit); this checks types and narrowing.
#pragma once
#include <nlohmann/json_fwd.hpp>

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

}  // namespace tessera::server
