// sampling_params_from_json: every integer field is range-checked before it is narrowed (a value
// that wrapped used to become another token id or another count), and the logprobs pair is
// checked as vLLM does.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/sampling_params_json.h"

namespace tessera::server {
namespace {

using nlohmann::json;

Status read(const std::string& text, SamplingParams* out = nullptr) {
  SamplingParams p;
  Status s = sampling_params_from_json(json::parse(text), p);
  if (out) *out = p;
  return s;
}

void expect_refused(const std::string& text, const std::string& words) {
  Status s = read(text);
  ASSERT_FALSE(s.ok()) << text;
  EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("json.exception"), std::string::npos) << s.message();
}

TEST(SamplingParamsJson, LogitBiasKeysOutsideInt32AreRefused) {
  expect_refused(R"({"logit_bias": {"4294967296": 5}})", "not a token id");  // wrapped to token 0 before
  expect_refused(R"({"logit_bias": {"-1": 5}})", "not a token id");
  expect_refused(R"({"logit_bias": {"12abc": 5}})", "not a token id");
  expect_refused(R"({"logit_bias": {"99999999999999999999999": 5}})", "not a token id");
  SamplingParams p;
  ASSERT_TRUE(read(R"({"logit_bias": {"2147483647": 1.5}})", &p).ok());
  ASSERT_EQ(p.logit_bias.size(), 1u);
  EXPECT_EQ(p.logit_bias[0].first, 2147483647);
}

TEST(SamplingParamsJson, StopTokenIdsAreRangeCheckedAndCapped) {
  expect_refused(R"({"stop_token_ids": [4294967301]})", "not a token id");  // was token 5
  expect_refused(R"({"stop_token_ids": [-3]})", "not a token id");
  expect_refused(R"({"stop_token_ids": [18446744073709551615]})", "not a token id");
  json many = {{"stop_token_ids", json::array()}};
  for (int i = 0; i <= kMaxStopTokenIds; ++i) many["stop_token_ids"].push_back(i);
  SamplingParams p;
  Status s = sampling_params_from_json(many, p);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("at most"), std::string::npos);
}

TEST(SamplingParamsJson, LogprobsAreRangeChecked) {
  expect_refused(R"({"logprobs": 4294967296})", "logprobs");  // was 0
  expect_refused(R"({"logprobs": -1})", "non-negative");
  expect_refused(R"({"logprobs": true, "top_logprobs": -5})", "top_logprobs");  // was ignored
  expect_refused(R"({"top_logprobs": -5})", "top_logprobs");                    // without logprobs
  expect_refused(R"({"top_logprobs": 3})", "'logprobs': true");
  expect_refused(R"({"logprobs": false, "top_logprobs": 3})", "'logprobs': true");
  expect_refused(R"({"logprobs": true, "top_logprobs": 4294967296})", "top_logprobs");
  SamplingParams p;
  ASSERT_TRUE(read(R"({"logprobs": true, "top_logprobs": 3})", &p).ok());
  EXPECT_EQ(p.logprobs, 3);
  ASSERT_TRUE(read(R"({"logprobs": true})", &p).ok());
  EXPECT_EQ(p.logprobs, 0);
  ASSERT_TRUE(read(R"({"top_logprobs": 0})", &p).ok());
  EXPECT_EQ(p.logprobs, -1);
  ASSERT_TRUE(read(R"({"logprobs": 5})", &p).ok());
  EXPECT_EQ(p.logprobs, 5);
}

TEST(SamplingParamsJson, CountsOutsideTheirTypeAreRefusedWithTheRealValue) {
  expect_refused(R"({"n": 4294967297})", "4294967297");  // would wrap to 1
  expect_refused(R"({"n": 18446744073709551615})", "18446744073709551615");
  expect_refused(R"({"max_tokens": 18446744073709551615})", "max_tokens");
  expect_refused(R"({"min_tokens": 4294967296})", "min_tokens");
  expect_refused(R"({"top_k": -4294967296})", "top_k");
}

TEST(SamplingParamsJson, SeedIsASigned64BitInteger) {
  expect_refused(R"({"seed": 18446744073709551615})", "seed");
  expect_refused(R"({"seed": 1.5})", "seed");
  SamplingParams p;
  ASSERT_TRUE(read(R"({"seed": -7})", &p).ok());
  ASSERT_TRUE(p.seed.has_value());
  ASSERT_TRUE(read(R"({"seed": 9223372036854775807})", &p).ok());
}

// vLLM's prompt_logprobs: a non-negative integer; max_tokens 0 is read (validate_sampling_params allows it
// only with prompt_logprobs).
TEST(SamplingParamsJson, PromptLogprobsAndMaxTokensZero) {
  SamplingParams p;
  ASSERT_TRUE(read(R"({"prompt_logprobs": 3, "max_tokens": 0})", &p).ok());
  EXPECT_EQ(p.prompt_logprobs, 3);
  EXPECT_EQ(p.max_tokens, 0);
  EXPECT_TRUE(validate_sampling_params(p, 100).ok());
  ASSERT_TRUE(read(R"({"prompt_logprobs": null})", &p).ok());
  EXPECT_EQ(p.prompt_logprobs, -1);
  expect_refused(R"({"prompt_logprobs": -1})", "'prompt_logprobs' must be a non-negative integer");
  expect_refused(R"({"prompt_logprobs": "2"})", "prompt_logprobs");
  expect_refused(R"({"prompt_logprobs": 4294967296})", "prompt_logprobs");
  expect_refused(R"({"max_tokens": -1})", "max_tokens");
  ASSERT_TRUE(read(R"({"max_tokens": 0})", &p).ok());
  EXPECT_FALSE(validate_sampling_params(p, 100).ok()) << "max_tokens 0 without prompt_logprobs";
}

// prompt_logprobs 20 over a long prompt, or logprobs over many choices, made answers of hundreds of MB;
// a request is bounded by tokens x (top logprobs + 1) over its prompts and choices.
TEST(LogprobBudget, RequestsPastTheLimitAreRefusedNamingTheFieldAndLimit) {
  SamplingParams scoring;
  scoring.max_tokens = 0;
  scoring.prompt_logprobs = 20;
  std::string param;
  // 40,960 prompt tokens x 21 = 860,160 entries: a full-context scoring request fits.
  EXPECT_TRUE(check_logprob_budget({40960}, {scoring}, kMaxLogprobEntries, &param).ok());
  Status s = check_logprob_budget({40960, 40960}, {scoring, scoring}, kMaxLogprobEntries, &param);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(param, "prompt_logprobs");
  EXPECT_NE(s.message().find("more than the 1048576 one response may hold"), std::string::npos) << s.message();

  SamplingParams sampled;
  sampled.n = 16;
  sampled.max_tokens = 4096;
  sampled.logprobs = 20;  // 16 x 4,096 x 21 = 1,376,256
  param.clear();
  s = check_logprob_budget({10}, {sampled}, kMaxLogprobEntries, &param);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(param, "logprobs");
  EXPECT_NE(s.message().find("fewer top logprobs"), std::string::npos) << s.message();
  sampled.logprobs = -1;  // no logprobs asked: nothing to bound
  EXPECT_TRUE(check_logprob_budget({10}, {sampled}, kMaxLogprobEntries, &param).ok());
  // Huge values do not overflow the count.
  sampled.logprobs = 20;
  sampled.max_tokens = INT32_MAX;
  EXPECT_FALSE(check_logprob_budget({size_t{1} << 40}, {sampled}, kMaxLogprobEntries, &param).ok());
}

TEST(SamplingParamsJson, StopStringAndSpecialTokenSwitchesAreRead) {
  SamplingParams p;
  ASSERT_TRUE(read(R"({"include_stop_str_in_output": true, "skip_special_tokens": false})", &p).ok());
  EXPECT_TRUE(p.include_stop_str_in_output);
  EXPECT_FALSE(p.skip_special_tokens);
  ASSERT_TRUE(read(R"({})", &p).ok());
  EXPECT_FALSE(p.include_stop_str_in_output);
  EXPECT_TRUE(p.skip_special_tokens);
  expect_refused(R"({"include_stop_str_in_output": "yes"})", "'include_stop_str_in_output' must be a boolean");
  expect_refused(R"({"skip_special_tokens": 1})", "'skip_special_tokens' must be a boolean");
}

}  // namespace
}  // namespace tessera::server
