#include <gtest/gtest.h>

#include <chrono>

#include "parsers_test_util.h"

namespace tessera::server {
namespace {

using testing::chunkings;
using testing::stream_tools;

const nlohmann::json& tools() {
  static const nlohmann::json t = nlohmann::json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"},
      "metric": {"type": "boolean"}, "opts": {"type": "object"}, "tags": {"type": "array"},
      "note": {"type": ["string", "null"]}, "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
      "any": {"description": "no type"}}}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
      "path": {"type": "string"}, "content": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "no_params"}}
  ])");
  return t;
}

std::unique_ptr<ToolParser> coder(std::string only_function = "") {
  ToolParserOptions o;
  o.tools = tools();
  o.make_id = testing::counting_ids();
  o.only_function = std::move(only_function);
  return make_tool_parser("qwen3_coder", std::move(o));
}

TEST(Qwen3CoderToolParser, TemplateShape) {
  std::string text =
      "I'll check the weather.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  ToolParseResult r = coder()->parse(text);
  EXPECT_EQ(r.content, "I'll check the weather.\n");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"city\": \"San Francisco\", \"days\": 3}");
  EXPECT_EQ(r.tool_calls[0].id, "call-0");
}

nlohmann::json args_of(std::string_view params) {
  std::string text = "<tool_call>\n<function=get_weather>\n" + std::string(params) + "</function>\n</tool_call>";
  ToolParseResult r = coder()->parse(text);
  EXPECT_EQ(r.tool_calls.size(), 1u) << text;
  if (r.tool_calls.empty()) return nullptr;
  EXPECT_TRUE(nlohmann::json::accept(r.tool_calls[0].arguments)) << r.tool_calls[0].arguments;
  return nlohmann::json::parse(r.tool_calls[0].arguments, nullptr, false);
}

TEST(Qwen3CoderToolParser, SchemaTypes) {
  nlohmann::json a = args_of(
      "<parameter=days>\n 7 \n</parameter>\n<parameter=temp>\n21.5\n</parameter>\n<parameter=metric>\nTrue\n"
      "</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=tags>\n[\"x\", \"y\"]\n</parameter>\n"
      "<parameter=city>\n42\n</parameter>\n");
  EXPECT_EQ(a["days"], 7);
  EXPECT_EQ(a["temp"], 21.5);
  EXPECT_EQ(a["metric"], true);
  EXPECT_EQ(a["opts"], nlohmann::json::parse(R"({"a": [1, 2]})"));
  EXPECT_EQ(a["tags"], nlohmann::json::parse(R"(["x", "y"])"));
  EXPECT_EQ(a["city"], "42");  // string type keeps the text
}

TEST(Qwen3CoderToolParser, SchemaTypeFallbacks) {
  nlohmann::json a = args_of(
      "<parameter=days>\nthree\n</parameter>\n<parameter=temp>\n5.0\n</parameter>\n<parameter=metric>\nyes\n"
      "</parameter>\n<parameter=opts>\n{not json}\n</parameter>\n<parameter=unknown>\n12\n</parameter>\n"
      "<parameter=any>\n12\n</parameter>\n");
  EXPECT_EQ(a["days"], "three");  // not an integer: stays a string
  EXPECT_EQ(a["temp"], 5);        // integral float becomes an int, as in vLLM
  EXPECT_EQ(a["metric"], false);  // vLLM: anything but "true" is false
  EXPECT_EQ(a["opts"], "{not json}");
  EXPECT_EQ(a["unknown"], "12");  // not in the schema: string
  EXPECT_EQ(a["any"], "12");      // no type: string
}

TEST(Qwen3CoderToolParser, DeeplyNestedValueStaysAString) {
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  nlohmann::json a = args_of("<parameter=tags>\n" + deep + "\n</parameter>\n<parameter=opts>\n[[[1]]]\n</parameter>\n");
  EXPECT_EQ(a["tags"], deep);
  EXPECT_EQ(a["opts"], nlohmann::json::parse("[[[1]]]"));
}

TEST(Qwen3CoderToolParser, Nulls) {
  nlohmann::json a = args_of(
      "<parameter=note>\nnull\n</parameter>\n<parameter=limit>\nNone\n</parameter>\n<parameter=city>\nnull\n"
      "</parameter>\n<parameter=days>\nnull\n</parameter>\n");
  EXPECT_TRUE(a["note"].is_null());   // nullable string
  EXPECT_TRUE(a["limit"].is_null());  // anyOf with null
  EXPECT_EQ(a["city"], "null");       // plain string keeps the text
  EXPECT_TRUE(a["days"].is_null());   // non-string types map "null" to null
}

TEST(Qwen3CoderToolParser, MultilineValueKeepsInnerNewlinesAndTags) {
  std::string code = "def f():\n    return '<tool_call>' + \"</function>\"\n\n";
  std::string text =
      "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n</parameter>\n"
      "<parameter=content>\n" +
      code + "\n</parameter>\n</function>\n</tool_call>";
  ToolParseResult r = coder()->parse(text);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  nlohmann::json a = nlohmann::json::parse(r.tool_calls[0].arguments);
  EXPECT_EQ(a["path"], "/tmp/a.py");
  EXPECT_EQ(a["content"], code);
}

TEST(Qwen3CoderToolParser, ParallelCallsAndNoParams) {
  std::string text =
      "<tool_call>\n<function=no_params>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>\nbye";
  ToolParseResult r = coder()->parse(text);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "no_params");
  EXPECT_EQ(r.tool_calls[0].arguments, "{}");
  EXPECT_EQ(r.tool_calls[1].arguments, "{\"city\": \"Oslo\"}");
  EXPECT_EQ(r.tool_calls[1].id, "call-1");
}

TEST(Qwen3CoderToolParser, TruncatedOutputs) {
  // Cut off inside a value: the value so far is the argument; the call is closed.
  ToolParseResult r = coder()->parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nPar");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"city\": \"Par\"}");
  // Forgotten </parameter>: closing markup after the value is not part of it.
  r = coder()->parse("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</function>\n</tool_call>\n");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"city\": \"Rome\"}");
  // Cut off inside the function name: not a call, stays text.
  r = coder()->parse("ok <tool_call>\n<function=get_wea");
  EXPECT_FALSE(r.tools_called());
  EXPECT_EQ(r.content, "ok <tool_call>\n<function=get_wea");
}

TEST(Qwen3CoderToolParser, NotACallStaysContent) {
  for (std::string text : {
           std::string("Use <tool_call> tags like this."),
           std::string("<tool_call>{\"name\": \"hermes style\"}</tool_call>"),
           std::string("<tool_call>\n<function={{ tool.name }}>\n</function>\n</tool_call>"),
           std::string("<tool_call><function=two words></function></tool_call>"),
           std::string("<tool_call><tool_call><tool_call>"),
           std::string("</function></parameter><parameter=x>"),
       }) {
    ToolParseResult r = coder()->parse(text);
    EXPECT_FALSE(r.tools_called()) << text;
    EXPECT_EQ(r.content, text);
  }
  // A mention before a real call stays content; the real call is parsed.
  ToolParseResult r =
      coder()->parse("About <tool_call>: here goes.\n<tool_call>\n<function=no_params>\n</function>\n</tool_call>");
  EXPECT_EQ(r.content, "About <tool_call>: here goes.\n");
  ASSERT_EQ(r.tool_calls.size(), 1u);
}

TEST(Qwen3CoderToolParser, StreamingShape) {
  auto p = coder();
  ToolStreamDelta d = p->push("Sure.\n<tool_call>\n<function=get_we");
  EXPECT_EQ(d.content, "Sure.\n");
  EXPECT_TRUE(d.tool_calls.empty());
  d = p->push("ather>\n<parameter=city>\nPa");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].id, "call-0");
  EXPECT_EQ(d.tool_calls[0].arguments, "{");
  d = p->push("ris\n</parameter>\n<parameter=days>\n2\n</param");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_TRUE(d.tool_calls[0].id.empty());
  EXPECT_EQ(d.tool_calls[0].arguments, "\"city\": \"Paris\"");
  d = p->push("eter>\n</function>\n</tool_call>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, ", \"days\": 2}");
  EXPECT_TRUE(p->finish().empty());
}

TEST(Qwen3CoderToolParser, OddToolSchemasAreHarmless) {
  ToolParserOptions o;
  o.tools = nlohmann::json::parse(R"([3, {"function": 1}, {"function": {"name": 2}},
      {"function": {"name": "f", "parameters": {"properties": []}}},
      {"function": {"name": "g", "parameters": {"properties": {"a": 5, "b": {"type": 7}, "c": {"anyOf": 1}}}}}])");
  auto p = make_tool_parser("qwen3_coder", o);
  ToolParseResult r = p->parse(
      "<tool_call><function=g><parameter=a>1</parameter><parameter=b>2</parameter><parameter=c>3</parameter>"
      "</function></tool_call><tool_call><function=f><parameter=a>x</parameter></function></tool_call>");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"a\": \"1\", \"b\": \"2\", \"c\": \"3\"}");
  EXPECT_EQ(r.tool_calls[1].arguments, "{\"a\": \"x\"}");
  o.tools = nullptr;
  EXPECT_EQ(
      make_tool_parser("qwen3_coder", o)->parse("<tool_call><function=f></function></tool_call>").tool_calls.size(),
      1u);
}

TEST(Qwen3CoderToolParser, NamedToolChoice) {
  std::string text =
      "<tool_call>\n<function=no_params>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";
  ToolParseResult r = coder("get_weather")->parse(text);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = {
      "Just text with <angle> brackets, 日本語 and 🚀.",
      "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n東京 🗼\n</parameter>\n<parameter=days>\n5\n"
      "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=opts>\n{\"a\": {\"b\": [1, \"ü\"]}}\n"
      "</parameter>\n</function>\n</tool_call>",
      "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/main.cpp\n</parameter>\n<parameter=content>\n"
      "#include <cstdio>\nint main() { printf(\"<tool_call>\\n\"); }\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=no_params>\n</function>\n</tool_call>",
      "<tool_call><function=get_weather><parameter=temp>-3.25</parameter></function></tool_call>",
      "Mention <tool_call> first.\n<tool_call>\n<function=no_params>\n</function>\n</tool_call>",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</function>\n</tool_call>\n",
      "<tool_call>\n<function=get_weather>\n<parameter=ci",
      "x <tool_call>\n<function=get_wea",
      "<tool_call>\n<function=bad name>\n</function>\n</tool_call>",
      "<tool_call><tool_call>\n<function=no_params></function></tool_call>",
      "<tool_call>\n<function=no_params>\n</function>\n</tool_call>\n<tool_call>junk</"
      "tool_call>\n<function=get_weather>"
      "\n<parameter=days>\n1\n</parameter>\n</function>",
      "<tool_call>\n<function=unknown_tool>\n<parameter=x>\n{\"y\": 1}\n</parameter>\n</function>\n</tool_call>",
  };
  return texts;
}

TEST(Qwen3CoderToolParser, StreamingEqualsNonStreaming) {
  auto proto = coder();
  for (const std::string& text : corpus()) {
    ToolParseResult want = proto->parse(text);
    for (const ToolCall& c : want.tool_calls) EXPECT_TRUE(nlohmann::json::accept(c.arguments)) << c.arguments;
    for (const testing::Chunking& c : chunkings(text)) {
      ToolParseResult got = stream_tools(*proto, c);
      ASSERT_EQ(got.content, want.content) << text;
      testing::expect_same_calls(got.tool_calls, want.tool_calls, text);
    }
  }
}

TEST(Qwen3CoderToolParser, AdversarialInputsTakeLinearTime) {
  using testing::repeat;
  std::vector<std::function<std::string(size_t)>> inputs = {
      [](size_t n) { return repeat("<tool_call>", n); },
      [](size_t n) { return repeat("<tool_call>   \n", n); },
      [](size_t n) { return repeat("<tool_call>\n<function=", n); },
      [](size_t n) { return repeat("<tool_call>\n<function=abc", n); },
      [](size_t n) { return "<tool_call>" + std::string(n, ' ') + "x"; },
      [](size_t n) { return "<tool_call><function=" + std::string(n, 'a') + " "; },
      [](size_t n) { return repeat("<tool_call><function=f><parameter=x>1</parameter></function></tool_call>", n); },
      [](size_t n) { return "<tool_call><function=f><parameter=x>" + repeat("</parameter", n); },
      [](size_t n) { return "<tool_call><function=f>" + repeat("<parameter=", n); },
      [](size_t n) { return "<tool_call><function=f><parameter=x>\n" + repeat("</function>\n", n); },
      [](size_t n) { return repeat("</function>", n); },
  };
  for (const auto& make : inputs) {
    testing::expect_linear(
        [](const std::string& in) {
          auto p = coder();
          p->parse(in);
          std::unique_ptr<ToolParser> s = p->fresh();
          for (size_t i = 0; i < in.size(); i += 7) s->push(std::string_view(in).substr(i, 7));
          s->finish();
        },
        make);
  }
}

}  // namespace
}  // namespace tessera::server
