#include "tokenizer/added_vocabulary.h"

#include <unicode/uchar.h>

#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace tessera::tokenizer {
namespace {

bool is_white_space(uint32_t cp) {  // Unicode White_Space, as Rust's char::is_whitespace
  return (cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// The regex crate's Unicode \w, which HF uses for single_word: Alphabetic, marks, decimal
// digits, connector punctuation and Join_Control.
bool is_word_char(uint32_t cp) {
  auto c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) return true;
  int8_t type = u_charType(c);
  return type == U_NON_SPACING_MARK || type == U_ENCLOSING_MARK || type == U_COMBINING_SPACING_MARK ||
         type == U_DECIMAL_DIGIT_NUMBER || type == U_CONNECTOR_PUNCTUATION;
}

// Start of the code point that ends just before `end`.
size_t previous_char_start(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

uint32_t code_point_before(std::string_view s, size_t end) {
  size_t i = previous_char_start(s, end);
  return decode_code_point(s, i);
}

}  // namespace

void AddedVocabulary::Trie::insert(std::string_view key, int32_t token_index) {
  if (key.empty()) return;
  if (token_at_node.empty()) token_at_node.push_back(-1);  // the root
  int32_t node = 0;
  for (char c : key) {
    uint64_t edge = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
    auto [it, inserted] = children.try_emplace(edge, static_cast<int32_t>(token_at_node.size()));
    if (inserted) token_at_node.push_back(-1);
    node = it->second;
  }
  token_at_node[node] = token_index;
  first_byte[static_cast<uint8_t>(key[0])] = true;
}

std::pair<size_t, int32_t> AddedVocabulary::Trie::longest_match(std::string_view text, size_t pos) const {
  std::pair<size_t, int32_t> best{0, -1};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = children.find((static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]));
    if (it == children.end()) break;
    node = it->second;
    if (token_at_node[node] >= 0) best = {i + 1 - pos, token_at_node[node]};
  }
  return best;
}

void AddedVocabulary::add(const AddedToken& token) {
  if (auto it = index_by_content_.find(token.content); it != index_by_content_.end()) {
    index_by_id_.erase(tokens_[it->second].id);
    tokens_[it->second] = token;
    index_by_id_[token.id] = it->second;
    return;
  }
  index_by_content_.emplace(token.content, tokens_.size());
  index_by_id_[token.id] = tokens_.size();
  tokens_.push_back(token);
}

void AddedVocabulary::build(const Normalizer* normalizer) {
  raw_trie_ = Trie{};
  normalized_trie_ = Trie{};
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& token = tokens_[i];
    if (token.normalized) {
      std::string key = token.content;
      if (normalizer) normalizer->normalize(key);
      normalized_trie_.insert(key, static_cast<int32_t>(i));
    } else {
      raw_trie_.insert(token.content, static_cast<int32_t>(i));
    }
  }
}

void AddedVocabulary::split(std::string_view text, Stage stage, std::vector<TextSegment>& out) const {
  const Trie& trie = stage == Stage::kRaw ? raw_trie_ : normalized_trie_;
  if (trie.children.empty()) {
    if (!text.empty()) out.push_back({text, -1});
    return;
  }
  size_t segment_start = 0;  // end of the last emitted token, including stripped whitespace
  size_t pos = 0;
  while (pos < text.size()) {
    if (!trie.first_byte[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    auto [length, index] = trie.longest_match(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t start = pos;
    size_t stop = pos + length;
    pos = stop;  // the next search starts after the match itself, not after stripped spaces
    if (token.single_word) {
      bool word_before = start > 0 && is_word_char(code_point_before(text, start));
      size_t after = stop;
      bool word_after = stop < text.size() && is_word_char(decode_code_point(text, after));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0 && is_white_space(code_point_before(text, new_start))) {
        new_start = previous_char_start(text, new_start);
      }
      start = std::max(new_start, segment_start);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!is_white_space(decode_code_point(text, next))) break;
        stop = next;
      }
    }
    if (segment_start < start) out.push_back({text.substr(segment_start, start - segment_start), -1});
    out.push_back({text.substr(start, stop - start), token.id});
    segment_start = stop;
  }
  if (segment_start < text.size()) out.push_back({text.substr(segment_start), -1});
}

const AddedToken* AddedVocabulary::find_by_id(int32_t id) const {
  auto it = index_by_id_.find(id);
  return it == index_by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::find_by_content(std::string_view content) const {
  auto it = index_by_content_.find(content);
  return it == index_by_content_.end() ? nullptr : &tokens_[it->second];
}

}  // namespace tessera::tokenizer
