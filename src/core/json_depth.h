// How deeply JSON text nests arrays and objects, found in one pass over the bytes without
// recursion and without building anything. The server checks request bodies (and JSON carried
// inside them as strings, such as tool-call arguments) with it before parsing, so that no later
// recursive walk over the parsed value (copies, conversions, dumps) can exhaust a thread's stack.
#pragma once
#include <exception>
#include <string>
#include <string_view>

namespace tessera {

// The deepest nesting accepted in a request (far above any real request: OpenAI's and vLLM's
// clients send at most a few tens of levels, JSON Schemas included).
inline constexpr int kMaxJsonDepth = 128;

// The nesting depth of `text` (0 for a scalar, 1 for [] or {}), counting only brackets outside
// strings. Stops scanning and returns limit + 1 as soon as the depth passes `limit`. For invalid
// JSON the result is an upper bound of what a parser would build before it fails.
int json_nesting_depth(std::string_view text, int limit = kMaxJsonDepth);

// For the loaders of model files (config.json, generation_config.json, tokenizer.json,
// tokenizer_config.json, safetensors headers and indexes): throws Error(kCorrupt) naming `origin`
// when `text` nests deeper than `limit`, before it is parsed. Real model files nest a few levels;
// one nested 100,000 deep would overflow the stack of whatever walks it after parsing.
void check_json_file_depth(std::string_view text, const std::string& origin, int limit = kMaxJsonDepth);

// A JSON library error in our words: nlohmann's message without its "[json.exception.type_error.302] "
// prefix, for loader messages that name the file and field themselves.
std::string json_error_text(const std::exception& e);

// Follows string literals (with their escapes) through JSON text fed one byte at a time.
class JsonStringTracker {
 public:
  // True when `c` is structural: outside every string and not a quote that opens one.
  bool structural(char c) {
    if (in_string_) {
      if (escaped_)
        escaped_ = false;
      else if (c == '\\')
        escaped_ = true;
      else if (c == '"')
        in_string_ = false;
      return false;
    }
    if (c == '"') {
      in_string_ = true;
      return false;
    }
    return true;
  }

 private:
  bool in_string_ = false, escaped_ = false;
};

}  // namespace tessera
