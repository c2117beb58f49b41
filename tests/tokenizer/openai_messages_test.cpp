// vLLM's normalization of OpenAI messages before a chat template sees them, and the content-format detection
// that picks between text and typed parts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tokenizer/chat_template.h"
#include "tokenizer/openai_messages.h"

namespace tessera::tokenizer {
namespace {

using Json = nlohmann::ordered_json;
using ::testing::HasSubstr;

TEST(VllmMessages, ContentBecomesOneString) {
  Json messages = Json::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}, "c"]},
    {"role": "assistant", "content": null},
    {"role": "user", "content": "plain", "extra_field": 1}])");
  Json out = vllm_messages(messages, ContentFormat::kString);
  EXPECT_EQ(out, Json::parse(R"([{"role": "user", "content": "a\nb\nc"}, {"role": "assistant", "content": ""},
                                 {"role": "user", "content": "plain"}])"));
}

TEST(VllmMessages, MediaNeedsATemplateThatTakesParts) {
  Json messages = Json::parse(R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}},
                                                               {"type": "text", "text": "what is it?"}]}])");
  EXPECT_THROW(vllm_messages(messages, ContentFormat::kString), Error);
  EXPECT_EQ(vllm_messages(messages, ContentFormat::kOpenAI)[0]["content"],
            Json::parse(R"([{"type": "image"}, {"type": "text", "text": "what is it?"}])"));
  EXPECT_EQ(vllm_messages(Json::parse(R"([{"role": "user", "content": "hi"}])"), ContentFormat::kOpenAI)[0]["content"],
            Json::parse(R"([{"type": "text", "text": "hi"}])"));
  EXPECT_THROW(
      vllm_messages(Json::parse(R"([{"role": "user", "content": [{"type": "hologram"}]}])"), ContentFormat::kOpenAI),
      Error);
}

TEST(VllmMessages, ToolCallArgumentsBecomeObjects) {
  Json messages = Json::parse(R"([{"role": "assistant", "content": null, "reasoning": "think", "tool_calls": [
      {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": [2]}"}},
      {"id": "2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
      {"id": "3", "type": "function", "function": {"name": "h", "arguments": ""}}]},
    {"role": "assistant", "content": "x", "tool_calls": []},
    {"role": "tool", "content": "r", "tool_call_id": "1", "name": "f"}])");
  Json out = vllm_messages(messages, ContentFormat::kString);
  EXPECT_EQ(out[0]["tool_calls"][0]["function"]["arguments"].dump(), R"({"b":1,"a":[2]})");  // key order kept
  EXPECT_EQ(out[0]["tool_calls"][1]["function"]["arguments"], Json::object());
  EXPECT_EQ(out[0]["tool_calls"][2]["function"]["arguments"], Json::object());
  EXPECT_EQ(out[0]["reasoning"], "think");
  EXPECT_EQ(out[0]["reasoning_content"], "think");
  EXPECT_FALSE(out[1].contains("tool_calls"));
  EXPECT_EQ(out[2], Json::parse(R"({"role": "tool", "content": "r", "tool_call_id": "1", "name": "f"})"));
  EXPECT_THROW(vllm_messages(Json::parse(R"([{"content": "no role"}])"), ContentFormat::kString), Error);
}

TEST(ContentFormat, DetectedFromLoopsOverContent) {
  EXPECT_EQ(ChatTemplate::from_source("{% for m in messages %}{{ m.content }}{% endfor %}").content_format(),
            ContentFormat::kString);
  EXPECT_EQ(ChatTemplate::from_source("{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}"
                                      "{% endfor %}")
                .content_format(),
            ContentFormat::kOpenAI);
  EXPECT_EQ(
      ChatTemplate::from_source("{% for m in messages %}{% if true %}{% for p in m['content'] | selectattr('type',"
                                " 'equalto', 'text') %}{{ p.text }}{% endfor %}{% endif %}{% endfor %}")
          .content_format(),
      ContentFormat::kOpenAI);
}

TEST(ContentFormat, VllmRequestFeedsTheTemplateWhatVllmWould) {
  ChatTemplate t = ChatTemplate::from_source(
      "{% for m in messages %}{{ m.role }}:{{ m.content }}{% for c in m.tool_calls or [] %}"
      "[{{ c.function.arguments | tojson }}]{% endfor %};{% endfor %}");
  Json request = Json::parse(R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
       "function": {"name": "f", "arguments": "{\"x\":1}"}}]}]})");
  EXPECT_EQ(t.render(t.vllm_request(request)), "user:hi;assistant:[{\"x\": 1}];");
  // Without the normalization the template sees the raw request, as transformers would.
  EXPECT_EQ(t.render(request), "user:[{'type': 'text', 'text': 'hi'}];assistant:None[\"{\\\"x\\\":1}\"];");
}

// Tool-call arguments arrive as a JSON string inside the request: their nesting is bounded like
// the body's before anything walks the parsed value recursively.
TEST(VllmMessages, DeeplyNestedToolArgumentsAreRefused) {
  auto messages_with = [](const std::string& arguments) {
    Json call = {{"id", "1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", arguments}}}};
    return Json::array({Json{{"role", "assistant"}, {"content", ""}, {"tool_calls", Json::array({call})}}});
  };
  std::string deep;
  for (int i = 0; i < 50000; ++i) deep += "{\"a\":";
  deep += "1" + std::string(50000, '}');
  try {
    vllm_messages(messages_with(deep), ContentFormat::kString);
    FAIL() << "nested arguments accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("more than 128 levels"));
  }
  std::string ok;
  for (int i = 0; i < 100; ++i) ok += "{\"a\":";
  ok += "1" + std::string(100, '}');
  EXPECT_TRUE(vllm_messages(messages_with(ok), ContentFormat::kString)[0]["tool_calls"][0]["function"]["arguments"]
                  .is_object());
}

}  // namespace
}  // namespace tessera::tokenizer
