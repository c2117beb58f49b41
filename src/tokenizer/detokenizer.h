// Streaming detokenizer: the engine feeds it one token id at a time and gets back the text that
// is now final. It never emits part of a UTF-8 character (characters spread over several tokens,
// as CJK and emoji are, come out whole), and it holds back text that could be the start of a
// stop string, so a stop string that spans token boundaries is still caught and never leaks.
//
// Without stop strings, the concatenation of everything emitted (push()... then finish()) equals
// Tokenizer::decode(all ids, skip_special_tokens), except at the very end: bytes of a character that
// the last token left unfinished (an answer cut at max_tokens) are dropped instead of becoming U+FFFD,
// as vLLM's incremental detokenizer does.
//
// Stop strings follow vLLM's rules: none counts until more than `min_tokens` tokens were pushed, and
// then only a stop string that ends in the text of a token after the first min_tokens.
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
  // vLLM's min_tokens: stop strings are not looked for in the text of the first min_tokens tokens
  // (a stop string must end after it).
  int min_tokens = 0;
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
  // The sequence ended: releases the held-back text. The bytes of an unfinished UTF-8 character
  // at the end are dropped (never a trailing U+FFFD).
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
  int tokens_ = 0;  // pushed so far
  // A stop string must end past this many bytes of held_text_ (text of the first min_tokens tokens).
  size_t stop_floor_ = 0;
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
