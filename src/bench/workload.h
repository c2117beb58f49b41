// The prompts a run sends: one fixed prompt (the seed protocol), random text of chosen lengths
// (vLLM's --dataset random), prompts read from a JSONL / ShareGPT-style file, poem lines (vLLM's sonnet
// dataset) or random prompts sharing a few prefixes (vLLM's prefix_repetition dataset).
#pragma once
#include <cstddef>
#include <cstdint>
#include <random>
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

// vLLM's sonnet dataset (SonnetDataset): every prompt is the instruction kSonnetInstruction, then the file's
// first lines (the shared prefix, about `prefix_len` tokens with the instruction), then lines drawn at random
// with replacement up to about `input_len` tokens. The line counts come from the mean tokens of a line:
// round((input_len - instruction) / mean) lines in all (at least 1), round((prefix_len - instruction) / mean)
// of them the prefix. A draw whose prompt is longer than `input_len` tokens is drawn again. Lengths are those of
// the prompt as one user message rendered by the chat template of `counter`'s folder (the instruction alone
// gives the instruction's length); without a counter, or without a template, of the text itself (estimated at
// 4 characters a token without a counter). `send_formatted` sends the rendered prompt (vLLM does so on
// /v1/completions), else the text (the chat endpoint renders it). Throws tessera::Error for an unreadable or
// empty file, `prefix_len` > `input_len`, an `input_len` not above the instruction's length, and lines too long
// for any draw to fit.
inline constexpr const char* kSonnetInstruction = "Pick as many lines as you can from these poem lines:\n";
struct SonnetWorkloadOptions {
  std::string path{};
  int input_len = 550;
  int output_len = 150;
  int prefix_len = 200;
  size_t count = 1000;
  uint64_t seed = 0;
  bool send_formatted = false;
  std::string chat_template_kwargs{};  // JSON object for the template, vLLM's --chat-template-kwargs; may be empty
};
std::vector<PromptSpec> sonnet_workload(const SonnetWorkloadOptions& options, const TokenCounter* counter = nullptr);

// vLLM's prefix_repetition dataset (PrefixRepetitionRandomDataset): `num_prefixes` random prefixes of
// `prefix_len` tokens; `count` prompts split among them (count / num_prefixes each, the first count %
// num_prefixes one more), each its prefix then its own random suffix of `suffix_len` tokens; then shuffled
// (unless `shuffle` is false, vLLM's --disable-shuffle). Text as random_workload's (exact lengths with a
// counter). Throws tessera::Error when count < num_prefixes or a length is out of range.
struct PrefixRepetitionOptions {
  int prefix_len = 256;
  int suffix_len = 256;
  int num_prefixes = 10;
  int output_len = 128;
  size_t count = 1000;
  uint64_t seed = 0;
  bool shuffle = true;
};
std::vector<PromptSpec> prefix_repetition_workload(const PrefixRepetitionOptions& options,
                                                   const TokenCounter* counter = nullptr);

// `len` tokens of random common one-token words drawn from `rng`: exactly `len` tokens under `counter`'s
// tokenizer, about `len` without one (random_workload's text).
std::string random_text(std::mt19937_64& rng, int len, const TokenCounter* counter);

// Rough token count of English text (about 4 characters a token), for missing usage.
int estimate_tokens(const std::string& text);

}  // namespace tessera::bench
