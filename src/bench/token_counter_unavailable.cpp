// TokenCounter for builds without the tokenizer layer: --tokenizer fails with what to do.
#include "bench/token_counter.h"

#include "core/error.h"

namespace tessera::tokenizer {
class Tokenizer {};
class ChatTemplate {};
}  // namespace tessera::tokenizer

namespace tessera::bench {

std::unique_ptr<TokenCounter> TokenCounter::load(const std::string& dir) {
  fail(ErrorKind::kUnsupported,
       "--tokenizer {}: this build of tessera has no tokenizer layer; rebuild with src/tokenizer, or leave "
       "--tokenizer out (token counts then come from the server's usage)",
       dir);
}

TokenCounter::TokenCounter() = default;
TokenCounter::~TokenCounter() = default;
int TokenCounter::count(std::string_view) const { return 0; }
std::string TokenCounter::truncate(std::string_view text, int) const { return std::string(text); }
std::optional<std::string> TokenCounter::chat_prompt(const std::string&, const std::string&) const {
  return std::nullopt;
}

}  // namespace tessera::bench
