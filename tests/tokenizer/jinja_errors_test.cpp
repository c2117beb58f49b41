// Errors and limits of the Jinja interpreter: messages name the template line, raise_exception keeps the
// author's message, and runaway templates stop at the render limits instead of hanging or exhausting memory.
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

TemplateError render_error(const std::string& source, const RenderLimits& limits = {}) {
  try {
    render(source, limits);
  } catch (const TemplateError& e) {
    return e;
  }
  ADD_FAILURE() << "expected a TemplateError from: " << source;
  return TemplateError("none", 0);
}

TEST(JinjaErrors, SyntaxErrorNamesItsLine) {
  TemplateError e = render_error("line one\n{% if true %}\n{{ 1 + }}\n{% endif %}");
  EXPECT_EQ(e.line(), 3);
  EXPECT_THAT(std::string(e.what()), HasSubstr("line 3"));
}

TEST(JinjaErrors, UnclosedBlockSaysWhatIsMissing) {
  TemplateError e = render_error("{% for x in xs %}\n{% if x %}\nbody\n{% endfor %}");
  EXPECT_THAT(e.message(), HasSubstr("'endif'"));
}

TEST(JinjaErrors, RuntimeErrorNamesItsLine) {
  TemplateError e = render_error("a\nb\n  {{ missing.attribute }}");
  EXPECT_EQ(e.line(), 3);
  EXPECT_THAT(e.message(), HasSubstr("'missing' is undefined"));
  EXPECT_FALSE(e.raised_by_template());
}

TEST(JinjaErrors, TypeErrorsUsePythonWording) {
  EXPECT_THAT(render_error("{{ 'a' + none }}").message(),
              HasSubstr("can only concatenate str (not \"NoneType\") to str"));
  EXPECT_THAT(render_error("{{ 'a' in none }}").message(), HasSubstr("argument of type 'NoneType' is not iterable"));
  EXPECT_THAT(render_error("{{ {}.x.y }}").message(), HasSubstr("'dict object' has no attribute 'x'"));
}

TEST(JinjaErrors, RaiseExceptionKeepsTheTemplateMessage) {
  TemplateError e =
      render_error("{% if true %}\n{{ raise_exception('Roles must alternate user/assistant') }}\n{% endif %}");
  EXPECT_TRUE(e.raised_by_template());
  EXPECT_EQ(e.message(), "Roles must alternate user/assistant");
  EXPECT_EQ(e.line(), 2);
}

TEST(JinjaErrors, UnsupportedTagsAreRejectedAtParse) {
  EXPECT_THAT(render_error("{% include 'other.jinja' %}").message(), HasSubstr("not supported"));
  EXPECT_THAT(render_error("{% frobnicate %}").message(), HasSubstr("unknown tag 'frobnicate'"));
}

TEST(JinjaErrors, UnterminatedTokens) {
  EXPECT_THAT(render_error("{{ 'open string }}").message(), HasSubstr("unterminated string"));
  EXPECT_THAT(render_error("{# never closed").message(), HasSubstr("unterminated comment"));
  EXPECT_THAT(render_error("{{ 1 ").message(), HasSubstr("expected '}}'"));
}

TEST(JinjaLimits, LoopIterationsAreBounded) {
  RenderLimits limits;
  limits.max_loop_iterations = 10000;
  std::string nested =
      "{% for i in range(100) %}{% for j in range(100) %}{% for k in range(100) %}{% endfor %}"
      "{% endfor %}{% endfor %}";
  EXPECT_THAT(render_error(nested, limits).message(), HasSubstr("loop iterations"));
  // Just under the limit is fine: 100 + 100*99 = 10000 iterations.
  EXPECT_EQ(render("{% for i in range(100) %}{% for j in range(99) %}{% endfor %}{% endfor %}ok", limits), "ok");
  EXPECT_THAT(render_error("{% for i in range(1000000000) %}{% endfor %}", limits).message(), HasSubstr("range()"));
}

TEST(JinjaLimits, OutputSizeIsBounded) {
  RenderLimits limits;
  limits.max_output_bytes = 100000;
  EXPECT_THAT(render_error("{% for i in range(1000) %}{{ 'x' * 1000 }}{% endfor %}", limits).message(),
              HasSubstr("output limit"));
  // String repetition is checked before it allocates.
  EXPECT_THAT(render_error("{{ 'x' * 1000000000000 }}", limits).message(), HasSubstr("limit"));
  EXPECT_THAT(
      render_error("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                   limits)
          .message(),
      HasSubstr("limit"));
  EXPECT_EQ(render("{{ 'x' * 1000 }}", limits).size(), 1000u);
}

TEST(JinjaLimits, MacroRecursionIsBounded) {
  RenderLimits limits;
  limits.max_call_depth = 20;
  EXPECT_THAT(render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", limits).message(),
              HasSubstr("nested deeper than 20"));
  EXPECT_EQ(render("{% macro f(n) %}{% if n < 10 %}{{ n }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}", limits),
            "0123456789");
}

TEST(JinjaTemplate, RendersAreIndependent) {
  // A parsed template is reused across requests: namespace state must not leak from one render to the next.
  Template t("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}");
  Dict two, three;
  two.set("messages", Value(List{Value(1), Value(2)}));
  three.set("messages", Value(List{Value(1), Value(2), Value(3)}));
  EXPECT_EQ(t.render(two), "2");
  EXPECT_EQ(t.render(three), "3");
  EXPECT_EQ(t.render(two), "2");
}

}  // namespace
}  // namespace tessera::tokenizer::jinja
