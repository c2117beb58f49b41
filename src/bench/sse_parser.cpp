#include "bench/sse_parser.h"

namespace tessera::bench {

void SseParser::feed(std::string_view bytes) {
  size_t start = 0;
  if (last_was_cr_ && !bytes.empty() && bytes[0] == '\n') start = 1;
  last_was_cr_ = false;
  for (size_t i = start; i < bytes.size(); ++i) {
    char c = bytes[i];
    if (c != '\n' && c != '\r') continue;
    if (line_.empty()) {
      handle_line(bytes.substr(start, i - start));
    } else {
      line_.append(bytes.substr(start, i - start));
      handle_line(line_);
      line_.clear();
    }
    if (c == '\r') {
      if (i + 1 < bytes.size()) {
        if (bytes[i + 1] == '\n') ++i;
      } else {
        last_was_cr_ = true;
      }
    }
    start = i + 1;
  }
  if (start < bytes.size()) line_.append(bytes.substr(start));
}

void SseParser::finish() {
  if (!line_.empty()) {
    std::string rest;
    rest.swap(line_);
    handle_line(rest);
  }
  dispatch();
}

void SseParser::handle_line(std::string_view line) {
  if (line.empty()) {
    dispatch();
    return;
  }
  if (line[0] == ':') return;  // comment, used by servers as a keep-alive ping
  size_t colon = line.find(':');
  std::string_view field = line.substr(0, colon);
  std::string_view value;
  if (colon != std::string_view::npos) {
    value = line.substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) current_.data.push_back('\n');
    current_.data.append(value);
    has_data_ = true;
  } else if (field == "event") {
    current_.event.assign(value);
  }
  // "id" and "retry" do not matter to a benchmark client.
}

void SseParser::dispatch() {
  if (has_data_) on_event_(current_);
  current_ = SseEvent{};
  has_data_ = false;
}

}  // namespace tessera::bench
