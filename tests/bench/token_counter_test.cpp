// --tokenizer: exact prompt lengths from a real tokenizer. Skips where this build has no
// tokenizer layer or the test tokenizers were not fetched (scripts/fetch_test_data.sh).
#include "bench/token_counter.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "bench/workload.h"
#include "core/error.h"

namespace tessera::bench {
namespace {

std::unique_ptr<TokenCounter> qwen3_counter() {
  std::filesystem::path dir =
      std::filesystem::path(TESSERA_SOURCE_DIR) / ".npm-pkgs" / "tokenizer-qwen3" / "package" / "models";
  if (!std::filesystem::exists(dir / "tokenizer.json")) return nullptr;
  try {
    return TokenCounter::load(dir.string());
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kUnsupported) return nullptr;
    throw;
  }
}

TEST(TokenCounter, RandomPromptsHaveExactlyTheAskedLength) {
  auto counter = qwen3_counter();
  if (!counter) GTEST_SKIP() << "no tokenizer layer or no test tokenizer in .npm-pkgs";
  auto prompts = random_workload({200, 16, 0.25, 20, 3}, counter.get());
  for (const PromptSpec& p : prompts) {
    EXPECT_EQ(counter->count(p.prompt), p.expected_prompt_tokens);
    EXPECT_GE(p.expected_prompt_tokens, 150);
    EXPECT_LE(p.expected_prompt_tokens, 250);
  }
  auto fixed = fixed_prompt_workload("Explain parallel computing in one sentence.", 64, 2, counter.get());
  EXPECT_EQ(fixed[0].expected_prompt_tokens, counter->count("Explain parallel computing in one sentence."));
  EXPECT_EQ(counter->truncate("one two three four", 2), "one two");
}

// The small model in models/tessera-demo: a tokenizer.json and a chat template in tokenizer_config.json.
std::unique_ptr<TokenCounter> demo_counter() {
  try {
    return TokenCounter::load((std::filesystem::path(TESSERA_SOURCE_DIR) / "models" / "tessera-demo").string());
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kUnsupported) return nullptr;
    throw;
  }
}

// vLLM's sonnet lengths are those of the prompt rendered as one user message by the model's chat template;
// /v1/completions gets the rendered prompt, the chat endpoint the text.
TEST(TokenCounter, SonnetCountsThePromptAsTheChatTemplateRendersIt) {
  auto counter = demo_counter();
  if (!counter) GTEST_SKIP() << "no tokenizer layer";
  ASSERT_TRUE(counter->has_chat_template());
  const std::string path = ::testing::TempDir() + "/sonnet_counted.txt";
  {
    std::ofstream out(path);
    // Lines of different lengths, so that some draws fit the input length and some do not.
    const char* lines[] = {"The river runs,\n", "and the city sleeps beneath a sky of quiet stars tonight,\n",
                           "while I,\n", "alone upon the bridge, count every light that trembles on the water,\n"};
    for (int i = 0; i < 20; ++i) out << lines[i % 4];
  }
  SonnetWorkloadOptions o;
  o.path = path;
  o.input_len = 200;
  o.prefix_len = 80;
  o.count = 12;
  const std::vector<PromptSpec> text = sonnet_workload(o, counter.get());
  o.send_formatted = true;
  const std::vector<PromptSpec> rendered = sonnet_workload(o, counter.get());
  ASSERT_EQ(text.size(), 12u);
  for (size_t i = 0; i < text.size(); ++i) {
    const std::string formatted = *counter->chat_prompt(text[i].prompt);
    EXPECT_EQ(text[i].expected_prompt_tokens, counter->count(formatted));
    EXPECT_LE(text[i].expected_prompt_tokens, 200);
    EXPECT_GT(text[i].expected_prompt_tokens, 150);
    EXPECT_EQ(text[i].prompt.rfind(kSonnetInstruction, 0), 0u);
    EXPECT_EQ(rendered[i].prompt, formatted);  // same seed, same draw
    EXPECT_NE(rendered[i].prompt, text[i].prompt);
  }
}

TEST(TokenCounter, PrefixRepetitionPromptsHaveTheAskedLength) {
  auto counter = demo_counter();
  if (!counter) GTEST_SKIP() << "no tokenizer layer";
  PrefixRepetitionOptions o;
  o.prefix_len = 64;
  o.suffix_len = 32;
  o.num_prefixes = 3;
  o.count = 9;
  for (const PromptSpec& p : prefix_repetition_workload(o, counter.get())) {
    EXPECT_EQ(p.expected_prompt_tokens, counter->count(p.prompt));
    EXPECT_NEAR(p.expected_prompt_tokens, 96, 2) << p.prompt;
  }
}

}  // namespace
}  // namespace tessera::bench
