#include <gtest/gtest.h>

#include "parsers_test_util.h"

namespace tessera::server {
namespace {

using testing::chunkings;

ToolParserOptions options_with_ids() {
  ToolParserOptions o;
  o.make_id = testing::counting_ids();
  return o;
}

TEST(ChatOutputParser, ReasoningThenToolCalls) {
  ChatOutputParser p(make_reasoning_parser("qwen3"), make_tool_parser("hermes", options_with_ids()));
  std::string text =
      "<think>\nNeed weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>";
  ChatParseResult r = p.parse(text);
  EXPECT_EQ(r.reasoning, "\nNeed weather.\n");
  EXPECT_EQ(r.content, "\n\n");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"city\": \"Paris\"}");
}

TEST(ChatOutputParser, ToolCallInsideReasoningIsNotACall) {
  // vLLM parses tools from the content only.
  ChatOutputParser p(make_reasoning_parser("deepseek_r1"), make_tool_parser("hermes", options_with_ids()));
  ChatParseResult r = p.parse("maybe <tool_call>{\"name\": \"f\"}</tool_call></think>no call");
  EXPECT_FALSE(r.tools_called());
  EXPECT_EQ(r.content, "no call");
}

TEST(ChatOutputParser, Qwen35ImplicitReasoningEndFeedsTheCoderParser) {
  ChatOutputParser p(make_reasoning_parser("qwen3"), make_tool_parser("qwen3_coder", options_with_ids()));
  ChatParseResult r = p.parse(
      "I should call it.\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n"
      "</function>\n</tool_call>");
  EXPECT_EQ(r.reasoning, "I should call it.\n");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"a\": \"1\"}");
}

// Qwen3.5's template opens <think> in the prompt, so the output holds only </think>; the XML tool calls of
// qwen3_coder come after it (or inside the reasoning, without </think>). None may be lost, streamed or not.
struct Qwen35Case {
  const char* text;
  bool enable_thinking;
  const char* reasoning;
  const char* content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

const std::vector<Qwen35Case>& qwen35_cases() {
  static const std::vector<Qwen35Case> cases = {
      {"The user wants the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
       "</parameter>\n</function>\n</tool_call>",
       true,
       "The user wants the weather.\n",
       "\n\n",
       {{"get_weather", "{\"city\": \"Paris\"}"}}},
      {"Two cities.\n</think>\n\nChecking both.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
       "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n"
       "</parameter>\n</function>\n</tool_call>",
       true,
       "Two cities.\n",
       "\n\nChecking both.\n",
       {{"get_weather", "{\"city\": \"Paris\"}"}, {"get_weather", "{\"city\": \"Rome\"}"}}},
      // Inside the reasoning: the <tool_call><function= pair ends it (vLLM's implicit end), the call survives.
      {"I need the weather.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"
       "</tool_call>",
       true,
       "I need the weather.\n",
       "",
       {{"get_weather", "{\"city\": \"Oslo\"}"}}},
      // enable_thinking false: the template closed the think block in the prompt; no reasoning split at all.
      {"<tool_call>\n<function=get_weather>\n<parameter=city>\nLima\n</parameter>\n</function>\n</tool_call>",
       false,
       "",
       "",
       {{"get_weather", "{\"city\": \"Lima\"}"}}},
      {"Sure.</think> Then <tool_call>\n<function=get_weather>\n<parameter=city>\nBern\n</parameter>\n</function>\n"
       "</tool_call>",
       false,
       "",
       "Sure.</think> Then ",
       {{"get_weather", "{\"city\": \"Bern\"}"}}},
      // Truncated while thinking: everything is reasoning, nothing is a call.
      {"Still weighing <tool_call> or not", true, "Still weighing <tool_call> or not", "", {}},
  };
  return cases;
}

ChatOutputParser qwen35_parser(bool enable_thinking) {
  ToolParserOptions o = options_with_ids();
  o.tools = nlohmann::json::parse(
      R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string"}}}}}])");
  return ChatOutputParser(make_reasoning_parser("qwen3", {.enable_thinking = enable_thinking}),
                          make_tool_parser("qwen3_coder", std::move(o)));
}

TEST(ChatOutputParser, Qwen35OutputOpenedInThePromptKeepsEveryToolCall) {
  for (const Qwen35Case& c : qwen35_cases()) {
    ChatParseResult r = qwen35_parser(c.enable_thinking).parse(c.text);
    EXPECT_EQ(r.reasoning, c.reasoning) << c.text;
    EXPECT_EQ(r.content, c.content) << c.text;
    ASSERT_EQ(r.tool_calls.size(), c.calls.size()) << c.text;
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(r.tool_calls[i].name, c.calls[i].first) << c.text;
      EXPECT_EQ(r.tool_calls[i].arguments, c.calls[i].second) << c.text;
    }
    for (const testing::Chunking& chunks : chunkings(c.text, 20)) {
      ChatOutputParser p = qwen35_parser(c.enable_thinking);
      ChatParseResult got = testing::stream_chat(p, chunks);
      ASSERT_EQ(got.reasoning, c.reasoning) << c.text;
      ASSERT_EQ(got.content, c.content) << c.text;
      testing::expect_same_calls(got.tool_calls, r.tool_calls, c.text);
      EXPECT_EQ(p.tools_called(), !c.calls.empty()) << c.text;
    }
  }
}

TEST(ChatOutputParser, StreamingEqualsNonStreaming) {
  std::vector<std::string> texts = {
      "<think>\nA 🤔 B\n</think>\n\n答案 <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": "
      "\"é\"}}\n</tool_call>",
      "plain",
      "Reason</think>Text <tool_call>oops</tool_call>",
      "thinking <tool_call>\n<function=f>\n<parameter=a>\nz\n</parameter>\n</function>\n</tool_call>",
  };
  for (const char* tool_parser : {"hermes", "qwen3_coder"}) {
    for (const std::string& text : texts) {
      ChatParseResult want =
          ChatOutputParser(make_reasoning_parser("qwen3"), make_tool_parser(tool_parser, options_with_ids()))
              .parse(text);
      for (const testing::Chunking& c : chunkings(text, 20)) {
        ChatOutputParser p(make_reasoning_parser("qwen3"), make_tool_parser(tool_parser, options_with_ids()));
        ChatParseResult got = testing::stream_chat(p, c);
        ASSERT_EQ(got.reasoning, want.reasoning) << text;
        ASSERT_EQ(got.content, want.content) << text;
        testing::expect_same_calls(got.tool_calls, want.tool_calls, text);
        EXPECT_EQ(p.tools_called(), want.tools_called());
      }
    }
  }
}

TEST(ChatOutputParser, AppendKeepsOneEntryPerIndex) {
  ChatOutputParser p(nullptr, make_tool_parser("hermes", options_with_ids()));
  ChatDelta d = p.push("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1");
  d.append(p.push("}}"));
  d.append(p.finish());  // the block closes at the end of the output
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "f");
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"a\": 1}");
}

TEST(ChatOutputParser, WithoutParsersEverythingIsContent) {
  ChatOutputParser p(nullptr, nullptr);
  EXPECT_EQ(p.parse("<think>x</think><tool_call>").content, "<think>x</think><tool_call>");
  EXPECT_EQ(p.push("a").content, "a");
  EXPECT_TRUE(p.finish().empty());
}

TEST(ChatOutputParser, OpenAiJson) {
  std::vector<ToolCall> calls = {{"call-0", "f", "{\"x\": 1}"}};
  EXPECT_EQ(tool_calls_json(calls).dump(),
            R"([{"id":"call-0","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}}])");
  std::vector<ToolCallDelta> deltas = {{0, "call-0", "f", ""}, {1, "", "", "{}"}};
  EXPECT_EQ(tool_call_deltas_json(deltas).dump(),
            R"([{"index":0,"id":"call-0","type":"function","function":{"name":"f","arguments":""}},)"
            R"({"index":1,"function":{"arguments":"{}"}}])");
}

TEST(ToolChoice, Plans) {
  nlohmann::json tools = nlohmann::json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  ToolChoicePlan plan;
  // Absent with tools = "auto": needs --enable-auto-tool-choice (vLLM's 400).
  Status s = plan_tool_choice(nullptr, tools, false, true, &plan);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--enable-auto-tool-choice"), std::string::npos);
  EXPECT_TRUE(plan_tool_choice(nullptr, tools, true, true, &plan).ok());
  EXPECT_TRUE(plan.parse_tools);
  EXPECT_TRUE(plan_tool_choice(nullptr, nlohmann::json(), false, false, &plan).ok());
  EXPECT_FALSE(plan.parse_tools);
  EXPECT_TRUE(plan_tool_choice("none", tools, true, true, &plan).ok());
  EXPECT_FALSE(plan.parse_tools);
  EXPECT_TRUE(plan_tool_choice("required", tools, false, true, &plan).ok());
  EXPECT_TRUE(plan.parse_tools);
  EXPECT_FALSE(plan_tool_choice("required", nlohmann::json::array(), true, true, &plan).ok());
  EXPECT_FALSE(plan_tool_choice("required", tools, true, false, &plan).ok());
  EXPECT_FALSE(plan_tool_choice("sometimes", tools, true, true, &plan).ok());
  EXPECT_FALSE(plan_tool_choice(3, tools, true, true, &plan).ok());
  nlohmann::json named = nlohmann::json::parse(R"({"type": "function", "function": {"name": "f"}})");
  EXPECT_TRUE(plan_tool_choice(named, tools, false, true, &plan).ok());
  EXPECT_TRUE(plan.parse_tools);
  EXPECT_EQ(plan.only_function, "f");
  named["function"]["name"] = "g";
  s = plan_tool_choice(named, tools, true, true, &plan);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'g'"), std::string::npos);
  EXPECT_FALSE(plan_tool_choice(nlohmann::json::parse(R"({"type": "function"})"), tools, true, true, &plan).ok());
  // Wrong member types are 400s, not exceptions.
  EXPECT_FALSE(
      plan_tool_choice(nlohmann::json::parse(R"({"type": 5, "function": {"name": "f"}})"), tools, true, true, &plan)
          .ok());
  nlohmann::json odd_tools = nlohmann::json::parse(R"([{"function": {"name": 7}}, 3, {"function": "f"}])");
  EXPECT_FALSE(plan_tool_choice(named, odd_tools, true, true, &plan).ok());
  named["function"]["name"] = 1;
  EXPECT_FALSE(plan_tool_choice(named, tools, true, true, &plan).ok());
}

TEST(ToolCallId, VllmShape) {
  std::string a = make_tool_call_id();
  std::string b = make_tool_call_id();
  EXPECT_NE(a, b);
  ASSERT_EQ(a.size(), std::string("chatcmpl-tool-").size() + 32);
  EXPECT_EQ(a.rfind("chatcmpl-tool-", 0), 0u);
  for (char c : a.substr(14)) EXPECT_TRUE(std::isxdigit(static_cast<unsigned char>(c)) && !std::isupper(c));
}

TEST(StreamText, Utf8Holdback) {
  Utf8Holdback h;
  h.append("a\xE4\xB8");  // "a" + 2 of 3 bytes of 中
  EXPECT_EQ(h.take(), "a");
  h.append("\xAD");
  EXPECT_EQ(h.take(), "\xE4\xB8\xAD");
  h.append("\xF0\x9F");
  EXPECT_EQ(h.take(), "");
  EXPECT_EQ(h.flush(), "\xF0\x9F");
  h.append("\x80\x80\x80\x80");  // stray continuation bytes are passed on
  EXPECT_EQ(h.take(), "\x80\x80\x80\x80");
}

}  // namespace
}  // namespace tessera::server
