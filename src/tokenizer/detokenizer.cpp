#include "tokenizer/detokenizer.h"

#include <algorithm>

#include "tokenizer/utf8.h"

namespace tessera::tokenizer {

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, DetokenizerOptions options)
    : tokenizer_(tokenizer), options_(std::move(options)) {
  std::erase_if(options_.stop_strings, [](const std::string& s) { return s.empty(); });
  for (const std::string& stop : options_.stop_strings) longest_stop_ = std::max(longest_stop_, stop.size());
}

std::string StreamingDetokenizer::next_text_by_bytes(int32_t id) {
  tokenizer_.append_token_bytes(id, options_.skip_special_tokens, pending_bytes_);
  size_t decided = decidable_prefix_length(pending_bytes_);
  std::string text = utf8_lossy(std::string_view(pending_bytes_).substr(0, decided));
  pending_bytes_.erase(0, decided);
  return text;
}

std::string StreamingDetokenizer::next_text_by_decode(int32_t id) {
  ids_.push_back(id);
  std::span<const int32_t> all(ids_);
  std::string prefix_text =
      tokenizer_.decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), options_.skip_special_tokens);
  std::string new_text = tokenizer_.decode(all.subspan(prefix_offset_), options_.skip_special_tokens);
  if (new_text.size() <= prefix_text.size() || new_text.ends_with(kReplacementCharacter)) return {};
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return new_text.substr(prefix_text.size());
}

DetokenizerOutput StreamingDetokenizer::push(int32_t id) {
  if (stopped_ || finished_) return {};
  ++tokens_;
  std::string text = tokenizer_.decodes_by_byte_concatenation() ? next_text_by_bytes(id) : next_text_by_decode(id);
  return release(std::move(text), false);
}

DetokenizerOutput StreamingDetokenizer::finish() {
  if (stopped_ || finished_) return {};
  finished_ = true;
  std::string text;
  if (tokenizer_.decodes_by_byte_concatenation()) {
    pending_bytes_.clear();  // only ever the start of a character no byte will complete now: dropped
  } else if (read_offset_ < ids_.size()) {
    std::span<const int32_t> all(ids_);
    std::string prefix_text =
        tokenizer_.decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_), options_.skip_special_tokens);
    std::string full = tokenizer_.decode(all.subspan(prefix_offset_), options_.skip_special_tokens);
    // push() held this text back for its trailing U+FFFD (an unfinished character): drop that character.
    if (full.ends_with(kReplacementCharacter)) full.resize(full.size() - kReplacementCharacter.size());
    if (full.size() > prefix_text.size()) text = full.substr(prefix_text.size());
  }
  return release(std::move(text), true);
}

DetokenizerOutput StreamingDetokenizer::release(std::string new_text, bool at_end) {
  DetokenizerOutput out;
  held_text_.append(new_text);
  if (options_.stop_strings.empty()) {
    out.text = std::move(held_text_);
    held_text_.clear();
    output_.append(out.text);
    return out;
  }
  // The earliest complete stop string that ends past the text of the first min_tokens tokens wins.
  if (tokens_ <= options_.min_tokens) stop_floor_ = held_text_.size();
  size_t stop_at = std::string::npos;
  const std::string* stop_found = nullptr;
  for (const std::string& stop : options_.stop_strings) {
    const size_t from = stop_floor_ >= stop.size() ? stop_floor_ - stop.size() + 1 : 0;
    size_t at = held_text_.find(stop, from);
    if (at < stop_at) {
      stop_at = at;
      stop_found = &stop;
    }
  }
  if (stop_found) {
    size_t end = stop_at + (options_.include_stop_string_in_output ? stop_found->size() : 0);
    out.text = held_text_.substr(0, end);
    out.stopped = true;
    out.stop_string = *stop_found;
    stopped_ = true;
    held_text_.clear();
    output_.append(out.text);
    return out;
  }
  // Hold back the longest tail that is the beginning of some stop string.
  size_t keep = 0;
  if (!at_end) {
    size_t max_tail = std::min(held_text_.size(), longest_stop_ - 1);
    for (size_t tail = max_tail; tail > 0 && keep == 0; --tail) {
      std::string_view suffix = std::string_view(held_text_).substr(held_text_.size() - tail);
      for (const std::string& stop : options_.stop_strings) {
        if (stop.size() > tail && std::string_view(stop).substr(0, tail) == suffix) {
          keep = tail;
          break;
        }
      }
    }
  }
  out.text = held_text_.substr(0, held_text_.size() - keep);
  held_text_.erase(0, out.text.size());
  stop_floor_ -= std::min(stop_floor_, out.text.size());
  output_.append(out.text);
  return out;
}

}  // namespace tessera::tokenizer
