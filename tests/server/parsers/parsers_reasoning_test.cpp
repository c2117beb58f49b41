#include <gtest/gtest.h>

#include <chrono>

#include "parsers_test_util.h"

namespace tessera::server {
namespace {

using testing::chunkings;
using testing::stream_reasoning;

ReasoningResult parse(std::string_view name, std::string_view text, bool enable_thinking = true) {
  return make_reasoning_parser(name, {.enable_thinking = enable_thinking})->parse(text);
}

TEST(ReasoningParser, Qwen3ModelWritesThinkBlock) {
  // Qwen3 (up to 2507) writes <think> itself; vLLM keeps the newlines on both sides.
  ReasoningResult r = parse("qwen3", "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?");
  EXPECT_EQ(r.reasoning, "\nThe user greets me.\n");
  EXPECT_EQ(r.content, "\n\nHello! How can I help?");
}

TEST(ReasoningParser, ThinkOpenedByThePrompt) {
  for (const char* name : {"qwen3", "deepseek_r1"}) {
    ReasoningResult r = parse(name, "Let me think.\n</think>\n\nThe answer is 4.");
    EXPECT_EQ(r.reasoning, "Let me think.\n") << name;
    EXPECT_EQ(r.content, "\n\nThe answer is 4.") << name;
  }
}

TEST(ReasoningParser, NoClosingTagIsAllReasoning) {
  // vLLM today: thinking enabled and no </think> means the output was cut off while thinking.
  for (const char* name : {"qwen3", "deepseek_r1"}) {
    EXPECT_EQ(parse(name, "still thinking about it").reasoning, "still thinking about it") << name;
    EXPECT_EQ(parse(name, "still thinking about it").content, "") << name;
    EXPECT_EQ(parse(name, "<think>still thinking").reasoning, "still thinking") << name;
  }
}

TEST(ReasoningParser, Qwen3ThinkingDisabledIsAllContent) {
  // The template put "<think>\n\n</think>\n\n" in the prompt; nothing is parsed.
  ReasoningResult r = parse("qwen3", "Hello there", false);
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Hello there");
  r = parse("qwen3", "a</think>b", false);
  EXPECT_EQ(r.content, "a</think>b");
  // deepseek_r1 has no such switch.
  EXPECT_EQ(parse("deepseek_r1", "a</think>b", false).reasoning, "a");
}

TEST(ReasoningParser, OptionsFromChatTemplateKwargs) {
  EXPECT_TRUE(reasoning_options_from_kwargs(nullptr).enable_thinking);
  EXPECT_TRUE(reasoning_options_from_kwargs(nlohmann::json::object()).enable_thinking);
  EXPECT_FALSE(reasoning_options_from_kwargs({{"enable_thinking", false}}).enable_thinking);
  EXPECT_TRUE(reasoning_options_from_kwargs({{"enable_thinking", true}}).enable_thinking);
  EXPECT_TRUE(reasoning_options_from_kwargs({{"enable_thinking", 0}}).enable_thinking);  // template tests `is false`
  EXPECT_TRUE(reasoning_options_from_kwargs(nlohmann::json::array()).enable_thinking);
}

TEST(ReasoningParser, EmptyAndEdgeOutputs) {
  EXPECT_EQ(parse("qwen3", "").reasoning, "");
  EXPECT_EQ(parse("qwen3", "").content, "");
  ReasoningResult r = parse("qwen3", "</think>");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "");
  r = parse("deepseek_r1", "<think></think>x");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "x");
  // Only the first <think> is markup; only the first </think> ends the reasoning.
  r = parse("qwen3", "<think>a<think>b</think>c</think>d");
  EXPECT_EQ(r.reasoning, "a<think>b");
  EXPECT_EQ(r.content, "c</think>d");
  // Near-tags are text.
  r = parse("qwen3", "<thin>k </think >x</think>");
  EXPECT_EQ(r.reasoning, "<thin>k </think >x");
  EXPECT_EQ(r.content, "");
}

TEST(ReasoningParser, Qwen3ToolCallEndsReasoningImplicitly) {
  // Qwen3.5 / Qwen3-Coder may open an XML tool call without closing </think>.
  ReasoningResult r =
      parse("qwen3", "I need the weather.\n<tool_call>\n<function=get_weather>\n</function>\n</tool_call>");
  EXPECT_EQ(r.reasoning, "I need the weather.\n");
  EXPECT_EQ(r.content, "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>");
  r = parse("qwen3", "x<tool_call><function name=\"f\">");
  EXPECT_EQ(r.reasoning, "x");
  // A mention of <tool_call> that is not followed by <function stays reasoning.
  r = parse("qwen3", "I could use <tool_call> here, or <tool_call>\n<func tion</think>ok");
  EXPECT_EQ(r.reasoning, "I could use <tool_call> here, or <tool_call>\n<func tion");
  EXPECT_EQ(r.content, "ok");
  r = parse("qwen3", "<tool_call></think>done");
  EXPECT_EQ(r.reasoning, "<tool_call>");
  EXPECT_EQ(r.content, "done");
  // Cut off right after the tag: reasoning.
  EXPECT_EQ(parse("qwen3", "a<tool_call>\n<functio").reasoning, "a<tool_call>\n<functio");
  // deepseek_r1 has no such rule.
  EXPECT_EQ(parse("deepseek_r1", "a<tool_call><function=f>").reasoning, "a<tool_call><function=f>");
}

TEST(ReasoningParser, StreamingTagSplitAcrossDeltas) {
  auto p = make_reasoning_parser("deepseek_r1");
  ReasoningDelta d1 = p->push("abc</thi");
  EXPECT_EQ(d1.reasoning, "abc");  // the possible tag is held back
  EXPECT_EQ(d1.content, "");
  ReasoningDelta d2 = p->push("nk>xyz");
  EXPECT_EQ(d2.reasoning, "");
  EXPECT_EQ(d2.content, "xyz");
  EXPECT_TRUE(p->reasoning_ended());
  ReasoningDelta d3 = p->push("</thi");  // after the reasoning nothing is held
  EXPECT_EQ(d3.content, "</thi");
  EXPECT_TRUE(p->finish().empty());
}

TEST(ReasoningParser, StreamingHeldPrefixIsFlushedAtFinish) {
  auto p = make_reasoning_parser("qwen3");
  EXPECT_EQ(p->push("a <").reasoning, "a ");
  ReasoningDelta end = p->finish();
  EXPECT_EQ(end.reasoning, "<");
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = {
      "<think>\nThe user asks 2+2. That is 4.\n</think>\n\nThe answer is **4**.",
      "Okay, the user wants a poem about the sea.\n</think>\n\nWaves roll in, waves roll out.",
      "<think>\n\n</think>\n\nHi!",
      "No tags at all, just an answer with < and > and </ and <t.",
      "Reasoning in 中文 and emoji 🤔 and Ünïcödé.</think>Answer: 好的 👍",
      "<think>nested <think> inner </think> outer</think> tail </think>",
      "thinking <tool_call>\n  <function=lookup>\n<parameter=q>\nx\n</parameter>\n</function>\n</tool_call>",
      "thinking <tool_call> about <tool_call><tool_call>\n\n<functio</think>final",
      "<<<think>>> </</think>>",
      "</think>",
      "<think>",
      "",
      "ends with a partial tag </thi",
      "ends with a partial call <tool_call>\n<func",
  };
  return texts;
}

TEST(ReasoningParser, StreamingEqualsNonStreaming) {
  for (const char* name : {"qwen3", "deepseek_r1"}) {
    for (bool thinking : {true, false}) {
      auto proto = make_reasoning_parser(name, {.enable_thinking = thinking});
      for (const std::string& text : corpus()) {
        ReasoningResult want = proto->parse(text);
        // Nothing is lost or invented.
        EXPECT_LE(want.reasoning.size() + want.content.size(), text.size());
        for (const testing::Chunking& c : chunkings(text)) {
          ReasoningResult got = stream_reasoning(*proto, c, /*check_utf8=*/true);
          ASSERT_EQ(got.reasoning, want.reasoning) << name << " text: " << text;
          ASSERT_EQ(got.content, want.content) << name << " text: " << text;
        }
      }
    }
  }
}

TEST(ReasoningParser, UnknownNameListsSupported) {
  try {
    make_reasoning_parser("deepseek_v3");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("deepseek_r1, qwen3"), std::string::npos) << e.what();
  }
}

TEST(ReasoningParser, AdversarialInputsTakeLinearTime) {
  using testing::repeat;
  std::vector<std::function<std::string(size_t)>> inputs = {
      [](size_t n) { return repeat("<tool_call>", n); },
      [](size_t n) { return repeat("<tool_call>   \n ", n); },
      [](size_t n) { return repeat("<tool_call>\n<functio", n); },
      [](size_t n) { return repeat("<think>", n); },
      [](size_t n) { return repeat("</thin", n); },
      [](size_t n) { return repeat("<", n); },
      [](size_t n) { return "<tool_call>" + std::string(n, ' ') + "x"; },
      [](size_t n) { return "</think>" + repeat("<tool_call>", n); },
  };
  for (const auto& make : inputs) {
    testing::expect_linear(
        [](const std::string& in) {
          auto p = make_reasoning_parser("qwen3");
          ReasoningResult whole = p->parse(in);
          std::unique_ptr<ReasoningParser> s = p->fresh();
          size_t total = 0;
          for (size_t i = 0; i < in.size(); i += 3) {
            ReasoningDelta d = s->push(std::string_view(in).substr(i, 3));
            total += d.reasoning.size() + d.content.size();
          }
          ReasoningDelta d = s->finish();
          total += d.reasoning.size() + d.content.size();
          EXPECT_EQ(total, whole.reasoning.size() + whole.content.size());
        },
        make);
  }
}

}  // namespace
}  // namespace tessera::server
