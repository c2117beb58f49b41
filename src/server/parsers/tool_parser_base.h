// Internal to the tool parsers: output bookkeeping shared by hermes and qwen3_coder.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "server/parsers/stream_text.h"
#include "server/parsers/tool_parser.h"

namespace tessera::server::detail {

// Collects what one push()/finish() produces: content, call starts, argument fragments.
// Fragments are held at UTF-8 boundaries per call; at most one delta per call index per push.
class ToolDeltaSink {
 public:
  explicit ToolDeltaSink(ToolCallIdGenerator make_id) : make_id_(std::move(make_id)) {}

  void content(std::string_view s) { content_.append(s); }
  void content_byte(char c) { content_.push_back_char(c); }

  // Opens call number `calls_started()`; closes the previous one if still open.
  void start_call(const std::string& name) {
    close_call();
    ToolCallDelta d;
    d.index = next_index_++;
    d.id = make_id_ ? make_id_() : make_tool_call_id();
    if (d.id.empty()) d.id = make_tool_call_id();
    d.name = name;
    out_.tool_calls.push_back(std::move(d));
    open_ = true;
  }
  void arguments(std::string_view s) {
    if (open_) args_.append(s);
  }
  void close_call() {
    if (!open_) return;
    add_args(args_.flush());
    open_ = false;
  }
  int calls_started() const { return next_index_; }

  ToolStreamDelta take(bool final) {
    if (final) close_call();
    if (open_) add_args(args_.take());
    out_.content = final ? content_.flush() : content_.take();
    return std::exchange(out_, ToolStreamDelta());
  }

 private:
  void add_args(std::string s) {
    if (s.empty()) return;
    int index = next_index_ - 1;
    if (!out_.tool_calls.empty() && out_.tool_calls.back().index == index)
      out_.tool_calls.back().arguments += s;
    else
      out_.tool_calls.push_back(ToolCallDelta{index, "", "", std::move(s)});
  }

  ToolCallIdGenerator make_id_;
  Utf8Holdback content_;
  Utf8Holdback args_;
  ToolStreamDelta out_;
  int next_index_ = 0;
  bool open_ = false;
};

std::unique_ptr<ToolParser> make_hermes_tool_parser(ToolParserOptions options);
std::unique_ptr<ToolParser> make_qwen3_coder_tool_parser(ToolParserOptions options);

}  // namespace tessera::server::detail
