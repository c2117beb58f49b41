#include "tokenizer/utf8.h"

namespace tessera::tokenizer {
namespace {

// The well-formed byte sequences of Unicode 15, table 3-7: the allowed range of the second
// byte depends on the first (this excludes overlongs, surrogates and code points past U+10FFFF).
struct LeadByteRule {
  int length;
  uint8_t second_low;
  uint8_t second_high;
};

LeadByteRule rule_for(uint8_t lead) {
  if (lead < 0x80) return {1, 0, 0};
  if (lead >= 0xC2 && lead <= 0xDF) return {2, 0x80, 0xBF};
  if (lead == 0xE0) return {3, 0xA0, 0xBF};
  if ((lead >= 0xE1 && lead <= 0xEC) || lead == 0xEE || lead == 0xEF) return {3, 0x80, 0xBF};
  if (lead == 0xED) return {3, 0x80, 0x9F};
  if (lead == 0xF0) return {4, 0x90, 0xBF};
  if (lead >= 0xF1 && lead <= 0xF3) return {4, 0x80, 0xBF};
  if (lead == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};  // 0x80..0xC1, 0xF5..0xFF never start a sequence
}

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Number of bytes at s[i] that form a valid prefix of a well-formed sequence (>= 1 when the lead
// byte is valid), and the full length that sequence needs.
size_t valid_prefix_length(std::string_view s, size_t i, int* needed) {
  const auto lead = static_cast<uint8_t>(s[i]);
  LeadByteRule rule = rule_for(lead);
  *needed = rule.length;
  if (rule.length == 0) return 0;
  if (rule.length == 1) return 1;
  size_t n = 1;
  if (i + 1 >= s.size()) return n;
  const auto second = static_cast<uint8_t>(s[i + 1]);
  if (second < rule.second_low || second > rule.second_high) return n;
  n = 2;
  for (int k = 2; k < rule.length; ++k) {
    if (i + k >= s.size() || !is_continuation(static_cast<uint8_t>(s[i + k]))) return n;
    ++n;
  }
  return n;
}

}  // namespace

size_t valid_sequence_length(std::string_view s, size_t i) {
  int needed = 0;
  size_t n = valid_prefix_length(s, i, &needed);
  return needed > 0 && n == static_cast<size_t>(needed) ? n : 0;
}

size_t maximal_subpart_length(std::string_view s, size_t i) {
  int needed = 0;
  size_t n = valid_prefix_length(s, i, &needed);
  return n == 0 ? 1 : n;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = valid_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

void append_utf8_lossy(std::string_view s, std::string& out) {
  size_t i = 0;
  size_t clean_start = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = valid_sequence_length(s, i);
    if (n > 0) {
      i += n;
      continue;
    }
    out.append(s.substr(clean_start, i - clean_start));
    out.append(kReplacementCharacter);
    i += maximal_subpart_length(s, i);
    clean_start = i;
  }
  out.append(s.substr(clean_start));
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  append_utf8_lossy(s, out);
  return out;
}

size_t decidable_prefix_length(std::string_view s) {
  // O(n); the streaming decoder keeps its pending buffer to the few bytes not yet decided.
  size_t i = 0;
  while (i < s.size()) {
    int needed = 0;
    size_t n = valid_prefix_length(s, i, &needed);
    if (n == 0) {
      ++i;  // a byte that never starts a sequence: decided (it becomes U+FFFD)
      continue;
    }
    if (n == static_cast<size_t>(needed)) {
      i += n;
      continue;
    }
    // An incomplete valid prefix: undecided only if it runs to the end of the buffer.
    if (i + n == s.size()) return i;
    i += n;  // cut short by a bad byte: decided (one U+FFFD)
  }
  return s.size();
}

uint32_t decode_code_point(std::string_view s, size_t& i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  int length = rule_for(b0).length;
  uint32_t cp = b0 & (0xFF >> (length + 1));
  for (int k = 1; k < length; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += length;
  return cp;
}

void append_code_point(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace tessera::tokenizer
