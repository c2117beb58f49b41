// Responses API translation and output items (src/server/responses_api.cpp), without the engine.
#include "server/responses_api.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace tessera::server {
namespace {

using ojson = nlohmann::ordered_json;

std::string refusal(const ojson& body) {
  try {
    responses_to_chat(body);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

// The data lines of an SSE text, parsed.
std::vector<ojson> events(const std::string& sse) {
  std::vector<ojson> out;
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    size_t end = sse.find('\n', pos);
    out.push_back(ojson::parse(sse.substr(pos + 6, end - pos - 6)));
    pos = end;
  }
  return out;
}

TEST(ResponsesApi, CodexInputBecomesChatMessagesInOrder) {
  ojson body = ojson::parse(R"({
    "model": "m", "instructions": "base", "stream": true, "max_output_tokens": 50,
    "input": [
      {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
      {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\":1}"},
      {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "r1"},
      {"role": "assistant", "content": "done"}
    ],
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}},
              {"type": "function", "name": "g"},
              {"type": "web_search"}, {"type": "namespace", "name": "ns", "tools": []}],
    "reasoning": {"summary": "auto"}, "store": false, "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "k", "parallel_tool_calls": true, "tool_choice": "auto"})");
  ResponsesRequest rq = responses_to_chat(body);
  const ojson& m = rq.chat["messages"];
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0], (ojson{{"role", "system"}, {"content", "base"}}));
  EXPECT_EQ(m[1], (ojson{{"role", "system"}, {"content", "dev"}}));
  EXPECT_EQ(m[2]["content"], "ab");
  EXPECT_EQ(m[3]["role"], "assistant");
  ASSERT_EQ(m[3]["tool_calls"].size(), 2u);  // consecutive calls: one assistant turn
  EXPECT_EQ(m[3]["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(m[3]["tool_calls"][1]["function"]["name"], "g");
  EXPECT_EQ(m[3]["reasoning_content"], "think");
  EXPECT_EQ(m[4], (ojson{{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "r1"}}));
  EXPECT_EQ(m[5]["content"], "done");
  ASSERT_EQ(rq.chat["tools"].size(), 2u);
  EXPECT_EQ(rq.chat["tools"][1]["function"]["parameters"]["type"], "object");
  EXPECT_EQ(rq.chat["tool_choice"], "auto");
  EXPECT_EQ(rq.chat["max_tokens"], 50);
  EXPECT_EQ(rq.chat["stream"], true);
  EXPECT_EQ(rq.ignored_tools, (std::vector<std::string>{"web_search", "namespace ns"}));
  EXPECT_TRUE(rq.reasoning_summary);
  EXPECT_EQ(rq.echo["tools"].size(), 2u);
}

TEST(ResponsesApi, ReasoningEffortNoneTurnsThinkingOff) {
  ResponsesRequest rq = responses_to_chat(ojson{{"input", "hi"}, {"reasoning", {{"effort", "none"}}}});
  EXPECT_EQ(rq.chat["chat_template_kwargs"]["enable_thinking"], false);
  rq = responses_to_chat(ojson{{"input", "hi"}, {"reasoning", {{"effort", "high"}}}});
  EXPECT_EQ(rq.chat["chat_template_kwargs"]["enable_thinking"], true);
  EXPECT_FALSE(rq.reasoning_summary);
  EXPECT_EQ(rq.chat["messages"], ojson::array({ojson{{"role", "user"}, {"content", "hi"}}}));
}

// text.format becomes the chat request's response_format (structured output compiles it there).
TEST(ResponsesApi, TextFormatBecomesResponseFormat) {
  const ojson format = {{"type", "json_schema"}, {"name", "n"}, {"schema", {{"type", "integer"}}}, {"strict", true}};
  ResponsesRequest rq = responses_to_chat({{"input", "x"}, {"text", {{"format", format}}}});
  EXPECT_EQ(rq.chat["response_format"]["type"], "json_schema");
  EXPECT_EQ(rq.chat["response_format"]["json_schema"]["schema"]["type"], "integer");
  EXPECT_EQ(rq.chat["response_format"]["json_schema"]["strict"], true);
  EXPECT_EQ(rq.echo["text"]["format"]["name"], "n");
  EXPECT_EQ(responses_to_chat({{"input", "x"}, {"text", {{"format", {{"type", "json_object"}}}}}})
                .chat["response_format"]["type"],
            "json_object");
  EXPECT_EQ(responses_to_chat({{"input", "x"}, {"parallel_tool_calls", false}}).chat["parallel_tool_calls"], false);
}

TEST(ResponsesApi, RefusalsSayWhatToSend) {
  EXPECT_NE(refusal({{"input", "x"}, {"previous_response_id", "resp_1"}}).find("send the whole conversation"),
            std::string::npos);
  EXPECT_NE(refusal({{"input", "x"}, {"tools", {{{"type", "custom"}, {"name", "apply_patch"}}}}})
                .find("declare 'apply_patch' as a function tool"),
            std::string::npos);
  EXPECT_NE(refusal({{"input", "x"}, {"text", {{"format", {{"type", "grammar"}}}}}}).find("not one of text"),
            std::string::npos);
  EXPECT_NE(refusal({{"input", "x"}, {"tool_choice", {{"type", "function"}, {"name", "nope"}}}}).find("'nope'"),
            std::string::npos);
  EXPECT_NE(refusal({{"input", "x"}, {"tool_choice", "required"}}).find("needs at least one function tool"),
            std::string::npos);
  EXPECT_NE(refusal(ojson::object()).find("input: Field required"), std::string::npos);
  EXPECT_NE(refusal({{"input", {{{"type", "input_image_call"}}}}}).find("'input_image_call' are not supported"),
            std::string::npos);
  EXPECT_NE(refusal({{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}}}}}}}}).find("text only"),
            std::string::npos);
}

TEST(ResponsesApi, StreamedEventsBuildTheSameItemsAsTheFinalResponse) {
  ResponsesRequest rq = responses_to_chat(ojson{{"input", "x"}});
  ResponseBuilder b("resp_abc", "m", 7, rq);
  std::string sse = b.start();
  ChatDelta d1;
  d1.reasoning = "th";
  sse += b.push(d1);
  ChatDelta d2;
  d2.reasoning = "ink";
  d2.content = "Hel";
  sse += b.push(d2);
  ChatDelta d3;
  d3.content = "lo";
  d3.tool_calls.push_back({0, "call_1", "f", "{\"a\""});
  sse += b.push(d3);
  ChatDelta d4;
  d4.tool_calls.push_back({0, "", "", ":1}"});
  sse += b.push(d4);
  ResponsesUsage u{10, 2, 6, 2};
  sse += b.finish("stop", u);
  std::vector<ojson> ev = events(sse);
  std::vector<std::string> types;
  for (size_t i = 0; i < ev.size(); ++i) {
    types.push_back(ev[i]["type"]);
    EXPECT_EQ(ev[i]["sequence_number"], i);
  }
  const std::vector<std::string> want = {
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.reasoning_text.delta",
      "response.reasoning_text.delta",
      "response.reasoning_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
  };
  EXPECT_EQ(types, want);
  const ojson& done = ev.back()["response"];
  EXPECT_EQ(done["status"], "completed");
  ASSERT_EQ(done["output"].size(), 3u);
  EXPECT_EQ(done["output"][0]["content"][0]["text"], "think");
  EXPECT_EQ(done["output"][1]["content"][0]["text"], "Hello");
  EXPECT_EQ(done["output"][2]["arguments"], "{\"a\":1}");
  EXPECT_EQ(done["output"][2]["call_id"], "call_1");
  EXPECT_EQ(done["usage"]["output_tokens_details"]["reasoning_tokens"], 2);
  EXPECT_EQ(done["usage"]["total_tokens"], 16);
  EXPECT_EQ(b.reasoning_text(), "think");

  // The same output, non-streaming.
  ResponseBuilder nb("resp_abc", "m", 7, rq);
  ChatParseResult r;
  r.reasoning = "think";
  r.content = "Hello";
  r.tool_calls.push_back({"call_1", "f", "{\"a\":1}"});
  nb.add(r);
  ojson whole = nb.response("stop", u);
  EXPECT_EQ(whole["output"], done["output"]);
}

TEST(ResponsesApi, LengthIsIncompleteAndSummaryModeUsesSummaryEvents) {
  ResponsesRequest rq = responses_to_chat(ojson{{"input", "x"}, {"reasoning", {{"summary", "auto"}}}});
  ResponseBuilder b("resp_1", "m", 0, rq);
  ChatDelta d;
  d.reasoning = "abc";
  std::string sse = b.start();
  sse += b.push(d);
  sse += b.finish("length", {});
  std::vector<ojson> ev = events(sse);
  EXPECT_EQ(ev[3]["type"], "response.reasoning_summary_part.added");
  EXPECT_EQ(ev[4]["type"], "response.reasoning_summary_text.delta");
  EXPECT_EQ(ev.back()["type"], "response.incomplete");
  EXPECT_EQ(ev.back()["response"]["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(ev.back()["response"]["output"][0]["summary"][0]["text"], "abc");
  std::vector<ojson> failed = events(ResponseBuilder("resp_2", "m", 0, rq).finish("error", {}, "boom"));
  EXPECT_EQ(failed.back()["type"], "response.failed");
  EXPECT_EQ(failed.back()["response"]["error"]["message"], "generation failed: boom");
}

}  // namespace
}  // namespace tessera::server
