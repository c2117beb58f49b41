// Oracle: xgrammar (@mlc-ai/web-xgrammar, run by tests/node/grammar_refs_xgrammar.mjs) and this library
// agree on which strings each JSON Schema fixture, each EBNF grammar and each structural tag accepts: the
// fixtures' valid and invalid documents, their compact forms, and documents from random walks of this
// library's masks.
// Deliberate differences are listed below with the reason. Skips when node_modules is absent.
// Structural tag formats (xgrammar's "format" objects) are compared the same way; what web-xgrammar 0.1.27
// lacks (optional, plus, star, repeat, dispatch, token formats, any_text excludes) is not served here either.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "grammar_test_util.h"

namespace tessera::grammar {
namespace {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

const fs::path kNodeDir = fs::path(TESSERA_SOURCE_DIR) / "tests/node";

// (case, string) pairs where this library deliberately differs from xgrammar, and why. kWalk stands for
// the random-walk document of that case, kError for xgrammar refusing the schema.
const std::string kWalk = "(walk)", kError = "(error)";
struct Difference {
  std::string case_name, text, reason;
};
const std::vector<Difference> kDifferences = {
    {"01_weather_tool", R"({"location": "Paris", "unit": "kelvin"})",
     "additional properties may not repeat a declared key (xgrammar's additional-property rule matches it)"},
    {"05_enum_mixed", R"({"a": [1, 2]})",
     "object/array enum and const values allow whitespace per JsonOptions (xgrammar: compact only)"},
    {"10_numeric_bounds", R"({"age": 121, "temp": 0, "pct": 5, "big": 1000})", "integer bounds are exact here"},
    {"10_numeric_bounds", R"({"age": 1, "temp": 0, "pct": 100, "big": 1000})", "exclusive bounds are exact here"},
    {"10_numeric_bounds", R"({"age": 1, "temp": 0, "pct": 0, "big": 1000})", "exclusive bounds are exact here"},
    {"10_numeric_bounds", kWalk, "bounded numbers: fractions inside the range are allowed here"},
    {"22_ecommerce_order", kWalk, "bounded numbers (minimum only): any number of digits here"},
    {"11_type_array_nullable", R"({"a": null, "b": null, "c": false})", "OpenAPI nullable is honoured here"},
    {"11_type_array_nullable", R"({"a":null,"b":null,"c":false})", "OpenAPI nullable is honoured here"},
    {"15_string_lengths", R"({"code": "\u00e9\n"})", "minLength/maxLength count characters, an escape is one"},
    {"15_string_lengths", R"({"code":"é\n"})", "minLength/maxLength count characters, an escape is one"},
    {"16_prefix_items", R"(["a"])", "prefixItems do not require every prefix element (JSON Schema 2020-12)"},
    {"16_prefix_items", "[]", "prefixItems do not require every prefix element (JSON Schema 2020-12)"},
    {"16_prefix_items", kWalk, "prefixItems do not require every prefix element (JSON Schema 2020-12)"},
    {"32_unicode_keys", kError, "a key with an escaped quote (xgrammar's generated EBNF does not parse)"},
    {"33_draft7_tuple", kError, "draft 4-7 tuple form (items as an array, additionalItems): xgrammar aborts"},
    {"34_exclusive_draft4", kError, "draft-4 boolean exclusiveMinimum/exclusiveMaximum (xgrammar aborts)"},
};

struct Case {
  std::string name;
  std::string kind;  // "schema", "ebnf" or "structural_tag"
  std::string source;
  std::vector<std::string> strings;
  int walk_index = -1;  // strings[walk_index] comes from a random walk
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// vLLM's structural tag {"structures": [{"begin", "schema", "end"}], "triggers"} as this library builds it.
std::shared_ptr<const Grammar> build_structural_tag(const std::string& source) {
  const ojson tag = ojson::parse(source);
  GrammarBuilder b;
  std::vector<TriggeredTag> tags;
  for (const auto& st : tag["structures"])
    tags.push_back({st["begin"].get<std::string>(), b.add_json_schema(st["schema"]), st["end"].get<std::string>()});
  return b.build(b.add_triggered_tags(tags, tag["triggers"].get<std::vector<std::string>>()));
}

std::shared_ptr<const Grammar> build_structural_format(const std::string& source) {
  GrammarBuilder b;
  return b.build(b.add_structural_tag(ojson::parse(source)));
}

bool our_accepts(const Case& c, const std::string& text) {
  if (c.kind == "structural_tag") return testing::matches(build_structural_tag(c.source), text);
  if (c.kind == "structural_format") return testing::matches(build_structural_format(c.source), text);
  GrammarBuilder b;
  std::string root = "root";
  if (c.kind == "schema")
    root = b.add_json_schema(ojson::parse(c.source));
  else
    b.add_ebnf(c.source);
  return testing::matches(b.build(root), text);
}

// Structural tags: free text, tagged calls, overlapping triggers, and random walks of this library's masks
// over a vocabulary with the trigger and tag tokens.
void add_structural_tag_cases(std::vector<Case>& cases) {
  const ojson weather = {{"type", "object"},
                         {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}},
                         {"required", {"city"}},
                         {"additionalProperties", false}};
  const ojson functions = {{"structures",
                            {{{"begin", "<function=get_weather>"}, {"schema", weather}, {"end", "</function>"}},
                             {{"begin", "<function=ping>"}, {"schema", {{"type", "object"}}}, {"end", "</function>"}}}},
                           {"triggers", {"<function="}}};
  const std::string call = R"(<function=get_weather>{"city": "Paris"}</function>)";
  Case c{"structural_tag_functions",
         "structural_tag",
         functions.dump(),
         {"", "hello <func", call, "x" + call + "y<function=ping>{}</function>", "é ← 中文 <function",
          R"(<function=get_weather>{"city": "Paris", "d": 1}</function>)", "<function=get_time>{}</function>",
          R"(<function=get_weather>{"city": "Paris"})", "<function=get_weather>{\n \"city\" : \"P\"\n}</function>",
          "<function=", "a</function>b"},
         -1};
  auto vocab =
      testing::byte_vocab({"<function=", "<function=get_weather>", "<function=ping>", "<fun", "ction=", "</function>",
                           "{\"city\": \"", "Paris", "\"}", "{}", "\"days\": ", "12", " the"});
  // Walks that take the multi-byte (trigger and tag) tokens three times in four, then end where allowed.
  auto compiled = compile(build_structural_tag(c.source), vocab);
  std::mt19937 rng(9);
  int tagged = 0;
  for (int walk = 0; walk < 8; ++walk) {
    Matcher m(compiled);
    std::string text;
    std::vector<uint32_t> mask(m.mask_words());
    for (int step = 0; step < 60 && !(step >= 30 && m.can_terminate()); ++step) {
      m.fill_next_token_bitmask(mask);
      std::vector<int32_t> allowed, multi;
      for (int32_t id = 0; id < vocab->stop_ids[0]; ++id) {
        if (!testing::bit(mask, id) || vocab->special[id]) continue;
        allowed.push_back(id);
        if (id >= 256) multi.push_back(id);
      }
      const auto& pool = !multi.empty() && rng() % 4 != 0 ? multi : allowed;
      const int32_t id = pool[rng() % pool.size()];
      ASSERT_TRUE(m.accept_token(id));
      text += vocab->token_bytes[id];
    }
    if (!m.can_terminate()) continue;
    tagged += text.find("<function=") != std::string::npos;  // complete: the walk can end
    c.strings.push_back(text);
  }
  EXPECT_GT(tagged, 0) << "no walk wrote a tag";
  cases.push_back(std::move(c));
  const ojson overlap = {{"structures",
                          {{{"begin", "ab="}, {"schema", {{"type", "integer"}}}, {"end", ";"}},
                           {{"begin", "xyz"}, {"schema", {{"type", "boolean"}}}, {"end", "."}},
                           {{"begin", "<<f"}, {"schema", {{"type", "integer"}}}, {"end", ">"}}}},
                         {"triggers", {"ab", "xyz", "<<f"}}};
  cases.push_back({"structural_tag_overlap",
                   "structural_tag",
                   overlap.dump(),
                   {"ab=1; xyztrue. a b x y z", "xab=7;", "xyab", "xy ab=2;", "<<<f1>", "< <<f12> <<<", "<<f", "<<fx"},
                   -1});
}

// xgrammar's structural tag formats ({"type": "structural_tag", "format": ...}): every format type this
// web-xgrammar version has (0.1.27: const_string, json_schema, grammar, regex, any_text, sequence, or, tag,
// triggered_tags, tags_with_separator, qwen_xml_parameter; the newer optional/plus/star/repeat/dispatch and
// token formats are not in it, nor served here), nested, with each flag, plus random walks of this library's
// masks. Schemas say additionalProperties where it matters: xgrammar's structural tags default to strict.
void add_structural_format_cases(std::vector<Case>& cases) {
  const std::string tag_f = R"({"type": "tag", "begin": "<f>", "content": {"type": "const_string", "value": "x"},
                                "end": "</f>"})";
  const std::string tag_t = R"({"type": "tag", "begin": "<t>", "content": {"type": "const_string", "value": "x"},
                                "end": "</t>"})";
  auto add = [&](const std::string& name, const std::string& format, std::vector<std::string> strings) {
    cases.push_back({name, "structural_format", ojson::parse(format).dump(), std::move(strings), -1});
  };
  add("format_primitives",
      R"({"type": "or", "elements": [{"type": "const_string", "value": "yes"}, {"type": "regex", "pattern": "[0-9]+"},
          {"type": "grammar", "grammar": "root ::= \"a\" b\nb ::= \"b\"+"}, {"type": "json_schema",
          "json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": false}}]})",
      {"yes", "123", "abb", "no", "", "a", "{\"a\": 1}", "{\"b\": 1}", "{ \"a\" : 2 }", "yes123"});
  add("format_any_text", R"({"type": "any_text"})", {"", "abc </x> \u00e9", "\n\t"});
  add("format_think", R"({"type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"})",
      {"<think>abc</think>", "<think></think>", "<think>a</think>b</think>", "<think>a</thin</think>", "<think>a"});
  add("format_sequence_any_text",
      R"({"type": "tag", "begin": "<a>", "content": {"type": "sequence", "elements": [{"type": "const_string",
          "value": "A"}, {"type": "any_text"}]}, "end": "</a>"})",
      {"<a>A</a>", "<a>Ab c</a>", "<a>b</a>", "<a>A</a></a>"});
  add("format_or_unlimited",
      R"({"type": "tag", "begin": "<a>", "content": {"type": "or", "elements": [{"type": "any_text"},
          {"type": "triggered_tags", "triggers": ["<f"], "tags": [)" +
          tag_f + R"(]}]}, "end": "</a>"})",
      {"<a>xx</a>", "<a><f>x</f></a>", "<a><f</a>", "<a>x"});
  const std::vector<std::pair<std::string, std::string>> flag_sets = {
      {"", ""},
      {"_s", R"(, "stop_after_first": true)"},
      {"_a", R"(, "at_least_one": true)"},
      {"_as", R"(, "at_least_one": true, "stop_after_first": true)"}};
  for (const auto& flag_set : flag_sets) {
    const std::string& suffix = flag_set.first;
    const std::string& flags = flag_set.second;
    add("format_triggered" + suffix,
        R"({"type": "triggered_tags", "triggers": ["<f"], "tags": [)" + tag_f + "]" + flags + "}",
        {"", "hi", "<f>x</f>", "hi <f>x</f>", "hi <f>x</f> more", "<f>x</f><f>x</f>", "<f>x</f> more <f>x</f>",
         "<f>y</f>", "<f"});
    add("format_triggered_in_tag" + suffix,
        R"({"type": "tag", "begin": "<r>", "content": {"type": "triggered_tags", "triggers": ["<f"], "tags": [)" +
            tag_f + "]" + flags + R"(}, "end": "</r>"})",
        {"<r></r>", "<r>hi <f>x</f> y</r>", "<r>hi <f>x</f></r>", "<r>hi <f>x</f>", "<r><f>x</f></r>",
         "<r><f>x</f> y</r>", "<r><f>x</f>", "<r>a</r>b</r>"});
    add("format_separator" + suffix,
        R"({"type": "tags_with_separator", "separator": ",", "tags": [)" + tag_t + "]" + flags + "}",
        {"", "<t>x</t>", "<t>x</t>,<t>x</t>", "<t>x</t>,", "<t>x</t><t>x</t>"});
  }
  add("format_separator_in_tag",
      R"({"type": "tag", "begin": "<a>", "content": {"type": "tags_with_separator", "separator": ",", "tags": [)" +
          tag_t + R"(]}, "end": "</a>"})",
      {"<a></a>", "<a><t>x</t></a>", "<a><t>x</t>,<t>x</t></a>", "<a><t>x</t>", "<a>", "<a><t>x</t>,</a>"});
  add("format_nested_tags",
      R"({"type": "sequence", "elements": [{"type": "const_string", "value": "A"}, {"type": "triggered_tags",
          "triggers": ["<f"], "tags": [{"type": "tag", "begin": "<f>", "content": {"type": "tag", "begin": "[",
          "content": {"type": "any_text"}, "end": "]"}, "end": "</f>"}]}]})",
      {"A", "Ab <f>[zz]</f> c", "Ab <f>[z]z]</f>", "Ab <f>[z]"});
  add("format_qwen_xml",
      R"({"type": "qwen_xml_parameter", "json_schema": {"type": "object", "properties": {"city": {"type": "string"},
          "n": {"type": "integer"}, "o": {"type": "object", "properties": {"k": {"type": "boolean"}},
          "additionalProperties": false}, "l": {"type": "array", "items": {"type": "number"}},
          "c": {"type": "string", "enum": ["a", "b"]}, "d": {"type": "string", "pattern": "[0-9]+"},
          "e": {"type": "string", "maxLength": 3}}, "required": ["city"]}})",
      {"<parameter=city>Paris</parameter>",
       "<parameter=city>\nParis\n</parameter>",
       "<parameter=city>Paris</parameter>\n",
       "\n<parameter=city>Paris</parameter>",
       "<parameter=city>Pa<b>ris</parameter>",
       "<parameter=city>a&b</parameter>",
       "<parameter=city>Pa\nris</parameter>",
       "<parameter=city>\"Paris\" \\o/ \u00e9</parameter>",
       "<parameter=city>\\\"P\\u00e9\\/\\n</parameter>",
       "<parameter=city>a\\</parameter>",
       "<parameter=city></parameter>",
       "<parameter=city>Paris</parameter><parameter=n> 3 </parameter>",
       "<parameter=city>Paris</parameter><parameter=n>x</parameter>",
       "<parameter=city>P</parameter> \n\t<parameter=o>{\"k\": true}</parameter>",
       "<parameter=city>P</parameter><parameter=o>{\"k\": 1}</parameter>",
       "<parameter=city>P</parameter><parameter=l>[1, 2.5]</parameter>",
       "<parameter=n>3</parameter><parameter=city>Paris</parameter>",
       "<parameter=n>3</parameter>",
       "<parameter=city>P</parameter><parameter=extra>1</parameter>",
       "",
       "<parameter=city>P</parameter><parameter=c>\"a\"</parameter>",
       "<parameter=city>P</parameter><parameter=c>a</parameter>",
       "<parameter=city>P</parameter><parameter=d>12</parameter>",
       "<parameter=city>P</parameter><parameter=d>x</parameter>",
       "<parameter=city>P</parameter><parameter=e>abc</parameter>",
       "<parameter=city>P</parameter><parameter=e>abcd</parameter>"});
  // Random walks over a nested format: reasoning, then free text with tool calls whose arguments are Qwen XML.
  const std::string nested = R"({"type": "sequence", "elements": [
    {"type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"},
    {"type": "triggered_tags", "triggers": ["<tool"], "tags": [{"type": "tag", "begin": "<tool>",
      "content": {"type": "qwen_xml_parameter", "json_schema": {"type": "object", "properties": {
        "q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"]}}, "end": "</tool>"}]}]})";
  Case c{"format_walks", "structural_format", ojson::parse(nested).dump(), {}, -1};
  auto vocab = testing::byte_vocab({"<think>", "</think>", "</thi", "nk>", "<tool>", "</tool>", "<tool",
                                    "<parameter=q>", "</parameter>", "<parameter=n>", "12", " the", "\n"});
  auto compiled = compile(build_structural_format(c.source), vocab);
  std::mt19937 rng(13);
  for (int walk = 0; walk < 8; ++walk) {
    Matcher m(compiled);
    std::string text;
    std::vector<uint32_t> mask(m.mask_words());
    for (int step = 0; step < 60 && !(step >= 30 && m.can_terminate()); ++step) {
      m.fill_next_token_bitmask(mask);
      std::vector<int32_t> allowed, multi;
      for (int32_t id = 0; id < vocab->stop_ids[0]; ++id) {
        if (!testing::bit(mask, id) || vocab->special[id]) continue;
        allowed.push_back(id);
        if (id >= 256) multi.push_back(id);
      }
      if (allowed.empty()) break;
      const auto& pool = !multi.empty() && rng() % 4 != 0 ? multi : allowed;
      const int32_t id = pool[rng() % pool.size()];
      ASSERT_TRUE(m.accept_token(id));
      text += vocab->token_bytes[id];
    }
    if (m.can_terminate()) c.strings.push_back(text);
  }
  EXPECT_GT(c.strings.size(), 2u);
  cases.push_back(std::move(c));
}

std::vector<Case> build_cases() {
  std::vector<Case> cases;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fs::path(TESSERA_SOURCE_DIR) / "tests/grammar/schemas"))
    files.push_back(e.path());
  std::sort(files.begin(), files.end());
  auto vocab = testing::byte_vocab(testing::json_tokens());
  std::mt19937 rng(5);
  for (const auto& f : files) {
    const ojson doc = ojson::parse(read_file(f));
    Case c{f.stem().string(), "schema", doc["schema"].dump(), {}, -1};
    for (const auto& s : doc["valid"]) {
      c.strings.push_back(s.get<std::string>());
      c.strings.push_back(ojson::parse(s.get<std::string>()).dump());  // compact: no whitespace at all
    }
    for (const auto& s : doc["invalid"]) c.strings.push_back(s.get<std::string>());
    GrammarBuilder b;
    Matcher m(compile(b.build(b.add_json_schema(doc["schema"])), vocab));
    const testing::Walk walk = testing::random_walk(m, *vocab, rng, 300);
    if (walk.terminated) {
      c.walk_index = static_cast<int>(c.strings.size());
      c.strings.push_back(walk.text);
    }
    cases.push_back(std::move(c));
  }
  cases.push_back({"ebnf_arith",
                   "ebnf",
                   R"G(root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")")G",
                   {"1+2*3", "(1+2)*3", "((4))", "1+", "()", "1++2", "12/(3-4)"},
                   -1});
  cases.push_back({"ebnf_classes",
                   "ebnf",
                   R"G(root ::= [a-zA-Z_] [a-zA-Z0-9_]{0,7} ("=" [^\n;]* ";")?)G",
                   {"x", "abc_123", "abcdefghi", "a=b c;", "a=\xc3\xa9;", "a=b\n;", "9a"},
                   -1});
  cases.push_back({"ebnf_escapes",
                   "ebnf",
                   R"G(root ::= "\"" ( [^"\\] | "\\" ["\\nt] )* "\"")G",
                   {R"("")", R"("a\"b")", R"("a\\")", R"("a"b")", R"("\x")"},
                   -1});
  add_structural_tag_cases(cases);
  add_structural_format_cases(cases);
  return cases;
}

TEST(GrammarXgrammarOracle, AgreesOnFixturesAndGrammars) {
  if (!fs::exists(kNodeDir / "node_modules/@mlc-ai/web-xgrammar")) {
    GTEST_SKIP() << "tests/node/node_modules/@mlc-ai/web-xgrammar absent: run scripts/fetch_test_data.sh";
  }
  const std::vector<Case> cases = build_cases();
  ojson input = ojson::array();
  for (const auto& c : cases) {
    input.push_back({{"kind", c.kind},
                     {"source", c.source},
                     {"any_whitespace", true},
                     {"strict", false},
                     {"max_whitespace", JsonOptions().max_whitespace},
                     {"strings", c.strings}});
  }
  const fs::path in_path = fs::temp_directory_path() / ("grammar_oracle_" + std::to_string(::getpid()) + ".json");
  std::ofstream(in_path) << input.dump();
  const std::string command =
      "cd '" + kNodeDir.string() + "' && node grammar_refs_xgrammar.mjs '" + in_path.string() + "'";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  fs::remove(in_path);
  ASSERT_EQ(status, 0) << "node failed: " << output;
  const ojson results = ojson::parse(output);
  ASSERT_EQ(results.size(), cases.size());
  size_t compared = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    auto listed = [&](const std::string& text) {
      return std::find_if(kDifferences.begin(), kDifferences.end(), [&](const Difference& d) {
               return d.case_name == c.name && d.text == text;
             }) != kDifferences.end();
    };
    if (!results[i].is_array()) {
      EXPECT_TRUE(listed(kError)) << c.name << ": xgrammar error " << results[i].dump();
      continue;
    }
    for (size_t j = 0; j < c.strings.size(); ++j) {
      const std::string& text = c.strings[j];
      if (static_cast<int>(j) == c.walk_index && listed(kWalk)) continue;
      const bool theirs = results[i][j].get<bool>();
      const bool ours = our_accepts(c, text);
      const auto known = std::find_if(kDifferences.begin(), kDifferences.end(),
                                      [&](const Difference& d) { return d.case_name == c.name && d.text == text; });
      if (known != kDifferences.end()) {
        EXPECT_NE(ours, theirs) << c.name << ": listed difference no longer differs: " << text;
        continue;
      }
      EXPECT_EQ(ours, theirs) << c.name << ": " << ojson(text).dump() << " (xgrammar "
                              << (theirs ? "accepts" : "rejects") << ")";
      ++compared;
    }
  }
  EXPECT_GT(compared, 150u);
}

}  // namespace
}  // namespace tessera::grammar
