// Random outputs stitched from tags, partial tags, JSON pieces, whitespace and multibyte text:
// no parser may crash, every split of a text must stream to the same result, and where the
// parser promises it (all but the one documented hermes gap) streaming equals parse().
#include <gtest/gtest.h>

#include <iostream>
#include <map>

#include "parsers_test_util.h"

namespace tessera::server {
namespace {

using testing::Chunking;

const std::vector<std::string>& pieces() {
  static const std::vector<std::string> p = {
      "<think>",
      "</think>",
      "<tool_call>",
      "</tool_call>",
      "<function=",
      "<function=f>",
      "<function=get_weather>",
      "</function>",
      "<parameter=",
      "<parameter=city>",
      "<parameter=days>",
      "</parameter>",
      "\n",
      " ",
      "  \n",
      "{",
      "}",
      "[",
      "]",
      "\"",
      "\\",
      ":",
      ",",
      "\"name\"",
      "\"arguments\"",
      "\"f\"",
      "1",
      "true",
      "null",
      "{\"name\": \"f\", \"arguments\": {\"x\": 1}}",
      "{\"name\": \"g\"}",
      "<",
      ">",
      "</",
      "<thi",
      "</thi",
      "nk>",
      "<tool_",
      "_call>",
      "<func",
      "tion=",
      "中",
      "文",
      "🙂",
      "é",
      "abc",
      "Paris",
      "3.5",
      "\t",
  };
  return p;
}

std::string random_pieces(std::mt19937& rng, size_t n_pieces) {
  std::string s;
  for (size_t i = 0; i < n_pieces; ++i) s += pieces()[rng() % pieces().size()];
  return s;
}

std::string random_word(std::mt19937& rng) {
  static const std::vector<std::string> words = {"Paris", "東京", "🙂", "a\"b", "x y",
                                                 "42",    "-1.5", "true", "null", "é"};
  return words[rng() % words.size()];
}

// Well-formed calls in both formats, plain text and random pieces; a third of the texts then
// get a random byte range deleted or a random piece inserted.
std::string random_text(std::mt19937& rng, size_t n_segments) {
  std::string s;
  for (size_t i = 0; i < n_segments; ++i) {
    switch (rng() % 5) {
      case 0:
        s += "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": " +
             nlohmann::json(random_word(rng)).dump() + ", \"days\": [" + std::to_string(rng() % 9) +
             "]}}\n</tool_call>";
        break;
      case 1:
        s += "<tool_call>\n<function=get_weather>\n<parameter=city>\n" + random_word(rng) +
             "\n</parameter>\n<parameter=days>\n" + random_word(rng) + "\n</parameter>\n</function>\n</tool_call>";
        break;
      case 2:
        s += random_word(rng) + " " + random_word(rng) + "\n";
        break;
      default:
        s += random_pieces(rng, 1 + rng() % 6);
    }
  }
  if (rng() % 3 == 0 && !s.empty()) {
    size_t at = rng() % s.size();
    if (rng() % 2)
      s.erase(at, rng() % 8);
    else
      s.insert(at, pieces()[rng() % pieces().size()]);
  }
  return s;
}

std::vector<Chunking> some_chunkings(const std::string& text, std::mt19937& rng) {
  std::vector<Chunking> out;
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  out.push_back(testing::cut_at(text, every));
  for (int r = 0; r < 4; ++r) {
    std::vector<size_t> cuts;
    for (size_t pos = rng() % 5; pos < text.size(); pos += 1 + rng() % 9) cuts.push_back(pos);
    out.push_back(testing::cut_at(text, cuts));
  }
  return out;
}

const nlohmann::json& tools() {
  static const nlohmann::json t = nlohmann::json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}}}}}])");
  return t;
}

TEST(ParserFuzz, ReasoningParsers) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 400; ++iter) {
    std::string text = random_text(rng, 1 + rng() % 8);
    for (const char* name : {"qwen3", "deepseek_r1"}) {
      auto proto = make_reasoning_parser(name);
      ReasoningResult want = proto->parse(text);
      for (const Chunking& c : some_chunkings(text, rng)) {
        ReasoningResult got = testing::stream_reasoning(*proto, c, testing::is_valid_utf8(text));
        ASSERT_EQ(got.reasoning, want.reasoning) << name << ": " << text;
        ASSERT_EQ(got.content, want.content) << name << ": " << text;
      }
    }
  }
}

TEST(ParserFuzz, ToolParsers) {
  std::mt19937 rng(11);
  std::map<std::string, int> texts_with_calls;
  for (int iter = 0; iter < 400; ++iter) {
    std::string text = random_text(rng, 1 + rng() % 8);
    for (const char* name : {"hermes", "qwen3_coder"}) {
      ToolParserOptions o;
      o.tools = tools();
      o.make_id = testing::counting_ids();
      auto proto = make_tool_parser(name, o);
      ToolParseResult want = proto->parse(text);
      if (want.tools_called()) ++texts_with_calls[name];
      for (const ToolCall& call : want.tool_calls) {
        EXPECT_TRUE(nlohmann::json::accept(call.arguments)) << name << ": " << text << " -> " << call.arguments;
        EXPECT_FALSE(call.name.empty());
      }
      ToolParseResult whole = testing::stream_tools(*proto, {text}, testing::is_valid_utf8(text));
      // hermes' documented gap: a call streamed before a malformed block. Everywhere else the
      // streaming result is the parse() result.
      bool gap = std::string(name) == "hermes" && !want.tools_called() && whole.tools_called();
      if (!gap) {
        ASSERT_EQ(whole.content, want.content) << name << ": " << text;
        testing::expect_same_calls(whole.tool_calls, want.tool_calls, text);
      }
      for (const Chunking& c : some_chunkings(text, rng)) {
        ToolParseResult got = testing::stream_tools(*proto, c, testing::is_valid_utf8(text));
        ASSERT_EQ(got.content, whole.content) << name << ": " << text;
        testing::expect_same_calls(got.tool_calls, whole.tool_calls, std::string(name) + ": " + text);
      }
    }
  }
  // The generator must reach the interesting paths, not only plain text.
  EXPECT_GT(texts_with_calls["hermes"], 20);
  EXPECT_GT(texts_with_calls["qwen3_coder"], 20);
  std::cout << "texts with calls: hermes " << texts_with_calls["hermes"] << ", qwen3_coder "
            << texts_with_calls["qwen3_coder"] << " of 400\n";
}

TEST(ParserFuzz, RandomBytes) {
  // Arbitrary bytes, including invalid UTF-8: no crash, split-invariant (UTF-8 checks off).
  std::mt19937 rng(13);
  for (int iter = 0; iter < 200; ++iter) {
    std::string text;
    size_t n = rng() % 200;
    for (size_t i = 0; i < n; ++i) text += static_cast<char>(rng() % 4 == 0 ? "<>/{}\"\\"[rng() % 7] : rng() % 256);
    auto rp = make_reasoning_parser("qwen3");
    ReasoningResult r = rp->parse(text);
    for (const char* name : {"hermes", "qwen3_coder"}) {
      auto tp = make_tool_parser(name);
      ToolParseResult whole = testing::stream_tools(*tp, {text}, false);
      for (const Chunking& c : some_chunkings(text, rng)) {
        ToolParseResult got = testing::stream_tools(*tp, c, false);
        ASSERT_EQ(got.content, whole.content);
        ASSERT_EQ(got.tool_calls.size(), whole.tool_calls.size());
      }
      tp->parse(text);
    }
    for (const Chunking& c : some_chunkings(text, rng)) {
      ReasoningResult got = testing::stream_reasoning(*rp, c, false);
      ASSERT_EQ(got.reasoning, r.reasoning);
      ASSERT_EQ(got.content, r.content);
    }
  }
}

}  // namespace
}  // namespace tessera::server
