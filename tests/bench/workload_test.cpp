#include "bench/workload.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
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

// Fourteen lines of Shakespeare's first sonnet: the shape of vLLM's benchmarks/sonnet.txt.
std::string write_sonnet_file(const std::string& name) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream out(path);
  out << "From fairest creatures we desire increase,\n"
         "That thereby beauty's rose might never die,\n"
         "But as the riper should by time decease,\n"
         "His tender heir might bear his memory:\n"
         "But thou, contracted to thine own bright eyes,\n"
         "Feed'st thy light's flame with self-substantial fuel,\n"
         "Making a famine where abundance lies,\n"
         "Thyself thy foe, to thy sweet self too cruel.\n"
         "Thou that art now the world's fresh ornament\n"
         "And only herald to the gaudy spring,\n"
         "Within thine own bud buriest thy content\n"
         "And, tender churl, makest waste in niggarding.\n"
         "Pity the world, or else this glutton be,\n"
         "To eat the world's due, by the grave and thee.\n";
  return path;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(Workload, SonnetPromptsShareThePoemsFirstLinesAndStayWithinTheInputLength) {
  SonnetWorkloadOptions o;
  o.path = write_sonnet_file("sonnet_lengths.txt");
  o.input_len = 120;
  o.prefix_len = 50;
  o.output_len = 9;
  o.count = 40;
  o.seed = 5;
  const std::vector<PromptSpec> prompts = sonnet_workload(o);
  ASSERT_EQ(prompts.size(), 40u);
  std::ifstream file(o.path);
  const std::vector<std::string> poem =
      lines_of(std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>()));
  // Estimates (4 characters a token): the instruction is 14 tokens, a line 11.4 on average, so
  // round((50 - 14) / 11.4) = 3 shared lines and round((120 - 14) / 11.4) = 9 lines in all.
  std::set<std::string> tails;
  for (const PromptSpec& p : prompts) {
    EXPECT_EQ(p.max_tokens, 9);
    EXPECT_LE(p.expected_prompt_tokens, 120);
    EXPECT_EQ(p.expected_prompt_tokens, estimate_tokens(p.prompt));
    const std::vector<std::string> lines = lines_of(p.prompt);
    ASSERT_EQ(lines.size(), 10u) << p.prompt;  // the instruction, 3 shared lines, 6 drawn ones
    EXPECT_EQ(lines[0] + "\n", kSonnetInstruction);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(lines[i + 1], poem[i]);
    for (size_t i = 4; i < lines.size(); ++i)
      EXPECT_NE(std::find(poem.begin(), poem.end(), lines[i]), poem.end()) << lines[i];
    tails.insert(p.prompt.substr(p.prompt.find(poem[2]) + poem[2].size()));
  }
  EXPECT_GT(tails.size(), 30u);                                // the drawn lines differ from prompt to prompt
  EXPECT_EQ(sonnet_workload(o)[7].prompt, prompts[7].prompt);  // the seed fixes the draw
  o.prefix_len = 0;                                            // no shared poem lines, only the instruction
  for (const PromptSpec& p : sonnet_workload(o)) EXPECT_EQ(lines_of(p.prompt).size(), 10u);
}

TEST(Workload, SonnetRefusesWhatCannotWork) {
  SonnetWorkloadOptions o;
  o.path = write_sonnet_file("sonnet_errors.txt");
  o.count = 3;
  o.prefix_len = 600;  // longer than input_len 550
  EXPECT_THROW(sonnet_workload(o), Error);
  o.prefix_len = 200;
  o.input_len = 14;  // not above the instruction's 14 estimated tokens
  EXPECT_THROW(sonnet_workload(o), Error);
  o.input_len = 550;
  o.path = ::testing::TempDir() + "/no_such_sonnet.txt";
  try {
    sonnet_workload(o);
    ADD_FAILURE() << "a missing file must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--dataset-path"), std::string::npos) << e.what();
  }
  o.path = "";
  EXPECT_THROW(sonnet_workload(o), Error);
}

TEST(Workload, PrefixRepetitionSplitsThePromptsAmongSharedPrefixes) {
  PrefixRepetitionOptions o;
  o.prefix_len = 12;
  o.suffix_len = 5;
  o.num_prefixes = 5;
  o.output_len = 7;
  o.count = 23;
  o.seed = 11;
  o.shuffle = false;
  const std::vector<PromptSpec> grouped = prefix_repetition_workload(o);
  ASSERT_EQ(grouped.size(), 23u);
  auto prefix_of = [](const std::string& prompt) {
    std::istringstream in(prompt);
    std::string out, w;
    for (int i = 0; i < 12 && in >> w; ++i) out += w + " ";
    return out;
  };
  std::vector<std::string> order;
  std::map<std::string, int> uses;
  for (const PromptSpec& p : grouped) {
    EXPECT_EQ(word_count(p.prompt), 17u);
    EXPECT_EQ(p.expected_prompt_tokens, 17);
    EXPECT_EQ(p.max_tokens, 7);
    const std::string prefix = prefix_of(p.prompt);
    if (order.empty() || order.back() != prefix) order.push_back(prefix);
    ++uses[prefix];
  }
  ASSERT_EQ(order.size(), 5u);  // unshuffled: the prompts of each prefix come together
  EXPECT_EQ(uses.size(), 5u);
  const int expected_uses[] = {5, 5, 5, 4, 4};  // 23 = 5 * 4 + 3: the first three prefixes get one more
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(uses[order[i]], expected_uses[i]) << i;
  o.shuffle = true;
  const std::vector<PromptSpec> shuffled = prefix_repetition_workload(o);
  std::multiset<std::string> a, b;
  for (const PromptSpec& p : grouped) a.insert(p.prompt);
  for (const PromptSpec& p : shuffled) b.insert(p.prompt);
  EXPECT_EQ(a, b);  // the same prompts in another order
  std::vector<std::string> shuffled_order;
  for (const PromptSpec& p : shuffled) shuffled_order.push_back(p.prompt);
  std::vector<std::string> grouped_order;
  for (const PromptSpec& p : grouped) grouped_order.push_back(p.prompt);
  EXPECT_NE(shuffled_order, grouped_order);
  o.count = 4;  // fewer prompts than prefixes
  EXPECT_THROW(prefix_repetition_workload(o), Error);
  o.count = 10;
  o.prefix_len = 0;
  o.suffix_len = 0;
  EXPECT_THROW(prefix_repetition_workload(o), Error);
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
