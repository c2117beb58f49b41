// Hostile templates and values: integer arithmetic that would overflow or trap, nesting deep enough to
// exhaust the stack while parsing or rendering, and filters and methods that would allocate far more
// than the render's output limit. Each must fail with a named TemplateError, never crash or allocate.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tokenizer/jinja/template.h"

namespace tessera::tokenizer::jinja {
namespace {

using ::testing::HasSubstr;

std::string render(const std::string& source, const RenderLimits& limits = {}) {
  return Template(source).render(Dict{}, limits);
}

std::string error_of(const std::string& source, const RenderLimits& limits = {}) {
  try {
    render(source, limits);
  } catch (const TemplateError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a TemplateError from: " << source.substr(0, 200);
  return "";
}

std::string repeat(const std::string& text, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += text;
  return out;
}

constexpr const char* kMin = "(-9223372036854775807 - 1)";

TEST(JinjaArithmetic, DivisionOfTheSmallestIntegerByMinusOneIsAnError) {
  EXPECT_THAT(error_of(std::string("{{ ") + kMin + " // -1 }}"), HasSubstr("integer overflow"));
  // Python: every integer is divisible by -1.
  EXPECT_EQ(render(std::string("{{ ") + kMin + " % -1 }}"), "0");
  EXPECT_EQ(render("{{ 7 % -1 }}|{{ -7 // 2 }}|{{ -7 % 3 }}"), "0|-4|2");
  EXPECT_EQ(render(std::string("{{ ") + kMin + " is divisibleby(-1) }}"), "True");
}

TEST(JinjaArithmetic, AdditionSubtractionAndProductAreChecked) {
  EXPECT_THAT(error_of("{{ 9223372036854775807 + 1 }}"), HasSubstr("integer overflow"));
  EXPECT_THAT(error_of(std::string("{{ ") + kMin + " - 1 }}"), HasSubstr("integer overflow"));
  EXPECT_THAT(error_of("{{ 4611686018427387904 * 2 }}"), HasSubstr("integer overflow"));
  EXPECT_THAT(error_of(std::string("{{ -") + kMin + " }}"), HasSubstr("integer overflow"));
  EXPECT_THAT(error_of(std::string("{{ ") + kMin + " | abs }}"), HasSubstr("integer overflow"));
  EXPECT_THAT(error_of("{{ [1, 2] | sum(start=9223372036854775807) }}"), HasSubstr("integer overflow"));
  EXPECT_EQ(render("{{ 4611686018427387904 * -2 }}"), "-9223372036854775808");
  EXPECT_EQ(render("{{ 9223372036854775806 + 1 }}"), "9223372036854775807");
}

TEST(JinjaArithmetic, PowerIsExactOrAnError) {
  EXPECT_EQ(render("{{ 2 ** 62 }}|{{ (-2) ** 63 }}|{{ (-1) ** 65 }}|{{ 1 ** 1000000000000 }}|{{ 0 ** 0 }}"),
            "4611686018427387904|-9223372036854775808|-1|1|1");
  EXPECT_THAT(error_of("{{ 2 ** 63 }}"), HasSubstr("integer overflow"));
  EXPECT_THAT(error_of("{{ 10 ** 1000 }}"), HasSubstr("integer overflow"));
}

TEST(JinjaArithmetic, IntegerLiteralsOutOfRangeAreRefused) {
  EXPECT_THAT(error_of("{{ 99999999999999999999 }}"), HasSubstr("does not fit"));
  EXPECT_EQ(render("{{ 9223372036854775807 }}"), "9223372036854775807");
}

TEST(JinjaArithmetic, HugeStepsEndSlicesAndRanges) {
  EXPECT_EQ(render("{{ 'abc'[::9223372036854775807] }}|{{ 'abc'[::-9223372036854775807] }}"), "a|c");
  EXPECT_EQ(render("{{ range(0, 9223372036854775807, 4611686018427387904) | list }}"), "[0, 4611686018427387904]");
  EXPECT_EQ(render("{{ range(0, -9223372036854775807, -9223372036854775807) | list }}"), "[0]");
  EXPECT_THAT(error_of("{{ 1e300 | int }}"), HasSubstr("does not fit"));
  EXPECT_EQ(render("{{ -2.5 | int }}|{{ 'nan' | float | int }}"), "-2|0");
}

TEST(JinjaNesting, DeepTemplatesFailAtParseNamingTheLimit) {
  const int n = 20000;
  std::string parens = "{{ " + repeat("(", n) + "1" + repeat(")", n) + " }}";
  std::string lists = "{{ " + repeat("[", n) + "1" + repeat("]", n) + " }}";
  std::string ifs = repeat("{% if true %}", n) + "x" + repeat("{% endif %}", n);
  std::string sums = "{{ 1" + repeat(" + 1", n) + " }}";
  std::string attributes = "{{ x" + repeat(".a", n) + " }}";
  std::string negations = "{{ " + repeat("-", n) + "1 }}";
  std::string nots = "{{ " + repeat("not ", n) + "1 }}";
  std::string filters = "{{ 1" + repeat(" | string", n) + " }}";
  std::string calls = "{{ f" + repeat("()", n) + " }}";
  for (const std::string* source : {&parens, &lists, &ifs, &sums, &attributes, &negations, &nots, &filters, &calls}) {
    std::string message = error_of(*source);
    EXPECT_THAT(message, HasSubstr("nests deeper than")) << source->substr(0, 40);
    EXPECT_THAT(message, HasSubstr("line 1")) << source->substr(0, 40);
  }
  // Real templates stay far below the limit.
  EXPECT_EQ(render("{{ " + repeat("(", 100) + "1" + repeat(")", 100) + " }}"), "1");
  EXPECT_EQ(render("{{ 0" + repeat(" + 1", 100) + " }}"), "100");
}

TEST(JinjaNesting, RenderRecursionIsBounded) {
  // Each macro call nests the list literal around the next call: calls × literal depth frames.
  std::string nested_call = repeat("[", 100) + "f(n + 1)" + repeat("]", 100);
  std::string source =
      "{% macro f(n) %}{% if n < 60 %}{{ " + nested_call + " | length }}{% endif %}{% endmacro %}{{ f(0) }}";
  EXPECT_THAT(error_of(source), HasSubstr("nests deeper than"));
}

TEST(JinjaNesting, ValuesBuiltInLoopsCannotNestWithoutBound) {
  EXPECT_THAT(error_of("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}"
                       "{% endfor %}{{ ns.l }}"),
              HasSubstr("nested deeper than"));
  EXPECT_THAT(error_of("{% set ns = namespace(d={}) %}{% for i in range(100000) %}{% set ns.d = {'a': ns.d} %}"
                       "{% endfor %}{{ ns.d | tojson }}"),
              HasSubstr("nested deeper than"));
  // A chain of namespaces linked by assignment after their creation.
  EXPECT_THAT(error_of("{% set ns = namespace(prev=none) %}{% for i in range(100000) %}"
                       "{% set cur = namespace() %}{% set cur.x = ns.prev %}{% set ns.prev = cur %}{% endfor %}"),
              HasSubstr("nested deeper than"));
  EXPECT_EQ(render("{% set ns = namespace(l=[]) %}{% for i in range(3) %}{% set ns.l = [ns.l] %}{% endfor %}"
                   "{{ ns.l }}"),
            "[[[[]]]]");
}

RenderLimits small_limits() {
  RenderLimits limits;
  limits.max_output_bytes = 1 << 20;
  return limits;
}

TEST(JinjaBudget, RepetitionIsChargedBeforeAllocating) {
  RenderLimits limits = small_limits();
  // size × count wraps around 64 bits: the check must not pass because of it.
  EXPECT_THAT(error_of("{{ 'abcd' * 4611686018427387904 }}", limits), HasSubstr("output limit"));
  EXPECT_THAT(error_of("{{ [1, 2, 3, 4] * 4611686018427387904 }}", limits), HasSubstr("output limit"));
  // Lists are charged by their bytes, not their item count: 100,000 items are megabytes.
  EXPECT_THAT(error_of("{{ ([0] * 100000) | length }}", limits), HasSubstr("output limit"));
  EXPECT_THAT(error_of("{% set s = 'x' * 500000 %}{{ ([s] * 3) | length }}", limits), HasSubstr("output limit"));
  EXPECT_THAT(error_of("{% set s = 'x' * 500000 %}{{ ([s] + [s] + [s]) | length }}", limits),
              HasSubstr("output limit"));
  EXPECT_THAT(error_of("{% set s = 'x' * 500000 %}{{ [s, s, s] | length }}", limits), HasSubstr("output limit"));
  EXPECT_THAT(error_of("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}"
                       "{% endfor %}",
                       limits),
              HasSubstr("output limit"));
  EXPECT_EQ(render("{{ ([0] * 1000) | length }}|{{ 'ab' * 3 }}", limits), "1000|ababab");
}

TEST(JinjaBudget, PaddingFiltersAreCharged) {
  RenderLimits limits = small_limits();
  EXPECT_THAT(error_of("{{ 'x' | center(1000000000000) }}", limits), HasSubstr("output limit"));
  EXPECT_THAT(error_of("{{ 'a\\nb\\nc' | indent(1000000000000) }}", limits), HasSubstr("output limit"));
  EXPECT_THAT(error_of("{{ {'a': [[[1]]]} | tojson(indent=1000000000) }}", limits), HasSubstr("output limit"));
  // Python: a negative indent inserts newlines only.
  EXPECT_EQ(render("{{ [[1]] | tojson(indent=-1) }}", limits), "[\n[\n1\n]\n]");
  EXPECT_EQ(render("{{ 'x' | center(5) }}|{{ [1] | tojson(indent=2) }}", limits), "  x  |[\n  1\n]");
}

TEST(JinjaBudget, FormatWidthAndPrecisionAreChargedAndExact) {
  RenderLimits limits = small_limits();
  EXPECT_THAT(error_of("{{ '%10000000000s' % 'x' }}", limits), HasSubstr("output limit"));
  EXPECT_THAT(error_of("{{ '%.2000000000f' % 1.5 }}", limits), HasSubstr("output limit"));
  EXPECT_THAT(error_of("{{ '%2000000000d' | format(1) }}", limits), HasSubstr("output limit"));
  EXPECT_THAT(error_of("{{ '%99999999999999999999d' % 1 }}", limits), HasSubstr("output limit"));
  // Widths beyond a fixed buffer are printed whole, not cut at 511 bytes.
  EXPECT_EQ(render("{{ ('%600d' % 7) | length }}|{{ ('%-700.3f' % 2.5) | length }}|{{ '%.3f' % 2.5 }}", limits),
            "600|700|2.500");
  EXPECT_EQ(render("{{ ('%.400f' % 1.0) | length }}", limits), "402");
}

TEST(JinjaBudget, StringMethodsAreCharged) {
  RenderLimits limits = small_limits();
  EXPECT_THAT(error_of("{% set s = 'x' * 100000 %}{{ s.join(['a'] * 100) }}", limits), HasSubstr("output limit"));
  EXPECT_THAT(error_of("{% set s = 'x' * 100000 %}{{ ('{0}' * 100).format(s) }}", limits), HasSubstr("output limit"));
  EXPECT_THAT(error_of("{% set s = 'x' * 100000 %}{{ 'abcdefghijklmnop'.replace('', s) }}", limits),
              HasSubstr("output limit"));
  EXPECT_THAT(error_of("{% set s = 'x' * 100000 %}{{ 'abcdefghijklmnop' | replace('', s) }}", limits),
              HasSubstr("output limit"));
  EXPECT_THAT(error_of("{{ (',' * 500000).split(',') | length }}", limits), HasSubstr("output limit"));
  EXPECT_EQ(render("{{ ', '.join(['a', 'b']) }}|{{ '{0}{0}'.format('x') }}|{{ 'ab'.replace('', '-') }}", limits),
            "a, b|xx|-a-b-");
}

TEST(JinjaBudget, IteratingAStringIsCharged) {
  RenderLimits limits = small_limits();
  EXPECT_THAT(error_of("{% for c in 'x' * 500000 %}{% break %}{% endfor %}", limits), HasSubstr("output limit"));
  EXPECT_THAT(error_of("{{ ('x' * 500000) | list | length }}", limits), HasSubstr("output limit"));
  EXPECT_EQ(render("{% for c in 'abc' %}{{ c }}.{% endfor %}", limits), "a.b.c.");
}

}  // namespace
}  // namespace tessera::tokenizer::jinja
