#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"
#include "tokenizer/regex.h"

namespace tessera::tokenizer {
namespace {

// How matches of a Split pattern become pieces (HF's SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

SplitBehavior parse_behavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  fail(ErrorKind::kUnsupported, "tokenizer.json: Split behavior '{}' is not supported", name);
}

// Splits each piece around the matches of a regex, as HF's Split does.
class RegexSplitter : public PreTokenizer {
 public:
  RegexSplitter(std::string_view pattern, SplitBehavior behavior, bool invert)
      : regex_(pattern), behavior_(behavior), invert_(invert) {}

  void split(std::vector<std::string_view>& pieces, std::deque<std::string>&) const override {
    std::vector<std::string_view> out;
    out.reserve(pieces.size() * 2);
    std::vector<std::pair<size_t, size_t>> matches;
    std::vector<std::pair<std::string_view, bool>> spans;  // (text, is delimiter)
    for (std::string_view piece : pieces) {
      regex_.find_all(piece, matches);
      spans.clear();
      size_t previous = 0;
      for (auto [begin, end] : matches) {
        if (begin != previous) spans.emplace_back(piece.substr(previous, begin - previous), invert_);
        spans.emplace_back(piece.substr(begin, end - begin), !invert_);
        previous = end;
      }
      if (previous != piece.size()) spans.emplace_back(piece.substr(previous), invert_);
      apply_behavior(piece, spans, out);
    }
    pieces = std::move(out);
  }

 private:
  // Mirrors HF's NormalizedString::split: folds the spans, then drops empty pieces.
  void apply_behavior(std::string_view, const std::vector<std::pair<std::string_view, bool>>& spans,
                      std::vector<std::string_view>& out) const {
    // Spans are contiguous views into one piece, so joining neighbours is widening a view.
    auto join = [](std::string_view a, std::string_view b) { return std::string_view(a.data(), a.size() + b.size()); };
    std::vector<std::string_view> merged;
    merged.reserve(spans.size());
    bool previous_match = false;
    switch (behavior_) {
      case SplitBehavior::kIsolated:
        for (auto [text, is_match] : spans) merged.push_back(text);
        break;
      case SplitBehavior::kRemoved:
        for (auto [text, is_match] : spans)
          if (!is_match) merged.push_back(text);
        break;
      case SplitBehavior::kMergedWithPrevious:
        for (auto [text, is_match] : spans) {
          if (is_match && !previous_match && !merged.empty()) {
            merged.back() = join(merged.back(), text);
          } else {
            merged.push_back(text);
          }
          previous_match = is_match;
        }
        break;
      case SplitBehavior::kMergedWithNext:
        for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
          auto [text, is_match] = *it;
          if (is_match && !previous_match && !merged.empty()) {
            merged.back() = join(text, merged.back());
          } else {
            merged.push_back(text);
          }
          previous_match = is_match;
        }
        std::reverse(merged.begin(), merged.end());
        break;
      case SplitBehavior::kContiguous:
        for (auto [text, is_match] : spans) {
          if (is_match == previous_match && !merged.empty()) {
            merged.back() = join(merged.back(), text);
          } else {
            merged.push_back(text);
          }
          previous_match = is_match;
        }
        break;
    }
    for (std::string_view text : merged)
      if (!text.empty()) out.push_back(text);
  }

  Regex regex_;
  SplitBehavior behavior_;
  bool invert_;
};

// GPT-2's pre-tokenizer regex, used by ByteLevel when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_splitter_ = std::make_unique<RegexSplitter>(kGpt2Pattern, SplitBehavior::kIsolated, false);
  }

  void split(std::vector<std::string_view>& pieces, std::deque<std::string>& storage) const override {
    if (add_prefix_space_) {
      for (std::string_view& piece : pieces) {
        if (!piece.empty() && piece.front() != ' ') piece = storage.emplace_back(" " + std::string(piece));
      }
    }
    if (regex_splitter_) regex_splitter_->split(pieces, storage);
  }
  bool is_byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  std::unique_ptr<RegexSplitter> regex_splitter_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {
    for (size_t i = 0; i + 1 < steps_.size(); ++i) {
      if (steps_[i]->is_byte_level()) {
        fail(ErrorKind::kUnsupported, "tokenizer.json: a pre-tokenizer after ByteLevel is not supported");
      }
    }
  }
  void split(std::vector<std::string_view>& pieces, std::deque<std::string>& storage) const override {
    for (const auto& step : steps_) step->split(pieces, storage);
  }
  bool is_byte_level() const override { return !steps_.empty() && steps_.back()->is_byte_level(); }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

std::string split_pattern(const nlohmann::json& pattern) {
  if (pattern.contains("Regex")) return pattern.at("Regex").get<std::string>();
  if (pattern.contains("String")) return Regex::escape(pattern.at("String").get<std::string>());
  fail(ErrorKind::kCorrupt, "tokenizer.json: Split pattern has neither 'Regex' nor 'String'");
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config) {
  if (config.is_null()) return nullptr;
  const std::string type = config.value("type", "");
  if (type == "Split") {
    return std::make_unique<RegexSplitter>(split_pattern(config.at("pattern")),
                                           parse_behavior(config.at("behavior").get<std::string>()),
                                           config.value("invert", false));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(config.value("add_prefix_space", true),
                                                   config.value("use_regex", true));
  }
  if (type == "Digits") {
    bool individual = config.value("individual_digits", false);
    // HF splits on char::is_numeric (Nd, Nl, No), each digit alone or runs kept together.
    return std::make_unique<RegexSplitter>(individual ? R"(\p{N})" : R"(\p{N}+)", SplitBehavior::kIsolated, false);
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& step : config.at("pretokenizers")) {
      if (auto pre_tokenizer = make_pre_tokenizer(step)) steps.push_back(std::move(pre_tokenizer));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  fail(ErrorKind::kUnsupported, "tokenizer.json: pre-tokenizer type '{}' is not supported", type);
}

}  // namespace tessera::tokenizer
