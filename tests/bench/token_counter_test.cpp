// --tokenizer: exact prompt lengths from a real tokenizer. Skips where this build has no
// tokenizer layer or the test tokenizers were not fetched (scripts/fetch_test_data.sh).
#include "bench/token_counter.h"

#include <gtest/gtest.h>

#include <filesystem>

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

}  // namespace
}  // namespace tessera::bench
