// UTF-8 helpers: Python strings index, slice and strip by code point, our strings are UTF-8 bytes.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::tokenizer::jinja {

std::u32string utf8_decode(std::string_view text);  // invalid bytes decode to U+FFFD
std::string utf8_encode(std::u32string_view text);
void utf8_append(std::string& out, char32_t code_point);
size_t utf8_length(std::string_view text);  // in code points
bool is_python_space(char32_t c);           // str.isspace()
// Simple case mapping for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (what chat text needs);
// other characters are returned unchanged.
char32_t to_lower(char32_t c);
char32_t to_upper(char32_t c);
bool is_letter(char32_t c);  // has a case in the ranges above, or is any other non-ASCII letter-like code point

}  // namespace tessera::tokenizer::jinja
