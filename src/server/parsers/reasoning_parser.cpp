#include "server/parsers/reasoning_parser.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <deque>

#include "server/parsers/stream_text.h"

namespace tessera::server {

ReasoningParserOptions reasoning_options_from_kwargs(const nlohmann::json& chat_template_kwargs) {
  ReasoningParserOptions o;
  if (chat_template_kwargs.is_object()) {
    auto it = chat_template_kwargs.find("enable_thinking");
    if (it != chat_template_kwargs.end() && it->is_boolean() && !it->get<bool>()) o.enable_thinking = false;
  }
  return o;
}

ReasoningResult ReasoningParser::parse(std::string_view text) const {
  std::unique_ptr<ReasoningParser> p = fresh();
  ReasoningDelta a = p->push(text);
  ReasoningDelta b = p->finish();
  return {a.reasoning + b.reasoning, a.content + b.content};
}

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolCallOpen = "<tool_call>";
constexpr std::string_view kFunctionOpen = "<function";  // then '=' or whitespace

// Both parsers follow vLLM's <think> handling:
//  - output starts inside the reasoning (the template may have put <think> in the prompt);
//    a <think> the model writes itself before </think> is dropped (the first one only);
//  - </think> ends the reasoning, everything after it is content, byte for byte;
//  - no </think> at all: everything is reasoning (output cut off while thinking).
// Qwen3 additionally:
//  - enable_thinking=false: all output is content (the template closed the think block);
//  - <tool_call> followed by optional whitespace and `<function=` (Qwen3.5 / Qwen3-Coder XML
//    calls) ends the reasoning implicitly; the <tool_call> starts the content.
class ThinkReasoningParser final : public ReasoningParser {
 public:
  ThinkReasoningParser(bool qwen3, ReasoningParserOptions options)
      : qwen3_(qwen3),
        options_(options),
        scanner_(qwen3 ? std::vector<std::string>{std::string(kThinkOpen), std::string(kThinkClose),
                                                  std::string(kToolCallOpen)}
                       : std::vector<std::string>{std::string(kThinkOpen), std::string(kThinkClose)}) {
    if (qwen3_ && !options_.enable_thinking) state_ = State::kContent;
  }

  ReasoningDelta push(std::string_view delta) override {
    drain(delta);
    return {reasoning_.take(), content_.take()};
  }

  ReasoningDelta finish() override {
    // Held bytes are a proper tag prefix (never a whole tag), and an unconfirmed
    // <tool_call> lookahead stays reasoning.
    std::string rest = scanner_.take_pending();
    if (state_ == State::kLookahead) {
      reasoning_.append(lookahead_);
      reasoning_.append(rest);
      state_ = State::kReasoning;
    } else {
      channel().append(rest);
    }
    return {reasoning_.flush(), content_.flush()};
  }

  bool reasoning_ended() const override { return state_ == State::kContent; }

  std::unique_ptr<ReasoningParser> fresh() const override {
    return std::make_unique<ThinkReasoningParser>(qwen3_, options_);
  }

 private:
  enum class State { kReasoning, kLookahead, kContent };

  Utf8Holdback& channel() { return state_ == State::kContent ? content_ : reasoning_; }

  // Scans `input`; bytes handed back for a second look (replay_) go first, through queue_.
  void drain(std::string_view input) {
    std::vector<ScanEvent> events;
    size_t i = 0;
    for (;;) {
      if (queue_.empty() && i < input.size() && state_ == State::kContent) {
        // Past the reasoning nothing is parsed; the scanner may still hold a tag prefix.
        content_.append(scanner_.take_pending());
        content_.append(input.substr(i));
        return;
      }
      char c;
      if (!next_byte(queue_, input, i, c)) return;
      if (state_ == State::kContent) {
        content_.append(scanner_.take_pending());
        content_.push_back_char(c);
        continue;
      }
      scanner_.feed_or_replay(c, events, replay_, queue_, [this](const ScanEvent& e) { return handle(e); });
    }
  }

  // Returns true when the bytes in replay_ (and everything after this event) must be re-scanned.
  bool handle(const ScanEvent& e) {
    switch (state_) {
      case State::kContent:
        if (e.tag >= 0)
          content_.append(scanner_.tag(e.tag));
        else
          content_.push_back_char(e.byte);
        return false;
      case State::kReasoning:
        if (e.tag < 0) {
          reasoning_.push_back_char(e.byte);
        } else if (scanner_.tag(e.tag) == kThinkClose) {
          state_ = State::kContent;
        } else if (scanner_.tag(e.tag) == kThinkOpen && !seen_open_) {
          seen_open_ = true;
        } else if (scanner_.tag(e.tag) == kToolCallOpen) {
          state_ = State::kLookahead;
          lookahead_ = std::string(kToolCallOpen);
          matched_ = 0;
        } else {
          reasoning_.append(scanner_.tag(e.tag));
        }
        return false;
      case State::kLookahead: {
        // <tool_call> \s* <function[=\s]
        if (e.tag < 0) {
          char c = e.byte;
          if (matched_ == 0 && is_space(c)) {
            lookahead_ += c;
            return false;
          }
          if (matched_ < kFunctionOpen.size() && c == kFunctionOpen[matched_]) {
            lookahead_ += c;
            ++matched_;
            return false;
          }
          if (matched_ == kFunctionOpen.size() && (c == '=' || is_space(c))) {
            state_ = State::kContent;
            content_.append(lookahead_);
            content_.push_back_char(c);
            lookahead_.clear();
            return false;
          }
        }
        // Not a tool call: <tool_call> was reasoning text; re-scan what followed it.
        state_ = State::kReasoning;
        reasoning_.append(kToolCallOpen);
        replay_ = lookahead_.substr(kToolCallOpen.size());
        replay_ += e.tag >= 0 ? scanner_.tag(e.tag) : std::string(1, e.byte);
        lookahead_.clear();
        return true;
      }
    }
    return false;
  }

  bool qwen3_;
  ReasoningParserOptions options_;
  TagScanner scanner_;
  State state_ = State::kReasoning;
  bool seen_open_ = false;
  std::string lookahead_;
  size_t matched_ = 0;
  std::string replay_;
  std::deque<char> queue_;
  Utf8Holdback reasoning_;
  Utf8Holdback content_;
};

}  // namespace

std::vector<std::string> supported_reasoning_parsers() { return {"deepseek_r1", "qwen3"}; }

std::unique_ptr<ReasoningParser> make_reasoning_parser(std::string_view name, const ReasoningParserOptions& options) {
  if (name == "qwen3") return std::make_unique<ThinkReasoningParser>(true, options);
  if (name == "deepseek_r1") return std::make_unique<ThinkReasoningParser>(false, options);
  fail(ErrorKind::kInvalidArgument, "unknown reasoning parser '{}'; supported: {}", name,
       fmt::join(supported_reasoning_parsers(), ", "));
}

}  // namespace tessera::server
