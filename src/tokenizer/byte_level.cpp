#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace tessera::tokenizer {

ByteLevelAlphabet::ByteLevelAlphabet() {
  byte_for_code_point_.fill(-1);
  // Printable Latin-1 bytes stand for themselves; the others are shifted to U+0100 and up,
  // in byte order (GPT-2's bytes_to_unicode).
  uint32_t next_shifted = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uint32_t cp = printable ? static_cast<uint32_t>(b) : next_shifted++;
    append_code_point(cp, byte_chars_[b]);
    byte_for_code_point_[cp] = static_cast<int16_t>(b);
  }
}

const ByteLevelAlphabet& ByteLevelAlphabet::get() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

std::optional<std::string> ByteLevelAlphabet::to_bytes(std::string_view text) const {
  std::string bytes;
  bytes.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    if (valid_sequence_length(text, i) == 0) return std::nullopt;
    uint32_t cp = decode_code_point(text, i);
    if (cp >= byte_for_code_point_.size() || byte_for_code_point_[cp] < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(byte_for_code_point_[cp]));
  }
  return bytes;
}

std::string ByteLevelAlphabet::from_bytes(std::string_view bytes) const {
  std::string text;
  text.reserve(bytes.size() * 2);
  for (char c : bytes) text.append(byte_chars_[static_cast<uint8_t>(c)]);
  return text;
}

}  // namespace tessera::tokenizer
