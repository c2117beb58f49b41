// Builds the statement tree from tokens, following Jinja2's grammar and operator precedence:
// ternary < or < and < not < comparisons/in < + - < ~ < * / // % < ** < unary -/+ < filters, tests, calls.
#pragma once
#include <string_view>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace tessera::tokenizer::jinja {

// Throws TemplateError (with the line) on a syntax error or an unsupported tag (include, extends, import).
Body parse_template(std::string_view source, const LexerOptions& options = {});

}  // namespace tessera::tokenizer::jinja
