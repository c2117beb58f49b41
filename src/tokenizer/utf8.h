// UTF-8 helpers shared by the tokenizer and the streaming detokenizer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::tokenizer {

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 when the bytes there do not
// start one (a stray continuation byte, an overlong form, a surrogate, a truncated sequence).
size_t valid_sequence_length(std::string_view s, size_t i);

// Length of the "maximal subpart" of an ill-formed sequence at s[i]: the bytes that one U+FFFD
// replaces, as Rust's String::from_utf8_lossy and the Unicode standard's recommended practice do.
size_t maximal_subpart_length(std::string_view s, size_t i);

bool is_valid_utf8(std::string_view s);

// Appends `s` to `out`, each maximal ill-formed subpart replaced by U+FFFD (from_utf8_lossy).
void append_utf8_lossy(std::string_view s, std::string& out);
std::string utf8_lossy(std::string_view s);

// Length of the longest prefix of `s` that a streaming decoder may emit now: whole valid
// characters and ill-formed subparts that no later byte can complete. The rest is a proper
// prefix of a valid sequence that may still be completed by bytes yet to come.
size_t decidable_prefix_length(std::string_view s);

// Decodes the code point at s[i] (which must start a valid sequence) and advances i.
uint32_t decode_code_point(std::string_view s, size_t& i);
void append_code_point(uint32_t cp, std::string& out);

}  // namespace tessera::tokenizer
