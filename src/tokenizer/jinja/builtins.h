// The names templates call: filters (`x | trim`), tests (`x is string`), methods of strings, dicts and
// lists (`s.startswith('a')`, `d.items()`), and global functions (range, namespace, raise_exception).
// Each follows Jinja2 / Python behaviour; unknown names are errors, as in Jinja2.
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "tokenizer/jinja/limits.h"
#include "tokenizer/jinja/value.h"

namespace tessera::tokenizer::jinja {

// filters.cpp
Value call_filter(std::string_view name, const Value& operand, const Args& args, const RenderLimits& limits);
// tests.cpp
bool call_test(std::string_view name, const Value& operand, const Args& args);
// methods.cpp: the bound method `object.name`, or nullopt when the type has no such method. Methods that
// build strings or lists charge them against `limits` before allocating.
std::optional<Value> bound_method(const Value& object, const std::string& name, const RenderLimits& limits);
// "%s" % x, its widths and precisions charged against `limits` before anything is padded.
std::string python_percent_format(const std::string& format, const Value& arguments, const RenderLimits& limits);
// String helpers shared by filters and methods.
std::string python_strip(const std::string& text, const Value& chars, bool left, bool right);
std::string python_upper(const std::string& text);
std::string python_lower(const std::string& text);
// globals.cpp: range, namespace, dict, raise_exception, strftime_now.
void install_globals(Dict& globals, const RenderLimits& limits);

// raise_exception() in a template: the message is the template author's.
class TemplateRaised : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace tessera::tokenizer::jinja
