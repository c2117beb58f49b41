// hermes: <tool_call>{"name": "f", "arguments": {...}}</tool_call>, one JSON object per block.
//
// Follows vLLM's Hermes2ProToolParser:
//  - content is the text before the first <tool_call>; text between and after calls is dropped;
//  - a block ends at the first </tool_call> (or at the end of the output);
//  - non-streaming: if any block is not a JSON object with a string "name", there are no
//    calls and the whole output is content;
//  - streaming: a call's first delta is sent once its "name" is complete, then the raw text of
//    its "arguments" value as it arrives.
// Differences (documented in docs/parsers.md): "arguments" is passed on as the model wrote it
// (vLLM re-serialises it in the non-streaming path) so both paths give the same bytes; a
// missing "arguments" means "{}"; when a block proves malformed before any call was streamed,
// the streaming path also falls back to content, so it matches the non-streaming result.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "server/parsers/tool_parser_base.h"

namespace tessera::server::detail {
namespace {

// Structural scan of one block's text, a byte at a time: finds the top-level "name" and
// "arguments" members without building the document. Strictness comes later from
// nlohmann::json::accept on the whole block; this only has to be right for valid JSON and
// never misbehave on anything else.
class TopLevelObjectScan {
 public:
  static constexpr long kMaxDepth = 256;

  enum class Phase { kBefore, kExpectKey, kKey, kColon, kValue, kInValue, kAfterValue, kDone, kBad };

  void feed(const std::string& body, size_t pos) {
    step(body, pos);
    if (phase_ == Phase::kBad && bad_pos_ == kNone) bad_pos_ = pos;
  }

  Phase phase() const { return phase_; }
  bool name_found() const { return name_found_; }
  size_t name_start() const { return name_start_; }
  size_t name_end() const { return name_end_; }
  bool args_found() const { return args_found_; }
  size_t args_start() const { return args_start_; }
  // End of the arguments text seen so far: its end once complete, else `seen`; never past the
  // byte that made the block malformed (so what is streamed does not depend on the split).
  size_t args_end(size_t seen) const {
    size_t end = args_done_ ? args_end_ : seen;
    return std::max(args_start_, std::min(end, bad_pos_));
  }

 private:
  enum class Kind { kString, kContainer, kScalar };
  static constexpr size_t kNone = static_cast<size_t>(-1);

  // Past white space, `want` moves on to `next`; anything else makes the text no call.
  void expect(char c, char want, Phase next) {
    if (!is_space(c)) phase_ = c == want ? next : Phase::kBad;
  }

  void step(const std::string& body, size_t pos) {
    char c = body[pos];
    switch (phase_) {
      case Phase::kBefore:
        expect(c, '{', Phase::kExpectKey);
        return;
      case Phase::kExpectKey:
        if (is_space(c)) return;
        if (c == '"') {
          phase_ = Phase::kKey;
          key_start_ = pos + 1;
          escape_ = false;
        } else {
          phase_ = c == '}' ? Phase::kDone : Phase::kBad;
        }
        return;
      case Phase::kKey:
        if (escape_) {
          escape_ = false;
        } else if (c == '\\') {
          escape_ = true;
        } else if (c == '"') {
          key_.assign(body, key_start_, pos - key_start_);
          phase_ = Phase::kColon;
        }
        return;
      case Phase::kColon:
        expect(c, ':', Phase::kValue);
        return;
      case Phase::kValue:
        if (is_space(c)) return;
        value_start_ = pos;
        if (key_ == "arguments" && !args_found_) {
          args_found_ = true;
          args_start_ = pos;
        }
        phase_ = Phase::kInValue;
        in_string_ = false;
        escape_ = false;
        depth_ = 0;
        if (c == '"') {
          kind_ = Kind::kString;
          in_string_ = true;
        } else if (c == '{' || c == '[') {
          kind_ = Kind::kContainer;
          depth_ = 1;
        } else {
          kind_ = Kind::kScalar;
        }
        return;
      case Phase::kInValue:
        if (kind_ == Kind::kScalar) {
          if (is_space(c) || c == ',' || c == '}') {
            end_value(body, pos);
            step(body, pos);  // the delimiter belongs to the object
          }
          return;
        }
        if (in_string_) {
          if (escape_)
            escape_ = false;
          else if (c == '\\')
            escape_ = true;
          else if (c == '"') {
            in_string_ = false;
            if (kind_ == Kind::kString) end_value(body, pos + 1);
          }
          return;
        }
        if (c == '"') {
          in_string_ = true;
        } else if (c == '{' || c == '[') {
          // Deeper than any real call: treated as malformed, so that nobody downstream
          // (nlohmann's dump() recurses) ever handles a 100k-deep arguments value.
          if (++depth_ > kMaxDepth) phase_ = Phase::kBad;
        } else if (c == '}' || c == ']') {
          if (--depth_ == 0) end_value(body, pos + 1);
        }
        return;
      case Phase::kAfterValue:
        if (is_space(c)) return;
        phase_ = c == ',' ? Phase::kExpectKey : c == '}' ? Phase::kDone : Phase::kBad;
        return;
      case Phase::kDone:
        if (!is_space(c)) phase_ = Phase::kBad;
        return;
      case Phase::kBad:
        return;
    }
  }

  void end_value(const std::string& body, size_t end) {
    if (key_ == "name" && kind_ == Kind::kString && !name_found_) {
      name_found_ = true;
      name_start_ = value_start_;
      name_end_ = end;
    }
    if (args_found_ && !args_done_ && args_start_ == value_start_) {
      args_done_ = true;
      args_end_ = end;
    }
    phase_ = Phase::kAfterValue;
  }

  Phase phase_ = Phase::kBefore;
  Kind kind_ = Kind::kScalar;
  bool in_string_ = false;
  bool escape_ = false;
  long depth_ = 0;
  size_t key_start_ = 0;
  std::string key_;
  size_t value_start_ = 0;
  bool name_found_ = false;
  size_t name_start_ = 0, name_end_ = 0;
  bool args_found_ = false, args_done_ = false;
  size_t args_start_ = 0, args_end_ = 0;
  size_t bad_pos_ = kNone;
};

constexpr int kOpenTag = 0;
constexpr int kCloseTag = 1;

class HermesToolParser final : public ToolParser {
 public:
  explicit HermesToolParser(ToolParserOptions options)
      : options_(std::move(options)), sink_(options_.make_id), scanner_({"<tool_call>", "</tool_call>"}) {}

  ToolStreamDelta push(std::string_view delta) override {
    std::vector<ScanEvent> events;
    for (char c : delta) {
      if (state_ == State::kPassthrough) {
        sink_.content(scanner_.take_pending());
        sink_.content_byte(c);
        continue;
      }
      events.clear();
      scanner_.feed(c, events);
      for (const ScanEvent& e : events) handle(e);
    }
    emit_arguments();
    return sink_.take(false);
  }

  ToolStreamDelta finish() override {
    for (char c : scanner_.take_pending()) handle(ScanEvent{-1, c});
    if (state_ == State::kBlock) close_block();
    return sink_.take(true);
  }

  std::unique_ptr<ToolParser> fresh() const override { return std::make_unique<HermesToolParser>(options_); }

  ToolParseResult parse(std::string_view text) const override {
    HermesToolParser p(options_);
    ToolStreamDelta a = p.push(text);
    ToolStreamDelta b = p.finish();
    ToolParseResult r;
    if (p.saw_invalid_block_) {  // vLLM: any malformed call -> no calls, all content
      r.content = std::string(text);
      return r;
    }
    r.content = a.content + b.content;
    accumulate_tool_deltas(r.tool_calls, a.tool_calls);
    accumulate_tool_deltas(r.tool_calls, b.tool_calls);
    return r;
  }

 private:
  enum class State { kContent, kBlock, kBetween, kPassthrough };

  void handle(const ScanEvent& e) {
    switch (state_) {
      case State::kContent:
        if (e.tag == kOpenTag) {
          held_ = "<tool_call>";
          open_block();
        } else if (e.tag >= 0) {
          sink_.content(scanner_.tag(e.tag));
        } else {
          sink_.content_byte(e.byte);
        }
        return;
      case State::kBlock:
        if (!any_call_sent_) held_ += e.tag >= 0 ? scanner_.tag(e.tag) : std::string(1, e.byte);
        if (e.tag == kCloseTag) {
          close_block();
          return;
        }
        if (e.tag >= 0) {  // a nested <tool_call> is just text of this block, as in vLLM
          for (char c : scanner_.tag(e.tag)) body_byte(c);
        } else {
          body_byte(e.byte);
        }
        if (state_ == State::kBlock && scan_.phase() == TopLevelObjectScan::Phase::kBad && !any_call_sent_)
          to_passthrough();
        return;
      case State::kBetween:
        // Only reached with nothing sent when earlier calls were dropped (only_function).
        if (!any_call_sent_) held_ += e.tag >= 0 ? scanner_.tag(e.tag) : std::string(1, e.byte);
        if (e.tag == kOpenTag) open_block();
        return;
      case State::kPassthrough:
        if (e.tag >= 0)
          sink_.content(scanner_.tag(e.tag));
        else
          sink_.content_byte(e.byte);
        return;
    }
  }

  void open_block() {
    state_ = State::kBlock;
    body_.clear();
    scan_ = TopLevelObjectScan();
    call_sent_ = false;
    args_sent_ = 0;
  }

  void body_byte(char c) {
    body_.push_back(c);
    scan_.feed(body_, body_.size() - 1);
    if (!call_sent_ && !call_dropped_ && scan_.name_found()) start_call();
  }

  void start_call() {
    auto name = nlohmann::json::parse(body_.begin() + static_cast<long>(scan_.name_start()),
                                      body_.begin() + static_cast<long>(scan_.name_end()), nullptr, false);
    if (!name.is_string()) {
      call_dropped_ = true;  // invalid; the block will fail validation
      return;
    }
    std::string n = name.get<std::string>();
    if ((!options_.only_function.empty() && n != options_.only_function) || (options_.single_call && any_call_sent_)) {
      call_dropped_ = true;
      return;
    }
    sink_.start_call(n);
    call_sent_ = true;
    if (!any_call_sent_) {
      any_call_sent_ = true;
      held_.clear();
      held_.shrink_to_fit();
    }
  }

  void emit_arguments() {
    if (!call_sent_ || !scan_.args_found()) return;
    size_t end = scan_.args_end(body_.size());
    size_t from = scan_.args_start() + args_sent_;
    if (end > from) {
      sink_.arguments(std::string_view(body_).substr(from, end - from));
      args_sent_ = end - scan_.args_start();
    }
  }

  void close_block() {
    bool valid =
        scan_.phase() == TopLevelObjectScan::Phase::kDone && scan_.name_found() && nlohmann::json::accept(body_);
    if (valid && !call_sent_ && !call_dropped_) start_call();
    if (call_sent_) {
      emit_arguments();
      if (valid && !scan_.args_found()) sink_.arguments("{}");
      sink_.close_call();
    }
    call_sent_ = false;
    call_dropped_ = false;
    if (!valid) {
      saw_invalid_block_ = true;
      if (!any_call_sent_) {
        to_passthrough();
        return;
      }
    }
    state_ = State::kBetween;
  }

  // Nothing was streamed as a call yet and a block is malformed: like vLLM's non-streaming
  // path, the output is plain text, including everything held since the first <tool_call>.
  void to_passthrough() {
    saw_invalid_block_ = true;
    state_ = State::kPassthrough;
    sink_.content(held_);
    held_.clear();
  }

  ToolParserOptions options_;
  ToolDeltaSink sink_;
  TagScanner scanner_;
  State state_ = State::kContent;
  std::string body_;
  std::string held_;  // text from the first <tool_call> on, until a call is sent
  TopLevelObjectScan scan_;
  bool call_sent_ = false, call_dropped_ = false, any_call_sent_ = false, saw_invalid_block_ = false;
  size_t args_sent_ = 0;
};

}  // namespace

std::unique_ptr<ToolParser> make_hermes_tool_parser(ToolParserOptions options) {
  return std::make_unique<HermesToolParser>(std::move(options));
}

}  // namespace tessera::server::detail
