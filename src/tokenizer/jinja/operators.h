// Python semantics of the operators and of attribute/item access as Jinja2 applies them to values.
// Errors throw ValueError with Python's wording; the interpreter adds the template line.
#pragma once
#include <string>
#include <string_view>

#include "tokenizer/jinja/limits.h"
#include "tokenizer/jinja/value.h"

namespace tessera::tokenizer::jinja {

// `obj.name`: a dict's method (items, get, ...) or else its key; a string's or list's method;
// Undefined when missing. Throws when obj itself is Undefined, as Jinja2's Undefined does. Methods
// charge what they build against `limits`.
Value get_attribute(const Value& object, const std::string& name, const RenderLimits& limits);
// `obj[key]`: list/string index (negative counts from the end), dict key, else attribute; Undefined when missing.
Value get_item(const Value& object, const Value& key, const RenderLimits& limits);
// `obj[start:stop:step]` on lists and strings (by code point); absent parts are Undefined.
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step);

// Arithmetic and comparison: "+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", ">", "<=", ">=",
// "in", "not in". Strings and lists that "*", "+", "~" and "%" would build are charged against
// limits.max_output_bytes first; integer results that do not fit in 64 bits are errors.
Value binary_operation(std::string_view op, const Value& left, const Value& right, const RenderLimits& limits);
Value unary_minus(const Value& operand);
bool contains(const Value& container, const Value& item);  // Python `item in container`
// Python ordering for sort/min/max and < >: numbers, strings, lists; throws for other mixes.
int compare_values(const Value& left, const Value& right);

// The items a for loop visits: list items, dict keys, string characters; nothing for Undefined.
List iterate(const Value& value, const RenderLimits& limits);
// Throws the error Jinja2's Undefined raises when used (its hint, or "'name' is undefined").
[[noreturn]] void throw_undefined(const Value& undefined);

}  // namespace tessera::tokenizer::jinja
