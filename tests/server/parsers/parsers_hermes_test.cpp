#include <gtest/gtest.h>

#include <chrono>

#include "parsers_test_util.h"

namespace tessera::server {
namespace {

using testing::chunkings;
using testing::stream_tools;

std::unique_ptr<ToolParser> hermes(std::string only_function = "") {
  ToolParserOptions o;
  o.make_id = testing::counting_ids();
  o.only_function = std::move(only_function);
  return make_tool_parser("hermes", std::move(o));
}

TEST(HermesToolParser, NoCallIsContent) {
  ToolParseResult r = hermes()->parse("The weather in Paris is sunny.");
  EXPECT_EQ(r.content, "The weather in Paris is sunny.");
  EXPECT_FALSE(r.tools_called());
}

TEST(HermesToolParser, QwenTemplateShape) {
  // Exactly what Qwen3's chat template renders for an assistant tool call.
  std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"celsius\"}}\n</tool_call>";
  ToolParseResult r = hermes()->parse(text);
  EXPECT_EQ(r.content, "Let me check.\n");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"city\": \"Paris\", \"unit\": \"celsius\"}");
  EXPECT_EQ(r.tool_calls[0].id, "call-0");
  EXPECT_TRUE(nlohmann::json::accept(r.tool_calls[0].arguments));
}

TEST(HermesToolParser, ParallelCallsAndDroppedText) {
  std::string text =
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\nand\n<tool_call>\n{\"arguments\": [1, "
      "{\"k\": \"}\"}], \"name\": \"b\"}\n</tool_call>\ntrailing";
  ToolParseResult r = hermes()->parse(text);
  EXPECT_EQ(r.content, "");  // vLLM: only the text before the first call is content
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "a");
  EXPECT_EQ(r.tool_calls[0].arguments, "{}");
  EXPECT_EQ(r.tool_calls[1].name, "b");  // "arguments" before "name" works too
  EXPECT_EQ(r.tool_calls[1].arguments, "[1, {\"k\": \"}\"}]");
}

TEST(HermesToolParser, MissingArgumentsMeansEmptyObject) {
  ToolParseResult r = hermes()->parse("<tool_call>{\"name\": \"now\"}</tool_call>");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{}");
}

TEST(HermesToolParser, UnclosedButCompleteJsonIsACall) {
  // The model stopped (EOS) before writing </tool_call>.
  ToolParseResult r = hermes()->parse("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"x\": 1}");
}

TEST(HermesToolParser, MalformedDegradesToContent) {
  // vLLM: any block that is not valid JSON -> no calls, the whole output is content.
  for (std::string text : {
           std::string("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}\n</tool_call>"),  // missing }
           std::string("Sure <tool_call>not json</tool_call>"),
           std::string("<tool_call>{\"arguments\": {}}</tool_call>"),               // no name
           std::string("<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>"),  // name not a string
           std::string("<tool_call>[\"name\", \"f\"]</tool_call>"),                 // not an object
           std::string("<tool_call>{\"name\": \"f\", \"arguments\": {}}} extra</tool_call>"),
           std::string("<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": tru}}</tool_call>"),
           std::string("<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": \"unterminated}}"),
           std::string("<tool_call>"),
           "<tool_call>{\"name\": \"f\", \"arguments\": " + std::string(300, '[') + std::string(300, ']') +
               "}</tool_call>",  // deeper than 256
           std::string("<tool_call><tool_call><tool_call>"),
           std::string("{\"name\": \"f\"}</tool_call>"),  // no opening tag: plain text
           std::string("<tool_call>{\"name\": \"ok\", \"arguments\": {}}</tool_call><tool_call>{bad}</tool_call>"),
       }) {
    ToolParseResult r = hermes()->parse(text);
    EXPECT_FALSE(r.tools_called()) << text;
    EXPECT_EQ(r.content, text);
  }
}

TEST(HermesToolParser, StreamingShape) {
  auto p = hermes();
  ToolStreamDelta d = p->push("Checking <tool");
  EXPECT_EQ(d.content, "Checking ");  // "<tool" might be a tag: held
  d = p->push("_call>\n{\"name\": \"get_wea");
  EXPECT_TRUE(d.empty());
  d = p->push("ther\", \"arguments\": {\"city\": ");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].index, 0);
  EXPECT_EQ(d.tool_calls[0].id, "call-0");
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"city\": ");
  d = p->push("\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}");
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(d.tool_calls[0].index, 0);
  EXPECT_TRUE(d.tool_calls[0].id.empty());
  EXPECT_EQ(d.tool_calls[0].arguments, "\"Paris\"}");
  EXPECT_EQ(d.tool_calls[1].index, 1);
  EXPECT_EQ(d.tool_calls[1].name, "b");
  EXPECT_EQ(d.tool_calls[1].arguments, "{}");
  d = p->finish();
  EXPECT_TRUE(d.empty());
}

TEST(HermesToolParser, StreamingFallsBackToContentWhenNothingWasSent) {
  auto p = hermes();
  std::string got;
  for (std::string_view piece : {"I will use <tool_", "call> tags", " later", "</tool_call>!"})
    got += p->push(piece).content;
  got += p->finish().content;
  EXPECT_EQ(got, "I will use <tool_call> tags later</tool_call>!");
}

TEST(HermesToolParser, NamedToolChoiceDropsOtherCalls) {
  std::string text =
      "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": "
      "{\"x\": 2}}</tool_call>";
  ToolParseResult r = hermes("b")->parse(text);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "b");
  EXPECT_EQ(r.tool_calls[0].id, "call-0");  // still index 0
  for (const testing::Chunking& c : chunkings(text, 10)) {
    ToolParseResult s = stream_tools(*hermes("b"), c);
    testing::expect_same_calls(s.tool_calls, r.tool_calls, text);
  }
}

// parallel_tool_calls false: the first call only, streaming or not.
TEST(HermesToolParser, SingleCallKeepsTheFirst) {
  const std::string text =
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", "
      "\"arguments\": {}}\n</tool_call>";
  ToolParserOptions o;
  o.make_id = testing::counting_ids();
  o.single_call = true;
  auto p = make_tool_parser("hermes", o);
  ToolParseResult r = p->parse(text);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "a");
  for (const testing::Chunking& c : chunkings(text, 10)) {
    ToolParseResult s = stream_tools(*p, c);
    testing::expect_same_calls(s.tool_calls, r.tool_calls, text);
  }
  EXPECT_EQ(hermes()->parse(text).tool_calls.size(), 2u);
}

TEST(HermesToolParser, QwenAliasAndUnknownName) {
  EXPECT_TRUE(make_tool_parser("qwen3")->parse("<tool_call>{\"name\": \"f\"}</tool_call>").tools_called());
  try {
    make_tool_parser("mistral");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hermes, qwen3, qwen3_coder, qwen3_xml"), std::string::npos) << e.what();
  }
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = {
      "Plain answer, no tools. 价格是 ¥100 🙂 a<b",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Tokyo\", \"unit\": \"celsius\"}}\n"
      "</tool_call>",
      "I'll look both up.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"北京 天气 🌧\", \"n\": "
      "3, "
      "\"filters\": {\"lang\": [\"zh\", \"en\"], \"safe\": true, \"x\": null, \"esc\": \"quote \\\" brace } bracket "
      "] tag </tool_call\"}}}\n</tool_call>\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"2*(3+4)\"}}"
      "\n</tool_call>",
      "<tool_call>{\"arguments\":{\"a\":[1,2,{\"b\":\"c\"}]},\"name\":\"compact\"}</tool_call>",
      "<tool_call>\n{\"name\": \"scalar_args\", \"arguments\": 42}\n</tool_call>",
      "<tool_call>\n{\"name\": \"string_args\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>",
      "<tool_call>\n{\"name\": \"no_close\", \"arguments\": {\"k\": \"v\"}}\n",
      "<tool_call>{\"name\": \"esc\\u0061pe\\\"d\", \"arguments\": {}}</tool_call>",
      // Malformed: the streaming path must match because nothing was sent before the fault.
      "Text then <tool_call>no json here</tool_call> and more <tool_call>{\"name\": \"x\"}</tool_call>",
      "<tool_call>{\"arguments\": {}}</tool_call>",
      "<tool_call>\n{\"name\": 3}\n</tool_call>",
      "<tool_call><tool_call>{\"name\": \"f\"}</tool_call>",
      "a</tool_call>b<tool_cal",
  };
  return texts;
}

TEST(HermesToolParser, StreamingEqualsNonStreaming) {
  auto proto = hermes();
  for (const std::string& text : corpus()) {
    ToolParseResult want = proto->parse(text);
    for (const testing::Chunking& c : chunkings(text)) {
      ToolParseResult got = stream_tools(*proto, c);
      ASSERT_EQ(got.content, want.content) << text;
      testing::expect_same_calls(got.tool_calls, want.tool_calls, text);
    }
  }
}

TEST(HermesToolParser, MalformedAfterASentCallNeverCrashesAndIsSplitInvariant) {
  // The one case streaming cannot match (vLLM has the same gap): a call was already sent
  // when a later block (or the rest of its own block) turns out malformed. Streaming keeps what
  // it sent; every split agrees.
  std::vector<std::string> texts = {
      "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}</tool_call><tool_call>{\"name\": \"b\", "
      "\"arguments\": {\"y\": [1, 2}}</tool_call>",
      "<tool_call>{\"name\": \"deep\", \"arguments\": " + std::string(300, '[') + std::string(300, ']') +
          "}</tool_call>",
      "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}} trailing junk</tool_call>",
  };
  auto proto = hermes();
  for (const std::string& text : texts) {
    EXPECT_EQ(proto->parse(text).content, text);
    ToolParseResult first = stream_tools(*proto, {text});
    EXPECT_TRUE(first.tools_called()) << text;
    for (const testing::Chunking& c : chunkings(text, 20)) {
      ToolParseResult got = stream_tools(*proto, c);
      EXPECT_EQ(got.content, first.content);
      testing::expect_same_calls(got.tool_calls, first.tool_calls, text);
    }
  }
  ToolParseResult deep = stream_tools(*proto, {texts[1]});
  EXPECT_EQ(deep.tool_calls[0].arguments, std::string(256, '['));  // cut where it turned malformed
}

TEST(HermesToolParser, AdversarialInputsTakeLinearTime) {
  using testing::repeat;
  std::vector<std::function<std::string(size_t)>> inputs = {
      [](size_t n) { return repeat("<tool_call>", n); },
      [](size_t n) { return repeat("<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": [", n); },
      [](size_t n) { return "<tool_call>{\"name\": \"f\", \"arguments\": " + repeat("[", n); },
      [](size_t n) { return "<tool_call>{\"name\": \"f\", \"arguments\": " + repeat("{\"a\":", n); },
      [](size_t n) { return repeat("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", n); },
      [](size_t n) { return repeat("</tool_call", n); },
      [](size_t n) { return repeat("<", n); },
      [](size_t n) { return "<tool_call>{\"name\": \"" + repeat("\\\\", n); },
      [](size_t n) { return "<tool_call>{\"name\": \"f\", \"arguments\": \"" + repeat("x", n) + "\"}"; },
  };
  for (const auto& make : inputs) {
    testing::expect_linear(
        [](const std::string& in) {
          auto p = hermes();
          p->parse(in);
          std::unique_ptr<ToolParser> s = p->fresh();
          for (size_t i = 0; i < in.size(); i += 5) s->push(std::string_view(in).substr(i, 5));
          s->finish();
        },
        make);
  }
}

}  // namespace
}  // namespace tessera::server
