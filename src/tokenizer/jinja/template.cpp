#include "tokenizer/jinja/template.h"

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/parser.h"

namespace tessera::tokenizer::jinja {

Template::Template(std::string_view source) : body_(parse_template(source)) {}

std::string Template::render(const Dict& variables, const RenderLimits& limits) const {
  Dict builtins;
  install_globals(builtins, limits);
  auto globals = std::make_shared<Scope>(nullptr);
  for (const auto& [name, value] : builtins.entries()) globals->set(name, value);
  for (const auto& [name, value] : variables.entries()) globals->set(name, value);
  Interpreter interpreter(limits);
  return interpreter.render(body_, globals);
}

}  // namespace tessera::tokenizer::jinja
