// The API side of structured output: which request fields make which constraint (and which are 400s), and the
// tool-call grammars in each parser's format: a call the parser reads is accepted token by token (real Qwen3
// tokenizer), wrong arguments and other names are refused, and the constraint ends where the call does.
#include <gtest/gtest.h>

#include <filesystem>

#include "server/parsers/tool_parser.h"
#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"

namespace tessera::server {
namespace {

using api::ApiError;
using api::json;

const std::string kQwen3 = std::string(TESSERA_SOURCE_DIR) + "/.npm-pkgs/tokenizer-qwen3/package/models";
constexpr int32_t kEos = 151645;  // <|im_end|>

std::string error_of(const ojson& body) {
  try {
    read_structured_output(body);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    return e.message + " [" + e.param + "]";
  }
  return "";
}

TEST(StructuredOutputFields, EachFieldMakesItsKind) {
  using K = StructuredOutputSpec::Kind;
  EXPECT_FALSE(read_structured_output(ojson::parse(R"({"response_format": {"type": "text"}})")));
  auto s = read_structured_output(ojson::parse(R"({"response_format": {"type": "json_object"}})"));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->kind, K::kJsonObject);
  s = read_structured_output(ojson::parse(
      R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true,
          "schema": {"type": "object", "properties": {"b": {}, "a": {}}}}}})"));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->kind, K::kJsonSchema);
  EXPECT_TRUE(s->strict);
  EXPECT_EQ(s->schema["properties"].begin().key(), "b");  // the client's order
  s = read_structured_output(ojson::parse(R"({"guided_json": "{\"type\": \"integer\"}"})"));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->schema["type"], "integer");
  s = read_structured_output(
      ojson::parse(R"({"structured_outputs": {"regex": "a+", "disable_any_whitespace": true}})"));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->kind, K::kRegex);
  EXPECT_EQ(s->field, "structured_outputs.regex");
  s = read_structured_output(ojson::parse(R"({"guided_choice": ["x", "y"]})"));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->choices.size(), 2u);
  s = read_structured_output(ojson::parse(R"({"guided_json": {}, "guided_whitespace_pattern": " ?"})"));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->whitespace_pattern, " ?");
}

TEST(StructuredOutputFields, WhatIsNotServedNamesTheField) {
  EXPECT_NE(error_of(ojson::parse(R"({"response_format": {"type": "json_schema", "json_schema": {}}})")).find("schema"),
            std::string::npos);
  EXPECT_NE(error_of(ojson::parse(R"({"response_format": {"type": "yaml"}})")).find("yaml"), std::string::npos);
  EXPECT_NE(error_of(ojson::parse(R"({"guided_json": "{not json"})")).find("guided_json"), std::string::npos);
  EXPECT_NE(error_of(ojson::parse(R"({"guided_choice": []})")).find("guided_choice"), std::string::npos);
  EXPECT_NE(error_of(ojson::parse(R"({"guided_regex": "a", "guided_choice": ["b"]})")).find("both"), std::string::npos);
  EXPECT_NE(error_of(ojson::parse(R"({"structured_outputs": {}})")).find("needs one of"), std::string::npos);
  EXPECT_NE(error_of(ojson::parse(R"({"structured_outputs": {"structural_tag": "{}"}})")).find("structures"),
            std::string::npos);
  EXPECT_NE(error_of(ojson::parse(R"({"guided_whitespace_pattern": " "})")).find("guided_whitespace_pattern"),
            std::string::npos);
}

const char* kTag = R"({"type": "structural_tag", "triggers": ["<function="], "structures": [
  {"begin": "<function=get_weather>", "schema": {"type": "object", "properties": {"city": {"type": "string"}},
   "required": ["city"], "additionalProperties": false}, "end": "</function>"},
  {"begin": "<function=ping>", "schema": {"type": "object"}, "end": "</function>"}]})";

TEST(StructuredOutputFields, StructuralTagForms) {
  using K = StructuredOutputSpec::Kind;
  ojson tag = ojson::parse(kTag);
  auto a = read_structured_output(ojson{{"response_format", tag}});
  ASSERT_TRUE(a);
  EXPECT_EQ(a->kind, K::kStructuralTag);
  EXPECT_EQ(a->field, "response_format");
  EXPECT_EQ(a->triggers, std::vector<std::string>{"<function="});
  ASSERT_EQ(a->structures.size(), 2u);
  EXPECT_EQ(a->structures[1]["begin"], "<function=ping>");
  // vLLM passes structured_outputs.structural_tag as JSON text, without "type".
  ojson untyped = tag;
  untyped.erase("type");
  auto b = read_structured_output(ojson{{"structured_outputs", {{"structural_tag", untyped.dump()}}}});
  ASSERT_TRUE(b);
  EXPECT_EQ(b->field, "structured_outputs.structural_tag");
  EXPECT_EQ(b->key(), [&] {
    StructuredOutputSpec same = *a;
    same.field = b->field;
    return same.key();
  }());
  // xgrammar's format form: triggered_tags with json_schema content is the same grammar.
  ojson format = {{"type", "structural_tag"},
                  {"format", {{"type", "triggered_tags"}, {"triggers", tag["triggers"]}, {"tags", ojson::array()}}}};
  for (const auto& st : tag["structures"])
    format["format"]["tags"].push_back({{"type", "tag"},
                                        {"begin", st["begin"]},
                                        {"content", {{"type", "json_schema"}, {"json_schema", st["schema"]}}},
                                        {"end", st["end"]}});
  auto c = read_structured_output(ojson{{"response_format", format}});
  ASSERT_TRUE(c);
  EXPECT_EQ(c->key(), a->key());

  auto error_with = [](const char* edit) {
    ojson t = ojson::parse(kTag);
    t.merge_patch(ojson::parse(edit));
    return error_of(ojson{{"response_format", t}});
  };
  EXPECT_NE(error_with(R"({"triggers": []})").find("'response_format.triggers' must be a non-empty list"),
            std::string::npos);
  EXPECT_NE(error_with(R"({"triggers": [""]})").find("non-empty strings"), std::string::npos);
  EXPECT_NE(error_with(R"({"structures": [{"begin": "<f>", "end": "</f>"}]})").find("structures[0].schema"),
            std::string::npos);
  EXPECT_NE(error_with(R"({"trigers": ["x"]})").find("'response_format.trigers' is not a field"), std::string::npos);
  // Any other format is kept as the format object (checked when read).
  format["format"]["at_least_one"] = true;
  auto d = read_structured_output(ojson{{"response_format", format}});
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->structures.empty());
  EXPECT_EQ(d->tag_format["at_least_one"], true);
  EXPECT_NE(d->key(), c->key());
  format["format"]["at_least_one"] = 1;
  EXPECT_NE(
      error_of(ojson{{"response_format", format}}).find("'response_format.format.at_least_one' must be a boolean"),
      std::string::npos);
  format["format"] = {{"type", "sequence"}, {"elements", ojson::array()}};
  EXPECT_NE(error_of(ojson{{"response_format", format}}).find("'response_format.format.elements' must be a non-empty"),
            std::string::npos);
  format["format"] = ojson::parse(R"({"type": "tags_with_separator", "separator": ",", "tags": [{"type": "tag",
    "begin": "<a>", "content": {"type": "const_string", "value": "x"}, "end": "</a>"}, {"type": "tag", "begin": "<b>",
    "content": {"type": "sequence", "elements": [{"type": "any_text"}, {"type": "regex", "pattern": "x"}]},
    "end": "</b>"}]})");
  EXPECT_EQ(error_of(ojson{{"structured_outputs", {{"structural_tag", format.dump()}}}}),
            "'structured_outputs.structural_tag.format.tags[1].content.elements[0]' is unlimited (any_text, "
            "triggered_tags or tags_with_separator): only the last element of a sequence may be; wrap it in a tag with "
            "an end string [structured_outputs.structural_tag]");
  format["format"]["tags"][1]["content"] = {{"type", "yaml"}};
  EXPECT_NE(
      error_of(ojson{{"response_format", format}}).find("'response_format.format.tags[1].content.type' is 'yaml'"),
      std::string::npos);
  EXPECT_NE(error_of(ojson::parse(R"({"structural_tag": "{}"})")).find("response_format"), std::string::npos);
}

class ToolCallGrammar : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kQwen3 + "/tokenizer.json")) GTEST_SKIP() << "run scripts/fetch_test_data.sh";
    tok_ = tokenizer::Tokenizer::from_dir(kQwen3);
    compiler_ = std::make_unique<StructuredOutputCompiler>(*tok_, 151936, std::vector<int32_t>{kEos});
  }
  ojson body(const char* choice, bool parallel = true) const {
    ojson b = ojson::parse(R"({"tools": [
      {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]},
                       "days": {"type": "integer"}},
        "required": ["city", "unit"], "additionalProperties": false}}},
      {"type": "function", "function": {"name": "ping"}}]})");
    b["tool_choice"] = ojson::parse(choice);
    if (!parallel) b["parallel_tool_calls"] = false;
    return b;
  }
  // Feeds text token by token; true when every token is accepted. `end`: then the stop token.
  bool accepts(const TokenConstraintFactory& f, const std::string& text, bool end) const {
    auto c = f.make();
    for (int32_t id : tok_->encode(text, false))
      if (!c->accept(id)) return false;
    return !end || c->accept(kEos);
  }
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<StructuredOutputCompiler> compiler_;
};

TEST_F(ToolCallGrammar, HermesCallsParseAndWrongOnesAreRefused) {
  ToolChoicePlan plan{true, ""};
  auto spec = tool_call_structure(body(R"("required")"), plan, "hermes");
  ASSERT_TRUE(spec);
  auto f = compiler_->compile(*spec);
  const std::string call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";
  EXPECT_TRUE(accepts(*f, call, true));
  EXPECT_TRUE(accepts(*f, call + "\n<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>", true));
  EXPECT_TRUE(accepts(*f, "<tool_call>{\"name\":\"ping\",\"arguments\":{}}</tool_call>", true));        // compact
  EXPECT_FALSE(accepts(*f, "Sure! " + call, false));                                                    // text first
  EXPECT_FALSE(accepts(*f, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}", false));         // no such tool
  EXPECT_FALSE(accepts(*f, call.substr(0, call.find("\"c\"")) + "\"kelvin\"}}\n</tool_call>", false));  // enum
  EXPECT_FALSE(accepts(*f, call.substr(0, 40), true));  // cannot end inside a call
  // What the grammar accepts, the parser reads.
  ToolParserOptions o;
  o.tools = json::parse(body(R"("required")")["tools"].dump());
  ToolParseResult r = make_tool_parser("hermes", o)->parse(call);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(r.tool_calls[0].arguments), json::parse(R"({"city": "Paris", "unit": "c"})"));

  // Named, or parallel_tool_calls false: exactly one call.
  auto named = compiler_->compile(*tool_call_structure(body(R"({"type": "function", "function": {"name": "ping"}})"),
                                                       ToolChoicePlan{true, "ping"}, "hermes"));
  EXPECT_FALSE(accepts(*named, call, false));
  EXPECT_TRUE(accepts(*named, "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>", true));
  auto one = compiler_->compile(*tool_call_structure(body(R"("required")", false), plan, "hermes"));
  EXPECT_FALSE(accepts(*one, call + "\n" + call, false));
  EXPECT_TRUE(accepts(*one, call, true));
}

TEST_F(ToolCallGrammar, Qwen3CoderCallsParse) {
  ToolChoicePlan plan{true, ""};
  auto f = compiler_->compile(*tool_call_structure(body(R"("required")"), plan, "qwen3_coder"));
  const std::string call =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n<parameter=unit>\nf\n"
      "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(accepts(*f, call, true));
  // days is optional; unit is required; days must be an integer.
  std::string no_days = call;
  no_days.erase(no_days.find("<parameter=days>"), std::string("<parameter=days>\n3\n</parameter>\n").size());
  EXPECT_TRUE(accepts(*f, no_days, true));
  EXPECT_FALSE(
      accepts(*f, "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n</function>", false));
  std::string bad_days = call;
  bad_days.replace(bad_days.find("\n3\n"), 3, "\nthree\n");
  EXPECT_FALSE(accepts(*f, bad_days, false));
  ToolParserOptions o;
  o.tools = json::parse(body(R"("required")")["tools"].dump());
  ToolParseResult r = make_tool_parser("qwen3_coder", o)->parse(call);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(r.tool_calls[0].arguments),
            json::parse(R"({"city": "San Francisco", "unit": "f", "days": 3})"));
}

TEST_F(ToolCallGrammar, StructuralTagTextAndTaggedCalls) {
  auto spec = read_structured_output(ojson{{"response_format", ojson::parse(kTag)}});
  ASSERT_TRUE(spec);
  auto f = compiler_->compile(*spec);
  const std::string call = "<function=get_weather>{\"city\": \"Paris\"}</function>";
  EXPECT_TRUE(accepts(*f, "No call needed: it is sunny.", true));
  EXPECT_TRUE(accepts(*f, "Checking. " + call + "\nAnd " + "<function=ping>{}</function> done.", true));
  EXPECT_FALSE(accepts(*f, "<function=get_weather>{\"town\": \"Paris\"}</function>", false));
  EXPECT_FALSE(accepts(*f, "<function=get_time>{}</function>", false));
  EXPECT_FALSE(accepts(*f, "Checking. " + call.substr(0, 30), true));  // cannot end inside a tag
  // A schema that cannot be compiled names the structure and the keyword.
  ojson bad_tag = ojson::parse(kTag);
  bad_tag["structures"][1]["schema"] = {{"type", "object"}, {"properties", {{"x", {{"not", {}}}}}}};
  try {
    compiler_->compile(*read_structured_output(ojson{{"structured_outputs", {{"structural_tag", bad_tag}}}}));
    FAIL() << "a schema with 'not' compiled";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "structured_outputs.structural_tag");
    EXPECT_NE(e.message.find("structures[1].schema: JSON Schema at #/properties/x"), std::string::npos) << e.message;
  }
}

// xgrammar's format form beyond triggered tags: reasoning as a tag with any_text, then free text with tool calls
// whose arguments are Qwen XML parameters, compiled against the Qwen3 vocabulary.
TEST_F(ToolCallGrammar, StructuralTagFormats) {
  const ojson format = ojson::parse(R"({"type": "structural_tag", "format": {"type": "sequence", "elements": [
    {"type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"},
    {"type": "triggered_tags", "triggers": ["<tool_call>"], "stop_after_first": true, "tags": [{"type": "tag",
      "begin": "<tool_call>\n<function=get_weather>\n", "content": {"type": "qwen_xml_parameter", "json_schema": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}, "end": "\n</function>\n</tool_call>"}]}]}})");
  auto spec = read_structured_output(ojson{{"response_format", format}});
  ASSERT_TRUE(spec);
  auto f = compiler_->compile(*spec);
  const std::string call =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(accepts(*f, "<think>Weather? Use the tool.</think>\n\nLet me check. " + call, true));
  EXPECT_TRUE(accepts(*f, "<think></think>No tool needed.", true));
  EXPECT_FALSE(accepts(*f, "No reasoning first.", false));
  EXPECT_FALSE(accepts(*f, "<think>x</think>" + call + " and more", false));  // stop_after_first
  std::string bad_days = call;
  bad_days.replace(bad_days.find("\n3\n"), 3, "\nthree\n");
  EXPECT_FALSE(accepts(*f, "<think>x</think>" + bad_days, false));
  // A schema that cannot be compiled names its path.
  ojson bad = format;
  bad["format"]["elements"][1]["tags"][0]["content"]["json_schema"]["properties"]["days"] = {{"not", {}}};
  try {
    compiler_->compile(*read_structured_output(ojson{{"response_format", bad}}));
    FAIL() << "a schema with 'not' compiled";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "response_format");
    EXPECT_NE(e.message.find("'response_format.format.elements[1].tags[0].content.json_schema.properties.days'"),
              std::string::npos)
        << e.message;
  }
}

TEST_F(ToolCallGrammar, CompiledGrammarsAreCachedAndErrorsNameTheField) {
  StructuredOutputSpec s;
  s.kind = StructuredOutputSpec::Kind::kRegex;
  s.field = "guided_regex";
  s.text = "[0-9]{3}";
  auto a = compiler_->compile(s), b = compiler_->compile(s);
  EXPECT_TRUE(accepts(*a, "123", true));
  EXPECT_FALSE(accepts(*b, "12a", false));
  s.text = "(?=x)";
  try {
    compiler_->compile(s);
    FAIL() << "a lookahead compiled";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "guided_regex");
    EXPECT_NE(e.message.find("guided_regex"), std::string::npos) << e.message;
  }
}

}  // namespace
}  // namespace tessera::server
