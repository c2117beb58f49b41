#include "bench/token_counter.h"

#include <algorithm>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace tessera::bench {

std::unique_ptr<TokenCounter> TokenCounter::load(const std::string& dir) {
  std::unique_ptr<TokenCounter> counter(new TokenCounter());
  counter->tokenizer_ = tokenizer::Tokenizer::from_dir(dir);
  return counter;
}

TokenCounter::~TokenCounter() = default;

int TokenCounter::count(std::string_view text) const { return static_cast<int>(tokenizer_->encode(text).size()); }

std::string TokenCounter::truncate(std::string_view text, int tokens) const {
  std::vector<int32_t> ids = tokenizer_->encode(text);
  if (static_cast<int>(ids.size()) <= tokens) return std::string(text);
  ids.resize(static_cast<size_t>(std::max(0, tokens)));
  return tokenizer_->decode(ids);
}

}  // namespace tessera::bench
