// Where ChatTemplate finds the template and its special tokens, and how it maps an OpenAI request onto the
// template's variables (the same ones transformers' apply_chat_template passes).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tokenizer/chat_template.h"

namespace tessera::tokenizer {
namespace {

using ::testing::HasSubstr;

class ModelDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("chat_template_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name, std::ios::binary) << text; }
  std::filesystem::path dir_;
};

const nlohmann::ordered_json kHello =
    nlohmann::ordered_json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})");

TEST_F(ModelDir, TemplateStringAndAddedTokenObjects) {
  write("tokenizer_config.json", R"({"bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>",
      "pad_token": null, "chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}[{{ pad_token }}]"})");
  EXPECT_EQ(ChatTemplate::from_model_dir(dir_).render(kHello), "<s>hi</s>[]");
}

TEST_F(ModelDir, NamedTemplatesUseDefault) {
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "tools"},
      {"name": "default", "template": "default {{ messages | length }}"}]})");
  EXPECT_EQ(ChatTemplate::from_model_dir(dir_).render(kHello), "default 1");
}

TEST_F(ModelDir, NamedTemplatesWithoutDefaultIsAnError) {
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "tools"}]})");
  try {
    ChatTemplate::from_model_dir(dir_);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("tool_use"));
  }
}

TEST_F(ModelDir, JinjaFileWinsOverConfigAndFlagWinsOverBoth) {
  write("tokenizer_config.json", R"({"eos_token": "</s>", "chat_template": "from config"})");
  write("chat_template.jinja", "from jinja file {{ eos_token }}\n");  // Jinja2 drops one trailing newline
  write("override.jinja", "from flag");
  EXPECT_EQ(ChatTemplate::from_model_dir(dir_).render(kHello), "from jinja file </s>");
  EXPECT_EQ(ChatTemplate::from_model_dir(dir_, dir_ / "override.jinja").render(kHello), "from flag");
}

TEST_F(ModelDir, MissingTemplateSaysWhereItLooked) {
  write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  try {
    ChatTemplate::from_model_dir(dir_);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_THAT(std::string(e.what()), HasSubstr("--chat-template"));
  }
  EXPECT_THROW(ChatTemplate::from_model_dir(dir_, dir_ / "no_such_file.jinja"), Error);
}

// A template nested thousands of levels deep (here 20,000 `{% if %}` blocks) overflowed the stack while
// parsing at startup; it is refused naming the file, the line and the limit.
TEST_F(ModelDir, DeeplyNestedTemplateFailsNamingFileLineAndLimit) {
  std::string source;
  for (int i = 0; i < 20000; ++i) source += "{% if true %}\n";
  write("chat_template.jinja", source);
  try {
    ChatTemplate::from_model_dir(dir_);
    FAIL() << "expected an error";
  } catch (const jinja::TemplateError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr((dir_ / "chat_template.jinja").string()));
    EXPECT_THAT(std::string(e.what()), HasSubstr("line 128"));
    EXPECT_THAT(std::string(e.what()), HasSubstr("nests deeper than 128"));
  }
  write("tokenizer_config.json",
        R"({"chat_template": "{{ )" + std::string(20000, '(') + "1" + std::string(20000, ')') + R"( }}"})");
  std::filesystem::remove(dir_ / "chat_template.jinja");
  try {
    ChatTemplate::from_model_dir(dir_);
    FAIL() << "expected an error";
  } catch (const jinja::TemplateError& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("tokenizer_config.json, line 1"));
  }
}

TEST(ChatTemplateRequest, VariablesMatchTransformers) {
  ChatTemplate t = ChatTemplate::from_source(
      "{{ add_generation_prompt }}|{{ tools is defined }}|{{ tools is none }}|{{ documents is none }}|"
      "{{ enable_thinking | default('unset') }}|{{ bos_token is defined }}");
  EXPECT_EQ(t.render(kHello), "True|True|True|True|unset|False");
  auto request = kHello;
  request["add_generation_prompt"] = false;
  request["chat_template_kwargs"] = {{"enable_thinking", false}};
  request["tools"] = nlohmann::ordered_json::array();
  EXPECT_EQ(t.render(request), "False|True|False|True|False|False");
}

// A request may add template variables, not replace what the server sets: the special tokens
// (transformers lets kwargs override bos_token; vLLM's server does not pass such kwargs through),
// the named arguments, or the template's functions (raise_exception would silence the template's
// own checks).
TEST(ChatTemplateRequest, KwargsMayNotReplaceSpecialTokensArgumentsOrFunctions) {
  ChatTemplate t = ChatTemplate::from_source("{{ bos_token }}{{ messages | length }}", R"({"bos_token": "<s>"})");
  for (const char* name : {"bos_token", "eos_token", "messages", "add_generation_prompt", "tools", "raise_exception",
                           "range", "namespace", "strftime_now"}) {
    auto request = kHello;
    request["chat_template_kwargs"] = {{name, "x"}};
    std::string prompt;
    Status s = t.try_render(request, &prompt);
    ASSERT_FALSE(s.ok()) << name;
    EXPECT_EQ(s.kind(), ErrorKind::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(name));
  }
  auto request = kHello;
  request["chat_template_kwargs"] = {{"enable_thinking", true}};
  EXPECT_EQ(t.render(request), "<s>1");
}

TEST(ChatTemplateRequest, ToolSchemasKeepTheClientsKeyOrder) {
  ChatTemplate t = ChatTemplate::from_source("{{ tools[0] | tojson }}");
  auto request = nlohmann::ordered_json::parse(
      R"({"messages": [], "tools": [{"type": "function", "function": {"name": "z", "description": "d", "parameters": {}}}]})");
  EXPECT_EQ(t.render(request),
            R"({"type": "function", "function": {"name": "z", "description": "d", "parameters": {}}})");
}

TEST(ChatTemplateRequest, MalformedRequestsAreInvalidArguments) {
  ChatTemplate t = ChatTemplate::from_source("x");
  std::string prompt;
  Status no_messages = t.try_render(nlohmann::ordered_json::parse(R"({"model": "m"})"), &prompt);
  EXPECT_FALSE(no_messages.ok());
  EXPECT_EQ(no_messages.kind(), ErrorKind::kInvalidArgument);
  EXPECT_THAT(no_messages.message(), HasSubstr("messages"));
  EXPECT_FALSE(
      t.try_render(nlohmann::ordered_json::parse(R"({"messages": [], "add_generation_prompt": "yes"})"), &prompt).ok());
  EXPECT_FALSE(
      t.try_render(nlohmann::ordered_json::parse(R"({"messages": [], "chat_template_kwargs": [1]})"), &prompt).ok());
}

TEST(ChatTemplateRequest, DeeplyNestedJsonIsRejectedNotRecursedInto) {
  ChatTemplate t = ChatTemplate::from_source("{{ tools | length }}");
  std::string nested(100000, '[');
  nested += std::string(100000, ']');
  auto request = nlohmann::ordered_json::parse(R"({"messages": []})");
  request["tools"] = nlohmann::ordered_json::parse(nested);
  std::string prompt;
  Status status = t.try_render(request, &prompt);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.kind(), ErrorKind::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("nested too deeply"));
  request["tools"] = nlohmann::ordered_json::parse("[[[[1]]]]");
  EXPECT_EQ(t.render(request), "1");
}

TEST(ChatTemplateRequest, TemplateErrorsBecomeStatusWithTheTemplatesMessage) {
  ChatTemplate t = ChatTemplate::from_source(
      "{% if messages[0].role != 'user' %}\n{{ raise_exception('Conversation must start with a user message') }}{% "
      "endif %}");
  std::string prompt;
  Status status =
      t.try_render(nlohmann::ordered_json::parse(R"({"messages": [{"role": "system", "content": "s"}]})"), &prompt);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.kind(), ErrorKind::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("Conversation must start with a user message"));
  EXPECT_THAT(status.message(), HasSubstr("line 2"));
}

TEST(ChatTemplateRequest, SyntaxErrorsFailAtLoad) {
  EXPECT_THROW(ChatTemplate::from_source("{% if %}"), jinja::TemplateError);
}

}  // namespace
}  // namespace tessera::tokenizer
