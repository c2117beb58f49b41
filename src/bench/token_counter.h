// Exact token counts from a model's own tokenizer (`--tokenizer DIR`), for servers that send no
// `usage` and for random prompts of an exact length. Built only when the tokenizer layer is.
#pragma once
#include <memory>
#include <string>
#include <string_view>

namespace tessera::tokenizer {
class Tokenizer;
}

namespace tessera::bench {

class TokenCounter {
 public:
  // Loads DIR/tokenizer.json (HF format). Throws tessera::Error when the file is unusable or
  // this build has no tokenizer layer.
  static std::unique_ptr<TokenCounter> load(const std::string& dir);
  ~TokenCounter();

  int count(std::string_view text) const;
  // The text of the first `tokens` tokens of `text` (all of it when shorter).
  std::string truncate(std::string_view text, int tokens) const;

 private:
  TokenCounter() = default;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
};

}  // namespace tessera::bench
