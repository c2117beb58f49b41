#include "server/parsers/stream_text.h"

#include <utility>

#include "tokenizer/utf8.h"

namespace tessera::server {

TagScanner::TagScanner(std::vector<std::string> tags) : tags_(std::move(tags)) {
  for (const std::string& t : tags_)
    if (!t.empty()) first_bytes_[static_cast<unsigned char>(t[0])] = true;
}

bool TagScanner::is_tag_prefix(std::string_view s, int* exact) const {
  bool prefix = false;
  *exact = -1;
  for (size_t i = 0; i < tags_.size(); ++i) {
    const std::string& t = tags_[i];
    if (t.size() >= s.size() && std::string_view(t).substr(0, s.size()) == s) {
      prefix = true;
      if (t.size() == s.size()) *exact = static_cast<int>(i);
    }
  }
  return prefix;
}

void TagScanner::feed(char c, std::vector<ScanEvent>& out) {
  if (pending_.empty() && !first_bytes_[static_cast<unsigned char>(c)]) {
    out.push_back({-1, c});
    return;
  }
  pending_.push_back(c);
  // Drop bytes from the front until what is held could still start a tag. Each byte is
  // dropped once, and each check looks at no more than the longest tag.
  size_t start = 0;
  while (start < pending_.size()) {
    int exact = -1;
    std::string_view rest = std::string_view(pending_).substr(start);
    if (is_tag_prefix(rest, &exact)) {
      if (exact >= 0) {
        out.push_back({exact, 0});
        start = pending_.size();
      }
      break;
    }
    out.push_back({-1, pending_[start]});
    ++start;
  }
  pending_.erase(0, start);
}

std::string TagScanner::take_pending() { return std::exchange(pending_, std::string()); }

std::string Utf8Holdback::take() {
  size_t decided = tokenizer::decidable_prefix_length(buffer_);
  std::string out = buffer_.substr(0, decided);
  buffer_.erase(0, decided);
  return out;
}

std::string Utf8Holdback::flush() { return std::exchange(buffer_, std::string()); }

void append_json_escaped(std::string& out, std::string_view s) {
  static const char* kHex = "0123456789abcdef";
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xF];
        } else {
          out += ch;
        }
    }
  }
}

}  // namespace tessera::server
