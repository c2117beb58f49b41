// Added tokens (tokenizer.json "added_tokens", plus tokenizer_config.json "added_tokens_decoder"):
// matched in the text before any BPE, leftmost-longest, as HF's AddedVocabulary does. Tokens
// with normalized=false are matched in the raw text, the others in the normalized text.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/string_map.h"

namespace tessera::tokenizer {

class Normalizer;

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;       // also swallow the whitespace before it
  bool rstrip = false;       // also swallow the whitespace after it
  bool single_word = false;  // match only between non-word characters
  bool normalized = false;   // matched after normalization
};

// A slice of the text: either plain text (id < 0) or one added token.
struct TextSegment {
  std::string_view text;
  int32_t id = -1;
};

class AddedVocabulary {
 public:
  // Adds or replaces (by content) a token. Call build() after the last one.
  void add(const AddedToken& token);
  // Builds the matchers; normalized tokens are matched by their normalized content.
  void build(const Normalizer* normalizer);

  enum class Stage { kRaw, kNormalized };
  // Splits `text` around the added tokens of one stage; appends segments to `out`.
  void split(std::string_view text, Stage stage, std::vector<TextSegment>& out) const;

  const AddedToken* find_by_id(int32_t id) const;
  const AddedToken* find_by_content(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // A byte trie; children live in one hash map keyed by (node, byte).
  struct Trie {
    std::unordered_map<uint64_t, int32_t> children;
    std::vector<int32_t> token_at_node;  // index into tokens_, or -1
    bool first_byte[256] = {};
    void insert(std::string_view key, int32_t token_index);
    // Length and token index of the longest key starting at text[pos], or {0, -1}.
    std::pair<size_t, int32_t> longest_match(std::string_view text, size_t pos) const;
  };

  std::vector<AddedToken> tokens_;
  StringMap<size_t> index_by_content_;
  std::unordered_map<int32_t, size_t> index_by_id_;
  Trie raw_trie_, normalized_trie_;
};

}  // namespace tessera::tokenizer
