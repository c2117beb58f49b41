// Front ends: GBNF/EBNF, Lark subset, regex, choices and literals. Each accepts what it should, rejects
// what it should not, and reports unsupported constructs by name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "grammar_test_util.h"

namespace tessera::grammar {
namespace {

using testing::build_ebnf;
using testing::build_regex;
using ::testing::HasSubstr;
using testing::matches;

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(GrammarEbnf, LiteralsClassesAndOperators) {
  auto g = build_ebnf(R"(
    # a comment
    root ::= greeting " " name ("!" | "?")?
    greeting ::= "hi" | "hello"
    name ::= [A-Z] [a-z]* )");
  EXPECT_TRUE(matches(g, "hi Bob"));
  EXPECT_TRUE(matches(g, "hello Al!"));
  EXPECT_TRUE(matches(g, "hi X?"));
  EXPECT_FALSE(matches(g, "hi bob"));
  EXPECT_FALSE(matches(g, "hey Bob"));
  EXPECT_FALSE(matches(g, "hi Bob!!"));
}

TEST(GrammarEbnf, RepetitionBoundsEscapesAndNegatedClasses) {
  auto g = build_ebnf(R"(root ::= "\x41" [0-9]{2,3} "\n" [^"\\]+ "\u00e9")");
  EXPECT_TRUE(matches(g, "A12\nxyz\xc3\xa9"));
  EXPECT_TRUE(matches(g, "A123\n\xe4\xb8\xad\xc3\xa9"));
  EXPECT_FALSE(matches(g, "A1\nx\xc3\xa9"));
  EXPECT_FALSE(matches(g, "A1234\nx\xc3\xa9"));
  EXPECT_FALSE(matches(g, "A12\nx\"\xc3\xa9"));
  auto exact = build_ebnf(R"(root ::= ("ab"){2} "c"{1,} 'd'?)");
  EXPECT_TRUE(matches(exact, "ababc"));
  EXPECT_TRUE(matches(exact, "ababcccd"));
  EXPECT_FALSE(matches(exact, "abc"));
}

TEST(GrammarEbnf, RecursionAndDot) {
  auto g = build_ebnf(R"G(root ::= "(" inner ")"
                         inner ::= root | . )G");
  EXPECT_TRUE(matches(g, "(x)"));
  EXPECT_TRUE(matches(g, "(((\xe4\xb8\xad)))"));
  EXPECT_FALSE(matches(g, "((x)"));
  EXPECT_FALSE(matches(g, "()"));
}

TEST(GrammarEbnf, ErrorsNameTheConstruct) {
  EXPECT_THAT(error_of([] { build_ebnf("root ::= \"a"); }), HasSubstr("unterminated string literal"));
  EXPECT_THAT(error_of([] { build_ebnf("root ::= a"); }), HasSubstr("rule 'a' is referenced but not defined"));
  EXPECT_THAT(error_of([] { build_ebnf("root ::= root \"a\" | \"b\""); }), HasSubstr("left recursion"));
  EXPECT_THAT(error_of([] { build_ebnf("root ::= [b-a]"); }), HasSubstr("range out of order"));
  EXPECT_THAT(error_of([] { build_ebnf("root ::= (\"a\""); }), HasSubstr("missing ')'"));
  EXPECT_THAT(error_of([] { build_ebnf("root ::= \"a\" x\nx ::= \"b\" x"); }), HasSubstr("matches no string"));
  EXPECT_THAT(error_of([] { build_ebnf("x ::= \"a\"", "root"); }), HasSubstr("root rule 'root' is not defined"));
  EXPECT_THAT(error_of([] { build_ebnf("root ::= (= \"a\")"); }), HasSubstr("lookahead"));
  EXPECT_THAT(error_of([] { build_ebnf("root ::= \"a\" ::="); }), HasSubstr("line 1"));
}

TEST(GrammarLark, RulesTerminalsRegexOptional) {
  GrammarBuilder b;
  b.add_lark(R"G(
    // a call like add(1, 22)
    start: NAME "(" [args] ")"
    ?args: NUMBER ("," " "? NUMBER)*
    NAME: /[a-z_]+/
    NUMBER: /\d+/
         | "-" /\d+/
  )G");
  auto g = b.build("start");
  EXPECT_TRUE(matches(g, "add(1, 22)"));
  EXPECT_TRUE(matches(g, "f()"));
  EXPECT_TRUE(matches(g, "f(-3,4)"));
  EXPECT_FALSE(matches(g, "F(1)"));
  EXPECT_FALSE(matches(g, "f(1,)"));
}

TEST(GrammarLark, UnsupportedConstructsAreNamed) {
  auto lark_error = [](const std::string& text) {
    return error_of([&] {
      GrammarBuilder b;
      b.add_lark(text);
      b.build("start");
    });
  };
  EXPECT_THAT(lark_error("start: \"a\"\n%ignore \" \""), HasSubstr("directive %ignore"));
  EXPECT_THAT(lark_error("%import common.WS\nstart: \"a\""), HasSubstr("directive %import"));
  EXPECT_THAT(lark_error("start: \"a\" -> alias"), HasSubstr("alias"));
  EXPECT_THAT(lark_error("start: \"a\"i"), HasSubstr("case-insensitive"));
  EXPECT_THAT(lark_error("start: /a/i"), HasSubstr("regex flag 'i'"));
  EXPECT_THAT(lark_error("start.2: \"a\""), HasSubstr("priority"));
  EXPECT_THAT(lark_error("start: \"a\" ~ 3"), HasSubstr("~"));
}

TEST(GrammarRegex, SyntaxCoverage) {
  auto g = build_regex(R"(^(?:\d{3}-)?\w+\s[^\W\d]{2,}(x|y|z)*\.$)");
  EXPECT_TRUE(matches(g, "123-ab_9 Cd."));
  EXPECT_TRUE(matches(g, "a\tbbbxyz."));
  EXPECT_FALSE(matches(g, "a b1."));
  EXPECT_FALSE(matches(g, "12-a bb."));
  auto dot = build_regex("a.c");
  EXPECT_TRUE(matches(dot,
                      "a\xe4\xb8\xad"
                      "c"));
  EXPECT_FALSE(matches(dot, "a\nc"));
  auto counts = build_regex("(ab){2}c{1,}d{0,2}[-+]?");
  EXPECT_TRUE(matches(counts, "ababcccdd-"));
  EXPECT_FALSE(matches(counts, "ababddd"));
  auto escapes = build_regex(R"(\u00e9\x41\t[\]\-a]\/)");
  EXPECT_TRUE(matches(escapes,
                      "\xc3\xa9"
                      "A\t-/"));
  EXPECT_TRUE(matches(escapes,
                      "\xc3\xa9"
                      "A\t]/"));
}

TEST(GrammarRegex, UnsupportedConstructsAreNamed) {
  EXPECT_THAT(error_of([] { build_regex("a(?=b)"); }), HasSubstr("lookahead"));
  EXPECT_THAT(error_of([] { build_regex("a(?!b)"); }), HasSubstr("lookahead"));
  EXPECT_THAT(error_of([] { build_regex("(?<=a)b"); }), HasSubstr("lookbehind"));
  EXPECT_THAT(error_of([] { build_regex("(a)\\1"); }), HasSubstr("backreference"));
  EXPECT_THAT(error_of([] { build_regex("(?<n>a)\\k<n>"); }), HasSubstr("named backreference"));
  EXPECT_THAT(error_of([] { build_regex("a^b"); }), HasSubstr("anchor ^"));
  EXPECT_THAT(error_of([] { build_regex("a$b"); }), HasSubstr("anchor $"));
  EXPECT_THAT(error_of([] { build_regex("\\bword"); }), HasSubstr("word boundary"));
  EXPECT_THAT(error_of([] { build_regex("a**"); }), HasSubstr("nothing to repeat"));
  EXPECT_THAT(error_of([] { build_regex("(a"); }), HasSubstr("missing ')'"));
  EXPECT_THAT(error_of([] { build_regex("a{3,1}"); }), HasSubstr("n < m"));
  EXPECT_THAT(error_of([] { build_regex("\\p{L}"); }), HasSubstr("Unicode property"));
}

TEST(GrammarChoice, ChoicesAndLiteralsCombineWithEbnf) {
  GrammarBuilder b;
  const std::string color = b.add_choice({"red", "green", "blue"});
  const std::string prefix = b.add_literal("<tool>");
  JsonOptions compact;
  compact.any_whitespace = false;
  const std::string args = b.add_json_schema_text(R"({"type":"object","properties":{"x":{"type":"integer"}},
                                                      "required":["x"],"additionalProperties":false})",
                                                  compact);
  b.add_ebnf("root ::= " + prefix + " " + color + " \" \" " + args + " \"</tool>\"");
  auto g = b.build("root");
  EXPECT_TRUE(matches(g, "<tool>red {\"x\": 12}</tool>"));
  EXPECT_TRUE(matches(g, "<tool>blue {\"x\": -3}</tool>"));
  EXPECT_FALSE(matches(g, "<tool>pink {\"x\": 1}</tool>"));
  EXPECT_FALSE(matches(g, "<tool>red {\"x\": 1.5}</tool>"));
  EXPECT_THAT(error_of([] { GrammarBuilder().add_choice({}); }), HasSubstr("no choices"));
}

}  // namespace
}  // namespace tessera::grammar
