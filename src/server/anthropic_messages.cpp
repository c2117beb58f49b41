// Anthropic Messages: the request translated to an OpenAI chat request, and the writer of Anthropic's
// message object / stream events (message_start, content_block_*, message_delta, message_stop).
#include "server/anthropic_messages.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "server/protocol_writers.h"
#include "server/text_only.h"

namespace tessera::server::api {

namespace {

std::string blocks_text(const ojson& content, const char* where) {
  if (content.is_null()) return {};
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(fmt::format("{} must be a string or a list of content blocks", where));
  std::string s;
  for (const auto& b : content) {
    if (!b.is_object() || !b.contains("type")) bad(fmt::format("{}: each content block needs a type", where));
    if (b["type"] == "text") {
      if (!b.contains("text") || !b["text"].is_string()) bad(fmt::format("{}: a text block needs 'text'", where));
      if (!s.empty()) s += "\n";
      s += b["text"].get<std::string>();
    } else if (b["type"].is_string() && media_kind(b["type"].get<std::string>())) {
      bad(text_only_message(where, b["type"].get<std::string>()), "messages");
    } else {
      bad(fmt::format("{}: content blocks of type {} are not supported here", where, b["type"].dump()));
    }
  }
  return s;
}

// Anthropic tool_choice -> OpenAI tool_choice: auto, any (-> required), tool (-> the named function), none.
ojson anthropic_tool_choice(const ojson* c) {
  if (!c) return "auto";
  const ojson* type = c->is_object() ? field(*c, "type") : nullptr;
  if (!type || !type->is_string()) bad("tool_choice: must be an object with a type", "tool_choice");
  const std::string t = type->get<std::string>();
  if (t == "auto" || t == "none") return t;
  if (t == "any") return "required";
  if (t == "tool") {
    const ojson* name = field(*c, "name");
    if (!name || !name->is_string()) bad("tool_choice: a choice of type 'tool' needs the tool's name", "tool_choice");
    return ojson{{"type", "function"}, {"function", {{"name", *name}}}};
  }
  bad(fmt::format("tool_choice.type: '{}' is not one of auto, any, tool, none", t), "tool_choice");
}

// The blocks of one user or assistant message: text, tool_use (assistant) and thinking (assistant) make one
// chat message; each tool_result (user) becomes a tool message.
void add_block_message(const ojson& content, const std::string& role, const std::string& where,
                       std::vector<std::string>& tool_use_ids, ojson& out) {
  std::string text, reasoning;
  ojson tool_calls = ojson::array();
  for (const auto& b : content) {
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      bad(where + ": each content block needs a type", "messages");
    const std::string type = b["type"].get<std::string>();
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string()) bad(where + ": a text block needs 'text'", "messages");
      if (!text.empty()) text += "\n";
      text += b["text"].get<std::string>();
    } else if (type == "tool_use" && role == "assistant") {
      if (!b.contains("name") || !b["name"].is_string()) bad(where + ": a tool_use block needs a name", "messages");
      if (b.contains("id") && !b["id"].is_string()) bad(where + ": a tool_use block's id must be a string", "messages");
      ojson input = b.contains("input") ? b["input"] : ojson::object();
      if (!input.is_object()) bad(where + ": a tool_use block's input must be an object", "messages");
      std::string id = b.contains("id") ? b["id"].get<std::string>() : "toolu_" + random_hex(24);
      tool_use_ids.push_back(id);
      tool_calls.push_back(
          {{"id", id}, {"type", "function"}, {"function", {{"name", b["name"]}, {"arguments", dump(input)}}}});
    } else if (type == "tool_result" && role == "user") {
      if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
        bad(where + ": a tool_result block needs tool_use_id", "messages");
      if (std::find(tool_use_ids.begin(), tool_use_ids.end(), b["tool_use_id"].get<std::string>()) ==
          tool_use_ids.end())
        bad(fmt::format("{}: tool_result block's tool_use_id '{}' matches no earlier tool_use block", where,
                        b["tool_use_id"].get<std::string>()),
            "messages");
      out.push_back({{"role", "tool"},
                     {"tool_call_id", b["tool_use_id"]},
                     {"content", blocks_text(b.contains("content") ? b["content"] : ojson(""), where.c_str())}});
    } else if (type == "thinking" && role == "assistant") {
      reasoning += b.value("thinking", "");
    } else if (type == "redacted_thinking") {
      // nothing to render
    } else if (media_kind(type)) {
      bad(text_only_message(where + ".content", type), "messages");
    } else {
      bad(fmt::format("{}: content blocks of type '{}' are not supported", where, type), "messages");
    }
  }
  if (role == "assistant") {
    ojson a{{"role", "assistant"}, {"content", text}};
    if (!tool_calls.empty()) a["tool_calls"] = tool_calls;
    if (!reasoning.empty()) a["reasoning_content"] = reasoning;
    out.push_back(a);
  } else if (!text.empty()) {
    out.push_back({{"role", "user"}, {"content", text}});
  }
}

ojson chat_messages(const ojson& body, int max_messages) {
  const ojson* msgs = field(body, "messages");
  if (!msgs) bad("messages: Field required", "messages");
  if (!msgs->is_array() || msgs->empty()) bad("messages: must be a non-empty list", "messages");
  if (static_cast<int>(msgs->size()) > max_messages)
    bad(fmt::format("messages: at most {} are accepted", max_messages), "messages");
  ojson out = ojson::array();
  std::vector<std::string> tool_use_ids;  // a tool_result must answer one of these
  if (const ojson* sys = field(body, "system"))
    out.push_back({{"role", "system"}, {"content", blocks_text(*sys, "system")}});
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ojson& m = (*msgs)[i];
    const std::string where = fmt::format("messages.{}", i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      bad(where + ": each message needs a role", "messages");
    const std::string role = m["role"].get<std::string>();
    if (role != "user" && role != "assistant" && role != "system")
      bad(fmt::format("{}.role: '{}' is not one of user, assistant, system", where, role), "messages");
    if (!m.contains("content")) bad(where + ".content: Field required", "messages");
    const ojson& content = m["content"];
    if (role == "system") {  // Claude Code's mid-conversation system messages, kept in their place
      out.push_back({{"role", "system"}, {"content", blocks_text(content, where.c_str())}});
      continue;
    }
    if (content.is_string()) {
      out.push_back({{"role", role}, {"content", content}});
      continue;
    }
    if (!content.is_array()) bad(where + ".content must be a string or a list of blocks", "messages");
    add_block_message(content, role, where, tool_use_ids, out);
  }
  return out;
}

void add_tools(const ojson& body, ojson& chat) {
  const ojson* tools = field(body, "tools");
  if (!tools) return;
  if (!tools->is_array()) bad("tools: must be a list", "tools");
  ojson ts = ojson::array();
  for (const auto& t : *tools) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) bad("tools: each tool needs a name", "tools");
    if (t.contains("input_schema") && !t["input_schema"].is_object())
      bad("tools: input_schema must be a JSON Schema object", "tools");
    ojson f{{"name", t["name"]}};
    if (t.contains("description")) f["description"] = t["description"];
    f["parameters"] = t.contains("input_schema") ? t["input_schema"] : ojson::object();
    ts.push_back({{"type", "function"}, {"function", f}});
  }
  if (!ts.empty()) {
    chat["tools"] = ts;
    chat["tool_choice"] = anthropic_tool_choice(field(body, "tool_choice"));
    // tool_choice.disable_parallel_tool_use: at most one tool_use block.
    if (const ojson* c = field(body, "tool_choice"); c && c->is_object())
      if (const ojson* d = field(*c, "disable_parallel_tool_use")) {
        if (!d->is_boolean()) bad("tool_choice.disable_parallel_tool_use must be a boolean", "tool_choice");
        chat["parallel_tool_calls"] = !d->get<bool>();
      }
  }
}

}  // namespace

ojson messages_to_chat(const ojson& body, int max_messages) {
  const ojson* mt = field(body, "max_tokens");
  if (!mt) bad("max_tokens: Field required", "max_tokens");
  if (!mt->is_number_integer() || mt->get<int64_t>() < 1) bad("max_tokens: must be a positive integer", "max_tokens");
  if (body.contains("n")) bad("n: Extra inputs are not permitted (the Messages API has no 'n')", "n");
  if (const ojson* t = field(body, "temperature");
      t && t->is_number() && !(t->get<double>() >= 0 && t->get<double>() <= 1))
    bad("temperature: must be between 0 and 1", "temperature");
  ojson chat{{"messages", chat_messages(body, max_messages)}, {"max_tokens", *mt}};
  for (const char* k : {"model", "temperature", "top_p", "top_k", "stream"})
    if (const ojson* v = field(body, k)) chat[k] = *v;
  if (const ojson* ss = field(body, "stop_sequences")) {
    if (!ss->is_array()) bad("stop_sequences: must be a list of strings", "stop_sequences");
    chat["stop"] = *ss;
  }
  add_tools(body, chat);
  // thinking {"type": "enabled", "budget_tokens": N} / {"type": "adaptive"} / {"type": "disabled"} -> the
  // chat template's enable_thinking switch (the budget is not enforced: the model decides when to stop).
  if (const ojson* th = field(body, "thinking")) {
    const ojson* type = th->is_object() ? field(*th, "type") : nullptr;
    if (!type || !type->is_string() || (*type != "enabled" && *type != "adaptive" && *type != "disabled"))
      bad("thinking.type: must be one of enabled, adaptive, disabled", "thinking");
    chat["chat_template_kwargs"] = {{"enable_thinking", *type != "disabled"}};
  }
  // Fields Claude Code sends that have no meaning for a self-hosted model are ignored (listed in
  // docs/server.md): metadata, context_management, output_config, service_tier, container, mcp_servers.
  return chat;
}

namespace {

class MessagesWriter final : public ProtocolWriter {
 public:
  const char* id_prefix() const override { return "msg_"; }
  bool clamps_max_tokens() const override { return true; }

  std::string begin_stream(Gen& g) override {
    ojson msg{{"id", g.id},
              {"type", "message"},
              {"role", "assistant"},
              {"model", g.model},
              {"content", ojson::array()},
              {"stop_reason", nullptr},
              {"stop_sequence", nullptr},
              {"usage", {{"input_tokens", g.prompt_tokens[0]}, {"output_tokens", 0}}}};
    std::string out = event("message_start", {{"type", "message_start"}, {"message", msg}});
    // Without parsers all output is one text block; with them blocks open as thinking, text and tool calls appear.
    if (g.parsers.empty()) out += open_block("text", {{"type", "text"}, {"text", ""}});
    return out;
  }

  // Stream events for one parsed delta: thinking_delta, text_delta, tool_use + input_json_delta.
  std::string stream_delta(Gen& g, size_t ci, const StreamDelta& d, const std::vector<TokenLogprob>&) override {
    const bool has_text = !d.text.empty() && d.finish_reason != FinishReason::kError;
    const ChatDelta cd = g.parsed_delta(ci, d, has_text);
    std::string out;
    if (!cd.reasoning.empty()) {
      if (block_type_ != "thinking") out += open_block("thinking", {{"type", "thinking"}, {"thinking", ""}});
      out += block_delta({{"type", "thinking_delta"}, {"thinking", cd.reasoning}});
    }
    if (!cd.content.empty()) {
      if (block_type_ != "text") out += open_block("text", {{"type", "text"}, {"text", ""}});
      out += block_delta({{"type", "text_delta"}, {"text", cd.content}});
    }
    for (const auto& tc : cd.tool_calls) {
      if (tc.first())
        out += open_block("tool_use",
                          {{"type", "tool_use"}, {"id", tc.id}, {"name", tc.name}, {"input", ojson::object()}});
      if (!tc.arguments.empty() && block_type_ == "tool_use")
        out += block_delta({{"type", "input_json_delta"}, {"partial_json", tc.arguments}});
    }
    return out;
  }

  std::string end_stream(Gen& g) override {
    const Choice& c = g.choices[0];
    std::string out;
    if (block_index_ < 0) out += open_block("text", {{"type", "text"}, {"text", ""}});
    out += event("content_block_stop", {{"type", "content_block_stop"}, {"index", block_index_}});
    std::string reason = stop_reason(c);
    if (!g.tools_called.empty() && g.tools_called[0] && reason == "end_turn") reason = "tool_use";
    out += event(
        "message_delta",
        {{"type", "message_delta"},
         {"delta",
          {{"stop_reason", reason}, {"stop_sequence", c.stop_string.empty() ? ojson(nullptr) : ojson(c.stop_string)}}},
         {"usage", {{"output_tokens", c.token_ids.size()}}}});
    return out + event("message_stop", {{"type", "message_stop"}});
  }

  // Reasoning -> a thinking block, text -> a text block, tool calls -> tool_use blocks.
  ojson response(Gen& g) override {
    const Choice& c = g.choices[0];
    ojson content = ojson::array();
    std::string reason = stop_reason(c);
    ChatParseResult r = g.parsed_output(0);
    if (!r.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", r.reasoning}, {"signature", ""}});
    // Without parsers the text block is there even when empty.
    if (!r.content.empty() || g.parsers.empty()) content.push_back({{"type", "text"}, {"text", r.content}});
    for (const auto& call : r.tool_calls) {
      ojson input = ojson::parse(call.arguments, nullptr, false);
      if (input.is_discarded() || !input.is_object()) input = ojson::object();
      content.push_back({{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", input}});
    }
    if (r.tools_called() && reason == "end_turn") reason = "tool_use";
    return {{"id", g.id},
            {"type", "message"},
            {"role", "assistant"},
            {"model", g.model},
            {"content", content},
            {"stop_reason", reason},
            {"stop_sequence", c.stop_string.empty() ? ojson(nullptr) : ojson(c.stop_string)},
            {"usage", {{"input_tokens", g.prompt_tokens[0]}, {"output_tokens", c.token_ids.size()}}}};
  }

 private:
  static std::string stop_reason(const Choice& c) {
    if (c.finish_reason == "length") return "max_tokens";
    if (!c.stop_string.empty()) return "stop_sequence";
    return "end_turn";
  }

  // Closes the open content block (if any) and opens a new one.
  std::string open_block(const char* type, const ojson& block) {
    std::string out;
    if (block_index_ >= 0)
      out += event("content_block_stop", {{"type", "content_block_stop"}, {"index", block_index_}});
    ++block_index_;
    block_type_ = type;
    out += event("content_block_start",
                 {{"type", "content_block_start"}, {"index", block_index_}, {"content_block", block}});
    return out;
  }

  std::string block_delta(const ojson& delta) const {
    return event("content_block_delta", {{"type", "content_block_delta"}, {"index", block_index_}, {"delta", delta}});
  }

  int block_index_ = -1;  // the open content block (-1: none yet)
  std::string block_type_;
};

}  // namespace

std::unique_ptr<ProtocolWriter> messages_writer() { return std::make_unique<MessagesWriter>(); }

}  // namespace tessera::server::api
