#include "server/parsers/chat_output_parser.h"

namespace tessera::server {

void ChatDelta::append(ChatDelta&& later) {
  reasoning += later.reasoning;
  content += later.content;
  for (ToolCallDelta& d : later.tool_calls) {
    ToolCallDelta* same = nullptr;
    for (ToolCallDelta& mine : tool_calls)
      if (mine.index == d.index) same = &mine;
    if (same && d.id.empty())
      same->arguments += d.arguments;
    else
      tool_calls.push_back(std::move(d));
  }
}

ChatOutputParser::ChatOutputParser(std::unique_ptr<ReasoningParser> reasoning, std::unique_ptr<ToolParser> tools)
    : reasoning_(std::move(reasoning)), tools_(std::move(tools)) {}

ChatDelta ChatOutputParser::from_tools(ReasoningDelta r, ToolStreamDelta t) {
  ChatDelta d;
  d.reasoning = std::move(r.reasoning);
  d.content = std::move(t.content);
  d.tool_calls = std::move(t.tool_calls);
  if (!d.tool_calls.empty()) tools_called_ = true;
  return d;
}

ChatDelta ChatOutputParser::push(std::string_view delta) {
  ReasoningDelta r;
  if (reasoning_)
    r = reasoning_->push(delta);
  else
    r.content = std::string(delta);
  if (!tools_) return ChatDelta{std::move(r.reasoning), std::move(r.content), {}};
  ToolStreamDelta t = tools_->push(r.content);
  return from_tools(std::move(r), std::move(t));
}

ChatDelta ChatOutputParser::finish() {
  ReasoningDelta r;
  if (reasoning_) r = reasoning_->finish();
  if (!tools_) return ChatDelta{std::move(r.reasoning), std::move(r.content), {}};
  ToolStreamDelta t = tools_->push(r.content);
  ToolStreamDelta end = tools_->finish();
  t.content += end.content;
  t.tool_calls.insert(t.tool_calls.end(), end.tool_calls.begin(), end.tool_calls.end());
  // Merge so each index appears once, as push() promises.
  std::vector<ToolCallDelta> merged;
  for (ToolCallDelta& d : t.tool_calls) {
    if (!merged.empty() && merged.back().index == d.index && d.id.empty())
      merged.back().arguments += d.arguments;
    else
      merged.push_back(std::move(d));
  }
  t.tool_calls = std::move(merged);
  return from_tools(std::move(r), std::move(t));
}

ChatParseResult ChatOutputParser::parse(std::string_view text) const {
  ChatParseResult out;
  std::string content;
  if (reasoning_) {
    ReasoningResult r = reasoning_->parse(text);
    out.reasoning = std::move(r.reasoning);
    content = std::move(r.content);
  } else {
    content = std::string(text);
  }
  if (!tools_) {
    out.content = std::move(content);
    return out;
  }
  ToolParseResult t = tools_->parse(content);
  out.content = std::move(t.content);
  out.tool_calls = std::move(t.tool_calls);
  return out;
}

}  // namespace tessera::server
