// A parsed Jinja template, rendered as Jinja2 renders it in transformers' chat-template environment.
// Parse once (at model load), render per request: render() is const and thread-safe.
#pragma once
#include <string>
#include <string_view>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/limits.h"
#include "tokenizer/jinja/value.h"

namespace tessera::tokenizer::jinja {

class Template {
 public:
  // Throws TemplateError for a syntax error, with its line.
  explicit Template(std::string_view source);
  // `variables` are the template's globals (messages, tools, ...); range, namespace, raise_exception and
  // strftime_now are added. Throws TemplateError with the line for runtime errors, raise_exception()
  // and exceeded limits.
  std::string render(const Dict& variables, const RenderLimits& limits = {}) const;
  // The parsed statements, for callers that inspect what a template does (e.g. whether it loops over content).
  const Body& body() const { return body_; }

 private:
  Body body_;
};

}  // namespace tessera::tokenizer::jinja
