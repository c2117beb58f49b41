// xgrammar's structural tag formats (GrammarBuilder::add_structural_tag): each format type accepts and refuses
// whole strings as xgrammar does (the expectations were checked against @mlc-ai/web-xgrammar; the oracle test
// repeats many of them), nesting, where unlimited formats end, errors naming the path, and masks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "grammar/grammar.h"
#include "grammar_test_util.h"

namespace tessera::grammar {
namespace {

using ojson = nlohmann::ordered_json;
using ::testing::HasSubstr;
using testing::matches;

std::shared_ptr<const Grammar> build(const std::string& format_json) {
  GrammarBuilder b;
  return b.build(b.add_structural_tag(ojson::parse(format_json)));
}

// Each string paired with whether the format accepts it.
void expect_all(const std::string& format_json, const std::vector<std::pair<std::string, bool>>& cases) {
  auto g = build(format_json);
  for (const auto& [text, accepted] : cases) EXPECT_EQ(matches(g, text), accepted) << format_json << "\n" << text;
}

std::string error_of(const std::string& format_json) {
  try {
    build(format_json);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

const char* kTagX =
    R"({"type": "tag", "begin": "<t>", "content": {"type": "const_string", "value": "x"}, "end": "</t>"})";
const char* kTagF =
    R"({"type": "tag", "begin": "<f>", "content": {"type": "const_string", "value": "x"}, "end": "</f>"})";

std::string with(const char* tmpl, const std::string& a, const std::string& b = "") {
  std::string s = tmpl;
  if (auto p = s.find("$A"); p != std::string::npos) s.replace(p, 2, a);
  if (auto p = s.find("$B"); p != std::string::npos) s.replace(p, 2, b);
  return s;
}

TEST(StructuralTagFormat, Primitives) {
  expect_all(R"({"type": "const_string", "value": "Hello"})", {{"Hello", true}, {"Hell", false}, {"Hello!", false}});
  expect_all(R"({"type": "or", "elements": [{"type": "const_string", "value": "yes"}, {"type": "regex", "pattern":
             "[0-9]+"}, {"type": "grammar", "grammar": "root ::= \"a\" b\nb ::= \"b\"+"}]})",
             {{"yes", true}, {"123", true}, {"abb", true}, {"no", false}, {"", false}, {"a", false}});
  expect_all(R"({"type": "json_schema", "json_schema": {"type": "object", "properties": {"a": {"type": "integer"}},
             "additionalProperties": false}})",
             {{R"({"a": 1})", true}, {R"({"b": 1})", false}, {R"({ "a" : 2 })", true}});
  expect_all(R"({"type": "any_text"})", {{"", true}, {"abc </x> é", true}, {"\xff", false}});
  // Two grammars with the same rule names do not clash.
  expect_all(R"({"type": "sequence", "elements": [{"type": "grammar", "grammar": "root ::= \"a\"+"},
             {"type": "grammar", "grammar": "root ::= \"b\"+"}]})",
             {{"ab", true}, {"aabbb", true}, {"ba", false}, {"a", false}});
}

TEST(StructuralTagFormat, TagAndAnyTextStopAtTheEnd) {
  const char* think = R"({"type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"})";
  expect_all(think, {{"<think>abc</think>", true},
                     {"<think></think>", true},
                     {"<think>a</think>b</think>", false},  // any_text ends at the first end string
                     {"<think>a</thin</think>", true},
                     {"<think>a", false}});
  // Overlapping end string: the text stops at its first occurrence.
  expect_all(R"({"type": "tag", "begin": "<r>", "content": {"type": "any_text"}, "end": "aab"})",
             {{"<r>aaab", true}, {"<r>aab", true}, {"<r>ab aab", true}, {"<r>aabaab", false}});
  // any_text last in a sequence inside a tag, and in an `or` of unlimited formats.
  expect_all(R"({"type": "tag", "begin": "<a>", "content": {"type": "sequence", "elements": [
             {"type": "const_string", "value": "A"}, {"type": "any_text"}]}, "end": "</a>"})",
             {{"<a>A</a>", true}, {"<a>Ab c</a>", true}, {"<a>b</a>", false}});
  expect_all(with(R"({"type": "tag", "begin": "<a>", "content": {"type": "or", "elements": [{"type": "any_text"},
             {"type": "triggered_tags", "triggers": ["<f"], "tags": [$A]}]}, "end": "</a>"})",
                  kTagF),
             {{"<a>xx</a>", true}, {"<a><f>x</f></a>", true}, {"<a><f</a>", true}});
  expect_all(R"({"type": "sequence", "elements": [{"type": "const_string", "value": "A:"}, {"type": "any_text"}]})",
             {{"A:", true}, {"A: foo", true}, {"B", false}});
}

TEST(StructuralTagFormat, TriggeredTagsFlags) {
  const char* top = R"({"type": "triggered_tags", "triggers": ["<f"], "tags": [$A] $B})";
  expect_all(with(top, kTagF), {{"", true}, {"hi <f>x</f> y <f>x</f>", true}, {"hi <f>y</f>", false}});
  expect_all(
      with(top, kTagF, R"(, "stop_after_first": true)"),
      {{"", true}, {"hi", true}, {"hi <f>x</f>", true}, {"hi <f>x</f> more", false}, {"<f>x</f><f>x</f>", false}});
  expect_all(
      with(top, kTagF, R"(, "at_least_one": true)"),
      {{"", false}, {"hi", false}, {"<f>x</f>", true}, {"<f>x</f> more <f>x</f>", true}, {"hi <f>x</f>", false}});
  expect_all(with(top, kTagF, R"(, "at_least_one": true, "stop_after_first": true)"),
             {{"", false}, {"<f>x</f>", true}, {"<f>x</f> more", false}, {"hi <f>x</f>", false}});
  // Inside a tag the free text stops at the tag's end string, which also follows the last tag.
  const char* inside = R"({"type": "tag", "begin": "<r>", "content": {"type": "triggered_tags", "triggers": ["<f"],
                           "tags": [$A] $B}, "end": "</r>"})";
  expect_all(with(inside, kTagF), {{"<r></r>", true},
                                   {"<r>hi <f>x</f> y</r>", true},
                                   {"<r>hi <f>x</f>", false},
                                   {"<r>a</r>b</r>", false},
                                   {"<r><f>x</f></r>", true}});
  expect_all(
      with(inside, kTagF, R"(, "stop_after_first": true)"),
      {{"<r></r>", true}, {"<r>hi <f>x</f></r>", true}, {"<r>hi <f>x</f>", false}, {"<r>hi <f>x</f> y</r>", false}});
  expect_all(with(inside, kTagF, R"(, "at_least_one": true)"),
             {{"<r></r>", false}, {"<r><f>x</f></r>", true}, {"<r><f>x</f> y</r>", true}, {"<r><f>x</f>", false}});
  expect_all(with(inside, kTagF, R"(, "at_least_one": true, "stop_after_first": true)"),
             {{"<r></r>", false}, {"<r><f>x</f></r>", true}, {"<r><f>x</f>", false}});
  // Nested: a tag whose any_text content stops at its own end inside a dispatched tag.
  expect_all(R"({"type": "sequence", "elements": [{"type": "const_string", "value": "A"}, {"type": "triggered_tags",
             "triggers": ["<f"], "tags": [{"type": "tag", "begin": "<f>", "content": {"type": "tag", "begin": "[",
             "content": {"type": "any_text"}, "end": "]"}, "end": "</f>"}]}]})",
             {{"A", true}, {"Ab <f>[zz]</f> c", true}, {"Ab <f>[z]z]</f>", false}});
}

TEST(StructuralTagFormat, TagsWithSeparator) {
  const char* top = R"({"type": "tags_with_separator", "separator": ",", "tags": [$A] $B})";
  expect_all(with(top, kTagX), {{"", true}, {"<t>x</t>", true}, {"<t>x</t>,<t>x</t>", true}, {"<t>x</t>,", false}});
  expect_all(with(top, kTagX, R"(, "at_least_one": true)"),
             {{"", false}, {"<t>x</t>", true}, {"<t>x</t>,<t>x</t>", true}});
  expect_all(with(top, kTagX, R"(, "stop_after_first": true)"),
             {{"", true}, {"<t>x</t>", true}, {"<t>x</t>,<t>x</t>", false}});
  expect_all(with(top, kTagX, R"(, "stop_after_first": true, "at_least_one": true)"),
             {{"", false}, {"<t>x</t>", true}, {"<t>x</t>,<t>x</t>", false}});
  expect_all(with(R"({"type": "tag", "begin": "<a>", "content": {"type": "tags_with_separator", "separator": ",",
                  "tags": [$A]}, "end": "</a>"})",
                  kTagX),
             {{"<a></a>", true},
              {"<a><t>x</t></a>", true},
              {"<a><t>x</t>,<t>x</t></a>", true},
              {"<a><t>x</t>", false},
              {"<a><t>x</t>,</a>", false}});
}

TEST(StructuralTagFormat, QwenXmlParameter) {
  const char* params = R"({"type": "qwen_xml_parameter", "json_schema": {"type": "object", "properties": {
    "city": {"type": "string"}, "n": {"type": "integer"}, "o": {"type": "object", "properties": {"k": {"type":
    "boolean"}}, "additionalProperties": false}, "l": {"type": "array", "items": {"type": "number"}}},
    "required": ["city"]}})";
  expect_all(params, {{"<parameter=city>Paris</parameter>", true},
                      {"<parameter=city>\nParis\n</parameter>", true},
                      {"<parameter=city>Paris</parameter>\n", false},
                      {"\n<parameter=city>Paris</parameter>", true},
                      {"<parameter=city>Pa<b>ris</parameter>", false},
                      {"<parameter=city>a&b</parameter>", false},
                      {"<parameter=city>Pa\nris</parameter>", false},
                      {"<parameter=city>\"Paris\" \\n\\u00e9 / é</parameter>", true},
                      {"<parameter=city>a\\o</parameter>", false},
                      {"<parameter=city></parameter>", true},
                      {"<parameter=city>Paris</parameter><parameter=n> 3 </parameter>", true},
                      {"<parameter=city>Paris</parameter><parameter=n>x</parameter>", false},
                      {"<parameter=city>Paris</parameter> \n\t<parameter=o>{\"k\": true}</parameter>", true},
                      {"<parameter=city>Paris</parameter><parameter=o>{\"k\": 1}</parameter>", false},
                      {"<parameter=city>Paris</parameter><parameter=l>[1, 2.5]</parameter>", true},
                      {"<parameter=n>3</parameter><parameter=city>Paris</parameter>", false},
                      {"<parameter=n>3</parameter>", false},
                      {"<parameter=city>Paris</parameter><parameter=extra>1</parameter>", false},
                      {"", false}});
  expect_all(R"({"type": "qwen_xml_parameter", "json_schema": {"type": "object", "properties": {
    "c": {"type": "string", "enum": ["a", "b"]}, "d": {"type": "string", "pattern": "[0-9]+"},
    "e": {"type": "string", "maxLength": 3}}}})",
             {{"", true},
              {"<parameter=c>\"a\"</parameter>", true},
              {"<parameter=c>a</parameter>", false},
              {"<parameter=d>12</parameter>", true},
              {"<parameter=d>x</parameter>", false},
              {"<parameter=e>abc</parameter>", true},
              {"<parameter=e>abcd</parameter>", false}});
}

TEST(StructuralTagFormat, ErrorsNameThePath) {
  EXPECT_THAT(error_of(R"({"type": "foo"})"), HasSubstr("'format.type' is 'foo', not a structural tag format"));
  EXPECT_THAT(error_of(with(R"({"type": "triggered_tags", "triggers": ["<"], "tags": [$A, {"type": "tag", "begin":
                            "<g>", "content": {"type": "nope"}, "end": ""}]})",
                            kTagF)),
              HasSubstr("'format.tags[1].content.type' is 'nope'"));
  EXPECT_THAT(error_of(R"({"type": "const_string", "value": "a", "extra": 1})"),
              HasSubstr("'format.extra' is not a field of a const_string format"));
  EXPECT_THAT(error_of(R"({"type": "const_string", "value": ""})"), HasSubstr("'format.value' must be a non-empty"));
  EXPECT_THAT(error_of(R"({"type": "sequence", "elements": []})"), HasSubstr("'format.elements' must be a non-empty"));
  EXPECT_THAT(error_of(R"({"type": "sequence", "elements": [{"type": "any_text"}, {"type": "const_string",
              "value": "x"}]})"),
              HasSubstr("'format.elements[0]' is unlimited"));
  EXPECT_THAT(error_of(R"({"type": "or", "elements": [{"type": "any_text"}, {"type": "const_string", "value": "x"}]})"),
              HasSubstr("'format' mixes unlimited elements"));
  EXPECT_THAT(error_of(R"({"type": "tag", "begin": "<a>", "content": {"type": "any_text"}, "end": ""})"),
              HasSubstr("'format.end' must be non-empty"));
  EXPECT_THAT(error_of(with(R"({"type": "triggered_tags", "triggers": ["<g"], "tags": [$A]})", kTagF)),
              HasSubstr("'format.tags[0].begin' '<f>' starts with none of the triggers"));
  EXPECT_THAT(error_of(with(R"({"type": "triggered_tags", "triggers": ["<f", "<g"], "tags": [$A]})", kTagF)),
              HasSubstr("'format.triggers[1]' '<g' starts no tag"));
  EXPECT_THAT(
      error_of(with(R"({"type": "triggered_tags", "triggers": ["<f"], "tags": [$A], "at_least_one": 1})", kTagF)),
      HasSubstr("'format.at_least_one' must be a boolean"));
  EXPECT_THAT(error_of(with(R"({"type": "tags_with_separator", "separator": "", "tags": [$A]})", kTagF)),
              HasSubstr("'format.separator' must be a non-empty string"));
  EXPECT_THAT(error_of(R"({"type": "json_schema", "json_schema": {"type": "object", "not": {}}})"),
              HasSubstr("'format.json_schema': JSON Schema at #: keyword 'not'"));
  EXPECT_THAT(error_of(R"J({"type": "regex", "pattern": "(?=a)"})J"), HasSubstr("'format.pattern': "));
  EXPECT_THAT(error_of(R"({"type": "grammar", "grammar": "start ::= \"a\""})"), HasSubstr("no rule 'root'"));
  EXPECT_THAT(error_of(R"({"type": "qwen_xml_parameter", "json_schema": {"type": "string"}})"),
              HasSubstr("'format.json_schema' must be an object schema"));
  EXPECT_THAT(error_of(R"({"type": "qwen_xml_parameter", "json_schema": {"type": "object", "properties": {},
              "required": ["a"]}})"),
              HasSubstr("names 'a', which is not in properties"));
  // check_structural_tag sees the shape only: a bad schema passes it, a misplaced any_text does not.
  EXPECT_NO_THROW(check_structural_tag(ojson::parse(R"({"type": "json_schema", "json_schema": {"not": {}}})")));
  EXPECT_THROW(check_structural_tag(ojson::parse(R"({"type": "tag", "begin": "a", "content": {"type": "any_text"},
               "end": ""})"),
                                    "response_format.format"),
               GrammarError);
}

// Random token paths over a nested format: each mask equals accept_token's answer.
TEST(StructuralTagFormat, MasksEqualBruteForce) {
  auto g = build(R"({"type": "sequence", "elements": [
    {"type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"},
    {"type": "triggered_tags", "triggers": ["<tool"], "tags": [{"type": "tag", "begin": "<tool>",
      "content": {"type": "qwen_xml_parameter", "json_schema": {"type": "object", "properties": {
        "q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"]}}, "end": "</tool>"}]}]})");
  auto vocab = testing::byte_vocab({"<think>", "</think>", "</thi", "nk>", "<tool>", "</tool>", "<tool",
                                    "<parameter=q>", "</parameter>", "<parameter=n>", "12", " the", "\n"});
  auto compiled = compile(g, vocab);
  std::mt19937 rng(11);
  for (int walk = 0; walk < 10; ++walk) {
    Matcher m(compiled);
    for (int step = 0; step < 40; ++step) {
      std::vector<uint32_t> mask(m.mask_words());
      m.fill_next_token_bitmask(mask);
      ASSERT_EQ(mask, testing::brute_force_mask(m, *vocab)) << "walk " << walk << " step " << step;
      std::vector<int32_t> allowed, multi;
      for (int32_t id = 0; id < static_cast<int32_t>(vocab->token_bytes.size()); ++id) {
        if (!testing::bit(mask, id) || id == vocab->stop_ids[0]) continue;
        allowed.push_back(id);
        if (id >= 256) multi.push_back(id);
      }
      if (allowed.empty()) break;
      const auto& pool = !multi.empty() && rng() % 4 != 0 ? multi : allowed;
      ASSERT_TRUE(m.accept_token(pool[rng() % pool.size()]));
    }
  }
}

}  // namespace
}  // namespace tessera::grammar
