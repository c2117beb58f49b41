// Streaming detokenizer: the engine feeds it one token id at a time and gets back the text that
// is now final. It never emits part of a UTF-8 character (characters spread over several tokens,
// as CJK and emoji are, come out whole), and it holds back text that could be the start of a
// stop string, so a stop string that spans token boundaries is still caught and never leaks.
//
// Without stop strings, the concatenation of everything emitted (push()... then finish()) equals
// Tokenizer::decode(all ids, skip_special_tokens).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace tessera::tokenizer {

struct DetokenizerOptions {
  bool skip_special_tokens = true;
  std::vector<std::string> stop_strings;  // empty strings are ignored
  bool include_stop_string_in_output = false;
};

struct DetokenizerOutput {
  std::string text;         // new final text (possibly empty)
  bool stopped = false;     // a stop string was reached: `text` ends before it (or with it)
  std::string stop_string;  // which one, when stopped
};

class StreamingDetokenizer {
 public:
  // `tokenizer` must outlive the detokenizer.
  StreamingDetokenizer(const Tokenizer& tokenizer, DetokenizerOptions options = {});

  // Adds one generated token. After a stop, further tokens produce nothing.
  DetokenizerOutput push(int32_t id);
  // The sequence ended: releases the held-back text (an unfinished UTF-8 character becomes
  // U+FFFD, as in a full decode).
  DetokenizerOutput finish();

  bool stopped() const { return stopped_; }
  // Everything emitted so far.
  const std::string& output() const { return output_; }

 private:
  std::string next_text_by_bytes(int32_t id);
  std::string next_text_by_decode(int32_t id);
  // Adds final text to the held-back text and releases what no stop string can claim.
  DetokenizerOutput release(std::string new_text, bool at_end);

  const Tokenizer& tokenizer_;
  DetokenizerOptions options_;
  size_t longest_stop_ = 0;
  bool stopped_ = false;
  bool finished_ = false;
  std::string pending_bytes_;  // byte path: bytes that may still become part of a character
  std::string held_text_;      // final text not yet released (a possible stop-string start)
  std::string output_;
  // Generic path (decoders that are not byte concatenation), as HF's DecodeStream.
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;
  size_t read_offset_ = 0;
};

}  // namespace tessera::tokenizer
