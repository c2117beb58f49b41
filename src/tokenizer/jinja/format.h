// Text forms of values exactly as Python prints them: str() for template output, repr() for items
// inside printed lists and dicts, and json.dumps() for the tojson filter.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "tokenizer/jinja/value.h"

namespace tessera::tokenizer::jinja {

std::string python_str(const Value& value);   // what {{ value }} prints: True, None, ['a', 1]
std::string python_repr(const Value& value);  // 'text' with Python's quoting and escapes
// The same, throwing ValueError once the text of a list or dict passes `max_bytes` (a list that holds
// the same long string many times prints far more than it stores).
std::string python_str(const Value& value, size_t max_bytes);
std::string python_repr(const Value& value, size_t max_bytes);
std::string python_float_repr(double value);  // 0.5, 1.0, 1e-05, 1e+16, inf, nan

struct JsonDumpOptions {
  std::optional<int> indent;                  // json.dumps(indent=N): newlines and N spaces per level
  std::optional<std::string> item_separator;  // default ", ", or "," when indenting, as Python
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;    // transformers passes ensure_ascii=False
  size_t max_bytes = SIZE_MAX;  // the output limit: passing it throws ValueError before the text grows further
};
// Python json.dumps(value, ...). Throws ValueError for values JSON cannot hold (Undefined, callables).
std::string python_json_dumps(const Value& value, const JsonDumpOptions& options);

}  // namespace tessera::tokenizer::jinja
