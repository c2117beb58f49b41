// Splits template source into text and tag tokens, with Jinja2's whitespace rules as transformers
// configures them: trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, "\r\n" -> "\n",
// plus the explicit `{%-`, `-%}`, `{%+`, `+%}` controls and `{% raw %}` blocks.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace tessera::tokenizer::jinja {

struct Token {
  enum class Type {
    kText,
    kVariableBegin,
    kVariableEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInteger,
    kFloat,
    kOperator,
    kEnd
  };
  Type type;
  std::string value;  // text, name, decoded string literal, number spelling or operator
  int line;
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws TemplateError on an unterminated tag, string or comment.
std::vector<Token> tokenize(std::string_view source, const LexerOptions& options = {});

}  // namespace tessera::tokenizer::jinja
