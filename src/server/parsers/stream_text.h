// Building blocks shared by the streaming output parsers: a literal-tag scanner that
// never looks at a byte more than a bounded number of times, and a UTF-8 holdback that
// keeps every emitted fragment whole (each streamed delta becomes its own JSON string).
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::server {

// One step of TagScanner output: either a plain byte or a complete tag (index into the tag list).
struct ScanEvent {
  int tag = -1;  // -1: `byte` is plain text
  char byte = 0;
};

// Finds literal tags (`<think>`, `</tool_call>`, ...) in a byte stream that arrives in
// arbitrary pieces. Bytes that might begin a tag are held until they are known to be
// plain text or a complete tag; the held part is never longer than the longest tag, so
// scanning costs O(bytes x longest tag). No tag may be a prefix of another.
class TagScanner {
 public:
  explicit TagScanner(std::vector<std::string> tags);

  // Feeds one byte and appends what it settles to `out`, in input order.
  void feed(char c, std::vector<ScanEvent>& out);
  // The held bytes (a proper prefix of some tag), removed from the scanner.
  std::string take_pending();
  const std::string& tag(int i) const { return tags_[static_cast<size_t>(i)]; }
  // Feeds `c` and hands each settled event to `handle` (into `events`, reused). When `handle`
  // returns true (it changed state, so what follows must be scanned again), the rest is not
  // handled: `replay` (emptied), the events after that one and the held bytes go back to the
  // front of `queue`, to be fed again.
  template <typename Queue, typename Handle>
  void feed_or_replay(char c, std::vector<ScanEvent>& events, std::string& replay, Queue& queue, Handle&& handle) {
    events.clear();
    feed(c, events);
    for (size_t k = 0; k < events.size(); ++k) {
      if (!handle(events[k])) continue;
      std::string again = std::move(replay);
      replay.clear();
      for (size_t j = k + 1; j < events.size(); ++j)
        again += events[j].tag >= 0 ? tag(events[j].tag) : std::string(1, events[j].byte);
      again += take_pending();
      queue.insert(queue.begin(), again.begin(), again.end());
      return;
    }
  }

 private:
  bool is_tag_prefix(std::string_view s, int* exact) const;

  std::vector<std::string> tags_;
  std::array<bool, 256> first_bytes_{};
  std::string pending_;
};

// The next byte to scan into `c`: one handed back for a second look (the front of `queue`)
// first, then `input[i++]`; false when both are used up.
template <typename Queue>
bool next_byte(Queue& queue, std::string_view input, size_t& i, char& c) {
  if (!queue.empty()) {
    c = queue.front();
    queue.pop_front();
    return true;
  }
  if (i >= input.size()) return false;
  c = input[i++];
  return true;
}

// Holds back an incomplete UTF-8 sequence at the end of a stream fragment so that every
// fragment handed out is whole UTF-8 (when the input is). Concatenating all take() results
// and the final flush() gives back exactly the bytes appended.
class Utf8Holdback {
 public:
  void append(std::string_view s) { buffer_.append(s); }
  void push_back_char(char c) { buffer_.push_back(c); }
  // Everything but a trailing incomplete sequence that later bytes may still complete (at most 3
  // bytes; tokenizer::decidable_prefix_length, as the streaming detokenizer holds back).
  std::string take();
  std::string flush();  // everything

 private:
  std::string buffer_;
};

// JSON whitespace: what the reasoning and tool parsers skip around tags.
inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Appends `s` escaped as the inside of a JSON string. Bytes >= 0x80 pass through unchanged,
// so escaping pieces and concatenating equals escaping the whole.
void append_json_escaped(std::string& out, std::string_view s);

}  // namespace tessera::server
