// A compiled PCRE2 regex (JIT, UTF + UCP) with HF tokenizers' Oniguruma semantics where the two
// engines differ, for the Split pre-tokenizer. Immutable after construction; safe to share
// between threads (each thread gets its own match data and JIT stack).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::tokenizer {

class Regex {
 public:
  // Throws tessera::Error (kInvalidArgument) with PCRE2's message when the pattern does not compile.
  explicit Regex(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-overlapping matches, left to right, as [begin, end) byte offsets. `text` must be valid UTF-8.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const;

  // Escapes a literal string so that it matches itself.
  static std::string escape(std::string_view literal);
  // Rewrites Oniguruma-isms into PCRE2 syntax with the same meaning (see regex.cpp).
  static std::string translate_from_oniguruma(std::string_view pattern);

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace tessera::tokenizer
