// validate_request: the engine's one check of a request (AsyncEngine::submit calls it), with vLLM's
// wording and the field at fault, which the server turns into a 400's `param`.
#include <gtest/gtest.h>

#include "engine/sampling_params.h"

namespace tessera {
namespace {

SamplingParams with_max_tokens(int m) {
  SamplingParams p;
  p.max_tokens = m;
  return p;
}

// The message (empty when valid) and the field.
std::pair<std::string, std::string> check(const std::vector<int32_t>& prompt, const SamplingParams& p) {
  std::string param = "unset";
  Status s = validate_request(prompt, p, /*max_model_len=*/10, /*vocab_size=*/50, &param);
  return {s.ok() ? "" : s.message(), param};
}

TEST(RequestValidation, ContextLengthInVllmsWords) {
  EXPECT_EQ(check(std::vector<int32_t>(10, 1), with_max_tokens(1)),
            std::make_pair(std::string("This model's maximum context length is 10 tokens. However, your request has 10 "
                                       "input tokens. Please reduce the length of the input messages."),
                           std::string("prompt")));
  EXPECT_EQ(check(std::vector<int32_t>(4, 1), with_max_tokens(7)),
            std::make_pair(std::string("'max_tokens' or 'max_completion_tokens' is too large: 7. This model's maximum "
                                       "context length is 10 tokens and your request has 4 input tokens (7 > 10 - 4)."),
                           std::string("max_tokens")));
  // Exactly full is fine; the check is on prompt + max_tokens.
  EXPECT_EQ(check(std::vector<int32_t>(4, 1), with_max_tokens(6)), std::make_pair(std::string(), std::string()));
  EXPECT_EQ(check(std::vector<int32_t>(9, 1), with_max_tokens(1)).first, "");
}

TEST(RequestValidation, PromptTokensAndSamplingRanges) {
  EXPECT_EQ(check({}, with_max_tokens(1)),
            std::make_pair(std::string("The decoder prompt cannot be empty"), std::string("prompt")));
  EXPECT_EQ(check({1, 50}, with_max_tokens(1)),
            std::make_pair(std::string("Token id 50 is out of vocabulary (0..49)"), std::string("prompt")));
  EXPECT_EQ(check({-1}, with_max_tokens(1)).first, "Token id -1 is out of vocabulary (0..49)");
  SamplingParams p = with_max_tokens(2);
  p.temperature = -1;
  EXPECT_EQ(check({1}, p), std::make_pair(std::string("temperature must be between 0 and 100"), std::string()));
  p = with_max_tokens(2);
  p.stop_token_ids = {50};
  EXPECT_NE(check({1}, p).first.find("stop_token_ids entry 50 is outside the vocabulary"), std::string::npos);
  // Without an out-parameter it still checks.
  EXPECT_FALSE(validate_request({}, p, 10, 50).ok());
  EXPECT_TRUE(validate_request({1}, with_max_tokens(2), 10, 50).ok());
}

}  // namespace
}  // namespace tessera
