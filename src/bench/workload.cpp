#include "bench/workload.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>

#include "bench/token_counter.h"
#include "core/error.h"

namespace tessera::bench {
namespace {

// Short, frequent English words: each is a single token (with its leading space) in the GPT-2,
// Llama 3 and Qwen vocabularies, which makes word count a good proxy for token count.
constexpr const char* kOneTokenWords[] = {
    "the",   "of",     "and",    "to",    "in",     "is",     "that",  "for",   "it",    "as",    "was",   "with",
    "be",    "by",     "on",     "not",   "he",     "this",   "are",   "or",    "his",   "from",  "at",    "which",
    "but",   "have",   "an",     "had",   "they",   "you",    "were",  "their", "one",   "all",   "we",    "can",
    "her",   "has",    "there",  "been",  "if",     "more",   "when",  "will",  "would", "who",   "so",    "no",
    "time",  "people", "water",  "world", "house",  "light",  "music", "river", "city",  "story", "paper", "money",
    "night", "system", "number", "power", "market", "school", "point", "group", "state", "place"};
constexpr size_t kWordCount = sizeof(kOneTokenWords) / sizeof(kOneTokenWords[0]);

int draw_length(std::mt19937_64& rng, int length, double range_ratio) {
  int low = std::max(1, static_cast<int>(length * (1.0 - range_ratio)));
  int high = std::max(low, static_cast<int>(length * (1.0 + range_ratio)));
  return std::uniform_int_distribution<int>(low, high)(rng);
}

std::string string_field(const nlohmann::json& object, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    auto it = object.find(name);
    if (it != object.end() && it->is_string()) return it->get<std::string>();
  }
  return {};
}

int count_tokens(const std::string& text, const TokenCounter* counter) {
  return counter ? counter->count(text) : estimate_tokens(text);
}

bool parse_entry(const nlohmann::json& entry, int default_max_tokens, const TokenCounter* counter, PromptSpec& out) {
  if (!entry.is_object()) return false;
  out = PromptSpec{};
  out.max_tokens = default_max_tokens;
  out.prompt = string_field(entry, {"prompt", "text", "input"});
  auto conversations = entry.find("conversations");
  if (out.prompt.empty() && conversations != entry.end() && conversations->is_array()) {
    bool have_prompt = false;
    for (const auto& turn : *conversations) {
      if (!turn.is_object()) continue;
      std::string who = string_field(turn, {"from", "role"});
      std::string value = string_field(turn, {"value", "content"});
      bool human = who == "human" || who == "user";
      if (!have_prompt && human) {
        out.prompt = value;
        have_prompt = true;
      } else if (have_prompt && !human) {
        out.max_tokens = std::max(1, count_tokens(value, counter));
        break;
      }
    }
  }
  for (const char* name : {"max_tokens", "output_len"}) {
    auto it = entry.find(name);
    if (it != entry.end() && it->is_number_integer()) out.max_tokens = std::max(1, it->get<int>());
  }
  if (out.prompt.empty()) return false;
  out.expected_prompt_tokens = count_tokens(out.prompt, counter);
  return true;
}

}  // namespace

int estimate_tokens(const std::string& text) { return static_cast<int>((text.size() + 3) / 4); }

std::vector<PromptSpec> fixed_prompt_workload(const std::string& prompt, int max_tokens, size_t count,
                                              const TokenCounter* counter) {
  PromptSpec spec{prompt, max_tokens, count_tokens(prompt, counter)};
  return std::vector<PromptSpec>(count, spec);
}

std::string random_text(std::mt19937_64& rng, int len, const TokenCounter* counter) {
  std::uniform_int_distribution<size_t> word(0, kWordCount - 1);
  // A few spare words in case some merge or split differently under the real tokenizer.
  const int words = counter ? len + len / 4 + 8 : len;
  std::string text;
  text.reserve(static_cast<size_t>(words) * 6);
  for (int w = 0; w < words; ++w) {
    if (w) text.push_back(' ');
    text += kOneTokenWords[word(rng)];
  }
  return counter ? counter->truncate(text, len) : text;
}

std::vector<PromptSpec> random_workload(const RandomWorkloadOptions& options, const TokenCounter* counter) {
  if (options.input_len < 1 || options.output_len < 1)
    fail(ErrorKind::kInvalidArgument, "--random-input-len and --random-output-len must be at least 1");
  if (options.prefix_len < 0)
    fail(ErrorKind::kInvalidArgument, "--random-prefix-len must be 0 or more, got {}", options.prefix_len);
  if (options.range_ratio < 0 || options.range_ratio >= 1)
    fail(ErrorKind::kInvalidArgument, "--random-range-ratio must be in [0, 1), got {}", options.range_ratio);
  std::mt19937_64 rng(options.seed);
  const std::string prefix = options.prefix_len > 0 ? random_text(rng, options.prefix_len, counter) + " " : "";
  const int prefix_tokens = options.prefix_len > 0 && counter ? counter->count(prefix) : options.prefix_len;
  std::vector<PromptSpec> prompts;
  prompts.reserve(options.count);
  for (size_t i = 0; i < options.count; ++i) {
    PromptSpec spec;
    const int input_len = draw_length(rng, options.input_len, options.range_ratio);
    spec.max_tokens = draw_length(rng, options.output_len, options.range_ratio);
    spec.prompt = prefix + random_text(rng, input_len, counter);
    spec.expected_prompt_tokens = counter ? counter->count(spec.prompt) : prefix_tokens + input_len;
    prompts.push_back(std::move(spec));
  }
  return prompts;
}

std::vector<PromptSpec> jsonl_workload(const std::string& path, int default_max_tokens, size_t limit,
                                       const TokenCounter* counter) {
  std::ifstream in(path);
  if (!in) fail(ErrorKind::kNotFound, "cannot open dataset file '{}': check the path given to --dataset-path", path);
  std::vector<PromptSpec> prompts;
  auto keep = [&](const nlohmann::json& entry) {
    PromptSpec spec;
    if (parse_entry(entry, default_max_tokens, counter, spec)) prompts.push_back(std::move(spec));
    return limit == 0 || prompts.size() < limit;
  };
  char first = 0;
  in >> std::ws;
  first = static_cast<char>(in.peek());
  if (first == '[') {  // a ShareGPT-style JSON array
    nlohmann::json all = nlohmann::json::parse(in, nullptr, false);
    if (all.is_discarded()) fail(ErrorKind::kCorrupt, "'{}' starts with '[' but is not valid JSON", path);
    for (const auto& entry : all)
      if (!keep(entry)) break;
  } else {
    std::string line;
    size_t line_number = 0;
    while (std::getline(in, line)) {
      ++line_number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json entry = nlohmann::json::parse(line, nullptr, false);
      if (entry.is_discarded())
        fail(ErrorKind::kCorrupt, "{}:{}: not a JSON object; each line of a JSONL dataset must be one", path,
             line_number);
      if (!keep(entry)) break;
    }
  }
  if (prompts.empty())
    fail(ErrorKind::kInvalidArgument,
         "'{}' holds no usable prompt: each entry needs a 'prompt' (or 'text') string or ShareGPT 'conversations'",
         path);
  return prompts;
}

namespace {

// The file's lines with their line ends, as Python's readlines() gives them.
std::vector<std::string> read_poem_lines(const std::string& path) {
  if (path.empty())
    fail(ErrorKind::kInvalidArgument,
         "--dataset-name sonnet needs --dataset-path FILE: a text file of poem lines, e.g. vLLM's "
         "benchmarks/sonnet.txt");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail(ErrorKind::kNotFound,
         "cannot open the sonnet dataset '{}': check --dataset-path (a text file of poem lines, e.g. vLLM's "
         "benchmarks/sonnet.txt)",
         path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size() - 1) + 1;
    lines.push_back(text.substr(at, end - at));
    at = end;
  }
  if (lines.empty()) fail(ErrorKind::kInvalidArgument, "the sonnet dataset '{}' is empty: it needs poem lines", path);
  return lines;
}

void check_sonnet_options(const SonnetWorkloadOptions& o) {
  if (o.input_len < 1 || o.output_len < 1)
    fail(ErrorKind::kInvalidArgument, "--sonnet-input-len and --sonnet-output-len must be at least 1, got {} and {}",
         o.input_len, o.output_len);
  if (o.prefix_len < 0)
    fail(ErrorKind::kInvalidArgument, "--sonnet-prefix-len must be 0 or more, got {}", o.prefix_len);
  if (o.prefix_len > o.input_len)
    fail(ErrorKind::kInvalidArgument,
         "--sonnet-prefix-len ({}) is longer than --sonnet-input-len ({}): the shared prefix is part of the prompt",
         o.prefix_len, o.input_len);
}

// Python's round(): halves go to the even neighbour.
int round_half_even(double v) { return static_cast<int>(std::nearbyint(v)); }

}  // namespace

std::vector<PromptSpec> sonnet_workload(const SonnetWorkloadOptions& o, const TokenCounter* counter) {
  check_sonnet_options(o);
  const std::vector<std::string> lines = read_poem_lines(o.path);
  auto render = [&](const std::string& text) {
    std::optional<std::string> formatted = counter ? counter->chat_prompt(text, o.chat_template_kwargs) : std::nullopt;
    return formatted ? *formatted : text;
  };
  double line_tokens = 0;
  for (const std::string& line : lines) line_tokens += count_tokens(line, counter);
  const double mean_line = std::max(line_tokens / static_cast<double>(lines.size()), 1.0);
  const int instruction = count_tokens(render(kSonnetInstruction), counter);
  if (o.input_len <= instruction)
    fail(ErrorKind::kInvalidArgument,
         "--sonnet-input-len ({}) must be more than the {} tokens of the instruction every sonnet prompt starts with",
         o.input_len, instruction);
  const int input_lines = std::max(round_half_even((o.input_len - instruction) / mean_line), 1);
  const int prefix_lines = std::max(round_half_even((o.prefix_len - instruction) / mean_line), 0);
  std::string prefix = kSonnetInstruction;
  for (int i = 0; i < prefix_lines && i < static_cast<int>(lines.size()); ++i) prefix += lines[static_cast<size_t>(i)];
  const int drawn = std::max(input_lines - prefix_lines, 0);

  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<size_t> pick(0, lines.size() - 1);
  std::vector<PromptSpec> prompts;
  prompts.reserve(o.count);
  constexpr int kMaxRedraws = 1000;  // in a row: the lines cannot fit, where vLLM would loop forever
  for (int redraws = 0; prompts.size() < o.count;) {
    std::string text = prefix;
    for (int i = 0; i < drawn; ++i) text += lines[pick(rng)];
    std::string formatted = render(text);
    const int tokens = count_tokens(formatted, counter);
    if (tokens > o.input_len) {
      if (++redraws > kMaxRedraws)
        fail(ErrorKind::kInvalidArgument,
             "no draw of {} poem lines after the {}-line prefix fits --sonnet-input-len {} (the last was {} tokens): "
             "raise --sonnet-input-len or lower --sonnet-prefix-len",
             drawn, prefix_lines, o.input_len, tokens);
      continue;
    }
    redraws = 0;
    prompts.push_back(PromptSpec{o.send_formatted ? std::move(formatted) : std::move(text), o.output_len, tokens});
  }
  return prompts;
}

std::vector<PromptSpec> prefix_repetition_workload(const PrefixRepetitionOptions& o, const TokenCounter* counter) {
  if (o.prefix_len < 0 || o.suffix_len < 0 || o.prefix_len + o.suffix_len < 1)
    fail(ErrorKind::kInvalidArgument,
         "--prefix-repetition-prefix-len ({}) and --prefix-repetition-suffix-len ({}) must be 0 or more, and not "
         "both 0",
         o.prefix_len, o.suffix_len);
  if (o.num_prefixes < 1 || o.output_len < 1)
    fail(ErrorKind::kInvalidArgument,
         "--prefix-repetition-num-prefixes ({}) and --prefix-repetition-output-len ({}) must be at least 1",
         o.num_prefixes, o.output_len);
  const size_t prefixes = static_cast<size_t>(o.num_prefixes);
  if (o.count < prefixes)
    fail(ErrorKind::kInvalidArgument,
         "--num-prompts ({}) must be at least --prefix-repetition-num-prefixes ({}): every prefix is used by one "
         "prompt or more",
         o.count, o.num_prefixes);
  std::mt19937_64 rng(o.seed);
  std::vector<PromptSpec> prompts;
  prompts.reserve(o.count);
  for (size_t p = 0; p < prefixes; ++p) {
    const std::string prefix = o.prefix_len > 0 ? random_text(rng, o.prefix_len, counter) : "";
    const size_t uses = o.count / prefixes + (p < o.count % prefixes ? 1 : 0);
    for (size_t u = 0; u < uses; ++u) {
      const std::string suffix = o.suffix_len > 0 ? random_text(rng, o.suffix_len, counter) : "";
      PromptSpec spec;
      spec.prompt = prefix.empty() || suffix.empty() ? prefix + suffix : prefix + " " + suffix;
      spec.max_tokens = o.output_len;
      spec.expected_prompt_tokens = counter ? counter->count(spec.prompt) : o.prefix_len + o.suffix_len;
      prompts.push_back(std::move(spec));
    }
  }
  if (o.shuffle) std::shuffle(prompts.begin(), prompts.end(), rng);
  return prompts;
}

}  // namespace tessera::bench
