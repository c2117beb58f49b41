// GPT-2 byte-level alphabet: each of the 256 bytes is shown as one printable Unicode character,
// so that byte-level BPE vocabularies are valid strings ("Ġ" is the space byte 0x20).
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::tokenizer {

class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& get();

  // The UTF-8 encoding of the character that stands for byte b.
  std::string_view char_for_byte(uint8_t b) const { return byte_chars_[b]; }
  // Maps a string of byte-level characters back to raw bytes; nullopt when some character is
  // not in the alphabet (the caller then keeps the string as it is, as HF's decoder does).
  std::optional<std::string> to_bytes(std::string_view byte_level_text) const;
  std::string from_bytes(std::string_view bytes) const;

 private:
  ByteLevelAlphabet();
  std::array<std::string, 256> byte_chars_;
  std::array<int16_t, 0x144> byte_for_code_point_;  // the alphabet lies below U+0144; -1 = none
};

}  // namespace tessera::tokenizer
