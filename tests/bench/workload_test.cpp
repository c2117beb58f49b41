#include "bench/workload.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "bench/openai_protocol.h"
#include "core/error.h"

namespace tessera::bench {
namespace {

size_t word_count(const std::string& text) {
  std::istringstream in(text);
  size_t n = 0;
  for (std::string w; in >> w;) ++n;
  return n;
}

TEST(Workload, RandomLengthsStayInRangeAndWordsMatchTheLength) {
  auto prompts = random_workload({100, 20, 0.5, 200, 9});
  ASSERT_EQ(prompts.size(), 200u);
  int min_in = 1000, max_in = 0;
  for (const PromptSpec& p : prompts) {
    EXPECT_EQ(word_count(p.prompt), static_cast<size_t>(p.expected_prompt_tokens));
    EXPECT_GE(p.expected_prompt_tokens, 50);
    EXPECT_LE(p.expected_prompt_tokens, 150);
    EXPECT_GE(p.max_tokens, 10);
    EXPECT_LE(p.max_tokens, 30);
    min_in = std::min(min_in, p.expected_prompt_tokens);
    max_in = std::max(max_in, p.expected_prompt_tokens);
  }
  EXPECT_LT(min_in, 60);  // the range is actually used
  EXPECT_GT(max_in, 140);
  auto fixed = random_workload({64, 8, 0.0, 3, 1});
  for (const PromptSpec& p : fixed) EXPECT_EQ(word_count(p.prompt), 64u);
}

TEST(Workload, RandomPrefixIsSharedAndCountedInTheLength) {
  RandomWorkloadOptions o{16, 4, 0.0, 5, 3};
  o.prefix_len = 40;
  auto prompts = random_workload(o);
  ASSERT_EQ(prompts.size(), 5u);
  for (const PromptSpec& p : prompts) {
    EXPECT_EQ(word_count(p.prompt), 56u);
    EXPECT_EQ(p.expected_prompt_tokens, 56);
    std::istringstream a(prompts[0].prompt), b(p.prompt);
    std::string wa, wb;
    for (int i = 0; i < 40; ++i) {  // the first 40 words are the same in every prompt
      a >> wa;
      b >> wb;
      EXPECT_EQ(wa, wb) << "word " << i;
    }
  }
  EXPECT_NE(prompts[0].prompt, prompts[1].prompt);  // the tails differ
  o.prefix_len = -1;
  EXPECT_THROW(random_workload(o), Error);
}

TEST(Workload, JsonlPromptsShareGptAndLimits) {
  std::string path = ::testing::TempDir() + "/bench_workload_test.jsonl";
  {
    std::ofstream out(path);
    out << R"({"prompt": "first", "max_tokens": 5})"
        << "\n\n";
    out << R"({"text": "second"})"
        << "\n";
    out << R"({"conversations": [{"from": "human", "value": "third"}, {"from": "gpt", "value": "0123456789abcdef"}]})"
        << "\n";
    out << R"({"unrelated": 1})"
        << "\n";
  }
  auto prompts = jsonl_workload(path, 64, 0);
  ASSERT_EQ(prompts.size(), 3u);
  EXPECT_EQ(prompts[0].prompt, "first");
  EXPECT_EQ(prompts[0].max_tokens, 5);
  EXPECT_EQ(prompts[1].max_tokens, 64);
  EXPECT_EQ(prompts[2].prompt, "third");
  EXPECT_EQ(prompts[2].max_tokens, 4);  // 16 characters of answer ~ 4 tokens
  EXPECT_EQ(jsonl_workload(path, 64, 2).size(), 2u);
  std::remove(path.c_str());
  EXPECT_THROW(jsonl_workload(path, 64, 0), Error);
}

TEST(OpenAiProtocol, ParsesChunksUsageErrorsAndDone) {
  auto chat = parse_stream_message(R"({"choices":[{"delta":{"content":"hi"}}]})", ApiEndpoint::kChatCompletions);
  EXPECT_TRUE(chat.has_text);
  EXPECT_EQ(chat.text, "hi");
  auto role = parse_stream_message(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})",
                                   ApiEndpoint::kChatCompletions);
  EXPECT_FALSE(role.has_text);
  auto reasoning =
      parse_stream_message(R"({"choices":[{"delta":{"reasoning_content":"hmm"}}]})", ApiEndpoint::kChatCompletions);
  EXPECT_TRUE(reasoning.has_text);
  auto text = parse_stream_message(R"({"choices":[{"text":"x","finish_reason":"length"}]})", ApiEndpoint::kCompletions);
  EXPECT_TRUE(text.has_text);
  EXPECT_TRUE(text.has_finish_reason);
  auto usage = parse_stream_message(R"({"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":9}})",
                                    ApiEndpoint::kChatCompletions);
  ASSERT_TRUE(usage.usage);
  EXPECT_EQ(usage.usage->completion_tokens, 9);
  EXPECT_TRUE(parse_stream_message(" [DONE]", ApiEndpoint::kChatCompletions).is_done_marker);
  EXPECT_TRUE(parse_stream_message("{broken", ApiEndpoint::kChatCompletions).error);
  auto error = parse_stream_message(R"({"error":{"message":"overloaded"}})", ApiEndpoint::kChatCompletions);
  ASSERT_TRUE(error.error);
  EXPECT_EQ(*error.error, "overloaded");
  EXPECT_EQ(error_body_summary(R"({"detail":"Not Found"})"), "Not Found");
}

TEST(OpenAiProtocol, RequestBodiesCarryTheParameters) {
  PromptSpec prompt{"hello", 12, 2};
  auto chat = nlohmann::json::parse(
      build_request_body(ApiEndpoint::kChatCompletions, prompt, GenerationParams{"m", 0.0, true, true}));
  EXPECT_EQ(chat["messages"][0]["content"], "hello");
  EXPECT_EQ(chat["max_tokens"], 12);
  EXPECT_EQ(chat["stream_options"]["include_usage"], true);
  EXPECT_EQ(chat["ignore_eos"], true);
  auto completion =
      nlohmann::json::parse(build_request_body(ApiEndpoint::kCompletions, prompt, GenerationParams{"m", 0.5, false}));
  EXPECT_EQ(completion["prompt"], "hello");
  EXPECT_FALSE(completion.contains("stream_options"));
  EXPECT_THROW(parse_endpoint("/v1/embeddings"), Error);
  // --extra-body: its members join (and may override) every request's.
  auto extra = nlohmann::json::parse(
      build_request_body(ApiEndpoint::kChatCompletions, prompt,
                         GenerationParams{"m", 0.0, true, false, R"({"guided_regex": "[0-9]+", "max_tokens": 3})"}));
  EXPECT_EQ(extra["guided_regex"], "[0-9]+");
  EXPECT_EQ(extra["max_tokens"], 3);
  EXPECT_THROW(build_request_body(ApiEndpoint::kCompletions, prompt, GenerationParams{"m", 0.0, true, false, "[1]"}),
               Error);
  EXPECT_THROW(build_request_body(ApiEndpoint::kCompletions, prompt, GenerationParams{"m", 0.0, true, false, "{x"}),
               Error);
}

}  // namespace
}  // namespace tessera::bench
