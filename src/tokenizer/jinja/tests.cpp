// Jinja2's tests (`x is name args`), with Python's notion of each type: bool counts as a number,
// dicts and strings are sequences, Undefined is iterable.
#include <cmath>
#include <cstdint>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/format.h"
#include "tokenizer/jinja/operators.h"

namespace tessera::tokenizer::jinja {

bool call_test(std::string_view name, const Value& value, const Args& args) {
  auto arg = [&]() {
    if (!args.has(0, Args::kPositionalOnly)) throw ValueError("test '" + std::string(name) + "' needs an argument");
    return args.get(0, Args::kPositionalOnly);
  };
  if (name == "defined") return !value.is_undefined();
  if (name == "undefined") return value.is_undefined();
  if (name == "none") return value.is_none();
  if (name == "boolean") return value.is_bool();
  if (name == "true") return value.is_bool() && value.as_bool();
  if (name == "false") return value.is_bool() && !value.as_bool();
  if (name == "integer") return value.is_int();
  if (name == "float") return value.is_float();
  if (name == "number") return value.is_number();
  if (name == "string") return value.is_string();
  if (name == "mapping") return value.is_dict() && !value.as_dict().is_namespace;
  if (name == "iterable")
    return value.is_undefined() || value.is_string() || value.is_list() ||
           (value.is_dict() && !value.as_dict().is_namespace);
  if (name == "sequence")
    return value.is_undefined() || value.is_string() || value.is_list() ||
           (value.is_dict() && !value.as_dict().is_namespace);
  if (name == "callable") return value.is_function() || value.is_undefined();  // Undefined defines __call__
  if (name == "odd" || name == "even") {
    // Jinja2: value % 2 == 1 (odd) or == 0 (even), so floats are allowed and 2.5 is neither.
    Value remainder = binary_operation("%", value, Value(2), RenderLimits{});
    return values_equal(remainder, Value(name == "odd" ? 1 : 0));
  }
  if (name == "divisibleby") {
    Value divisor = arg();
    if (!value.is_number() || !divisor.is_number() || divisor.as_float() == 0) {
      throw ValueError("test 'divisibleby' needs non-zero numbers");
    }
    if (value.is_float() || divisor.is_float()) return std::fmod(value.as_float(), divisor.as_float()) == 0;
    // Through Python's %, which knows that INT64_MIN % -1 is 0 (the C++ expression traps).
    return values_equal(binary_operation("%", value, divisor, RenderLimits{}), Value(0));
  }
  if (name == "eq" || name == "equalto" || name == "==") return values_equal(value, arg());
  if (name == "ne" || name == "!=") return !values_equal(value, arg());
  if (name == "lt" || name == "lessthan" || name == "<") return compare_values(value, arg()) < 0;
  if (name == "le" || name == "<=") return compare_values(value, arg()) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare_values(value, arg()) > 0;
  if (name == "ge" || name == ">=") return compare_values(value, arg()) >= 0;
  if (name == "in") return contains(arg(), value);
  if (name == "sameas") {
    Value other = arg();
    if (value.type() != other.type()) return false;
    if (value.is_none() || value.is_undefined()) return true;
    if (value.is_bool()) return value.as_bool() == other.as_bool();
    if (value.is_list()) return value.list_ptr() == other.list_ptr();
    if (value.is_dict()) return value.dict_ptr() == other.dict_ptr();
    return values_equal(value, other);
  }
  if (name == "lower" || name == "upper") {
    // Jinja2: str(value).islower() / .isupper(): at least one cased character, and none of the other case.
    std::string text = python_str(value);
    bool has_cased = python_lower(text) != python_upper(text);
    return has_cased && (name == "lower" ? python_lower(text) == text : python_upper(text) == text);
  }
  if (name == "escaped") return false;
  throw ValueError("no test named '" + std::string(name) + "'");
}

}  // namespace tessera::tokenizer::jinja
