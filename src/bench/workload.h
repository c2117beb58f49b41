// The prompts a run sends: one fixed prompt (the seed protocol), random text of chosen lengths
// (vLLM's --dataset random), or prompts read from a JSONL / ShareGPT-style file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::bench {

class TokenCounter;

struct PromptSpec {
  std::string prompt;
  int max_tokens = 64;
  // Prompt length in tokens as the workload intended it; 0 when unknown. Used only when the
  // server reports no usage, and then marked as an estimate.
  int expected_prompt_tokens = 0;
};

// With a `counter` (from --tokenizer) prompt lengths are exact counts instead of estimates.
std::vector<PromptSpec> fixed_prompt_workload(const std::string& prompt, int max_tokens, size_t count,
                                              const TokenCounter* counter = nullptr);

struct RandomWorkloadOptions {
  int input_len = 1024;
  int output_len = 128;
  double range_ratio = 0.0;  // lengths drawn uniformly from [len * (1 - r), len * (1 + r)]
  size_t count = 1000;
  uint64_t seed = 0;
  // vLLM's --random-prefix-len: every prompt starts with the same random text of this many
  // tokens (a shared system prompt, for prefix-cache benchmarks), then its own input_len tokens.
  int prefix_len = 0;
};

// Without a tokenizer the prompt is a sequence of common one-token English words, so its
// length in tokens is approximately `input_len` (within a few percent for BPE vocabularies,
// plus the chat template's own tokens). Reports say so. With a `counter` the text is cut to
// exactly `input_len` tokens of that tokenizer (the shared prefix likewise `prefix_len`).
std::vector<PromptSpec> random_workload(const RandomWorkloadOptions& options, const TokenCounter* counter = nullptr);

// One JSON object per line (or a JSON array of objects). Recognised fields, first match wins:
//   prompt | text | input                             the prompt text
//   conversations[] {from|role, value|content}       ShareGPT: first human turn is the prompt,
//                                                     the next assistant turn sets max_tokens
//   max_tokens | output_len                           overrides the output length
// `default_max_tokens` applies where the file gives no output length. A positive `limit`
// keeps only the first `limit` usable entries. Throws tessera::Error naming the file and line.
std::vector<PromptSpec> jsonl_workload(const std::string& path, int default_max_tokens, size_t limit,
                                       const TokenCounter* counter = nullptr);

// Rough token count of English text (about 4 characters a token), for missing usage.
int estimate_tokens(const std::string& text);

}  // namespace tessera::bench
