// Jinja2's builtin filters as chat templates use them, plus transformers' own tojson (json.dumps with
// ensure_ascii=False and Python's separators, instead of Jinja2's HTML-safe one).
#include <fmt/format.h>
#include <optional>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "tokenizer/jinja/budget.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/format.h"
#include "tokenizer/jinja/operators.h"
#include "tokenizer/jinja/utf8.h"

namespace tessera::tokenizer::jinja {
namespace {

Value arg(const Args& args, size_t position, std::string_view name, Value fallback) {
  return args.has(position, name) ? args.get(position, name) : fallback;
}

int64_t int_arg(const Args& args, size_t position, std::string_view name, int64_t fallback) {
  Value v = arg(args, position, name, Value(fallback));
  if (!v.is_number()) throw ValueError("argument '" + std::string(name) + "' must be a number");
  return v.as_int();
}

// Jinja2's attribute getter for map/selectattr/sort: "a.b" walks item lookups.
Value lookup_attribute(const Value& item, const Value& attribute, const RenderLimits& limits) {
  if (attribute.is_int()) return get_item(item, attribute, limits);
  Value current = item;
  std::string path = python_str(attribute);
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    current = numeric ? get_item(current, Value(static_cast<int64_t>(std::stoll(part))), limits)
                      : get_item(current, Value(part), limits);
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

// The test named by args[first] applied to value with the remaining args; no test means truthiness.
bool apply_test_arg(const Value& value, const Args& args, size_t first) {
  if (args.positional.size() <= first) return truthy(value);
  Args rest;
  rest.positional.assign(args.positional.begin() + first + 1, args.positional.end());
  rest.keyword = args.keyword;
  return call_test(python_str(args.positional[first]), value, rest);
}

Value select(const Value& sequence, const Args& args, bool keep_when, bool by_attribute, const RenderLimits& limits) {
  List out;
  if (!truthy(sequence)) return Value(std::move(out));  // Jinja2 iterates only a truthy value
  for (const Value& item : iterate(sequence, limits)) {
    if (by_attribute) {
      if (args.positional.empty()) throw ValueError("selectattr/rejectattr need an attribute name");
      if (apply_test_arg(lookup_attribute(item, args.positional[0], limits), args, 1) == keep_when) out.push_back(item);
    } else if (apply_test_arg(item, args, 0) == keep_when) {
      out.push_back(item);
    }
  }
  return Value(std::move(out));
}

Value sort_key(const Value& item, const Value& attribute, bool case_sensitive, const RenderLimits& limits) {
  Value key = attribute.is_undefined() || attribute.is_none() ? item : lookup_attribute(item, attribute, limits);
  if (!case_sensitive && key.is_string()) return Value(python_lower(key.as_string()));
  return key;
}

std::string do_indent(std::string text, const Args& args, const RenderLimits& limits) {
  Value width = arg(args, 0, "width", Value(4));
  if (!width.is_string() && !width.is_number()) throw ValueError("indent width must be a number or a string");
  size_t indent_bytes = width.is_string() ? width.as_string().size() : std::max<int64_t>(0, width.as_int());
  // Every line may get the indentation: charged before it is built.
  size_t lines_count = 1 + std::count(text.begin(), text.end(), '\n') + std::count(text.begin(), text.end(), '\r');
  charge(add_bytes(text.size(), multiply_bytes(lines_count, indent_bytes)), limits, "indent");
  std::string indentation = width.is_string() ? width.as_string() : std::string(indent_bytes, ' ');
  bool first = truthy(arg(args, 1, "first", Value(false)));
  bool blank = truthy(arg(args, 2, "blank", Value(false)));
  text += "\n";  // as Jinja2: makes splitlines() keep a trailing empty line
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n' || text[i] == '\r') {
      lines.push_back(text.substr(start, i - start));
      if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  if (start < text.size()) lines.push_back(text.substr(start));
  std::string out;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" + indentation : "") + lines[i];
  } else {
    out = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) out += "\n" + (lines[i].empty() ? "" : indentation + lines[i]);
  }
  return first ? indentation + out : out;
}

std::string jinja_title(const std::string& text) {
  // Jinja2: words are separated by runs of whitespace, '-', '(', '{', '[', '<'; each word is capitalized.
  std::string out;
  bool word_start = true;
  for (char32_t c : utf8_decode(text)) {
    bool separator = is_python_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    utf8_append(out, separator ? c : word_start ? to_upper(c) : to_lower(c));
    word_start = separator;
  }
  return out;
}

double python_round(double value, int64_t precision) {
  if (precision == 0) return std::nearbyint(value);
  std::string text = fmt::format("{:.{}f}", value, std::clamp<int64_t>(precision, 0, 300));
  return std::strtod(text.c_str(), nullptr);
}

std::string html_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

Value min_max(const Value& sequence, const Args& args, bool want_max, const RenderLimits& limits) {
  List items = iterate(sequence, limits);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  bool case_sensitive = truthy(arg(args, 0, "case_sensitive", Value(false)));
  Value attribute = arg(args, 1, "attribute", Value());
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    int c = compare_values(sort_key(items[i], attribute, case_sensitive, limits),
                           sort_key(items[best], attribute, case_sensitive, limits));
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

// Filters of strings (and of any value printed as one); nullopt: not one of them.
std::optional<Value> text_filter(std::string_view name, const Value& value, const Args& args,
                                 const RenderLimits& limits) {
  if (name == "tojson") {
    JsonDumpOptions options;
    options.ensure_ascii = truthy(arg(args, 0, "ensure_ascii", Value(false)));
    Value indent = arg(args, 1, "indent", Value(None{}));
    // Python: a negative indent inserts newlines only, as 0 does.
    if (indent.is_number()) options.indent = static_cast<int>(std::clamp<int64_t>(indent.as_int(), 0, INT32_MAX));
    options.max_bytes = limits.max_output_bytes;
    Value separators = arg(args, 2, "separators", Value(None{}));
    if (separators.is_list() && separators.as_list().size() == 2) {
      options.item_separator = python_str(separators.as_list()[0]);
      options.key_separator = python_str(separators.as_list()[1]);
    }
    options.sort_keys = truthy(arg(args, 3, "sort_keys", Value(false)));
    return Value(python_json_dumps(value, options));
  }
  if (name == "safe" || name == "string")
    return value.is_string() ? value : Value(python_str(value, limits.max_output_bytes));
  if (name == "escape" || name == "e" || name == "forceescape") return Value(html_escape(python_str(value)));
  if (name == "trim") return Value(python_strip(python_str(value), arg(args, 0, "chars", Value(None{})), true, true));
  if (name == "upper") return Value(python_upper(python_str(value)));
  if (name == "lower") return Value(python_lower(python_str(value)));
  if (name == "title") return Value(jinja_title(python_str(value)));
  if (name == "capitalize") {
    std::u32string text = utf8_decode(python_lower(python_str(value)));
    if (!text.empty()) text[0] = to_upper(text[0]);
    return Value(utf8_encode(text));
  }
  if (name == "replace") {
    std::string text = python_str(value);
    std::string old_text = python_str(arg(args, 0, "old", Value("")));
    std::string new_text = python_str(arg(args, 1, "new", Value("")));
    Value count_value = arg(args, 2, "count", Value(None{}));
    int64_t count = count_value.is_number() ? count_value.as_int() : -1;
    std::string out;
    if (old_text.empty()) {
      // Python inserts the replacement between every character.
      std::u32string chars = utf8_decode(text);
      size_t insertions = count < 0 ? chars.size() + 1 : std::min<size_t>(chars.size() + 1, count);
      charge(add_bytes(text.size(), multiply_bytes(insertions, new_text.size())), limits, "replace");
      for (size_t i = 0; i <= chars.size(); ++i) {
        if (count < 0 || static_cast<int64_t>(i) < count) out += new_text;
        if (i < chars.size()) utf8_append(out, chars[i]);
      }
      return Value(std::move(out));
    }
    size_t start = 0;
    for (int64_t done = 0; count < 0 || done < count; ++done) {
      size_t found = text.find(old_text, start);
      if (found == std::string::npos) break;
      charge(add_bytes(out.size(), add_bytes(found - start, new_text.size())), limits, "replace");
      out.append(text, start, found - start);
      out += new_text;
      start = found + old_text.size();
    }
    out.append(text, start, std::string::npos);
    return Value(std::move(out));
  }
  if (name == "indent") {
    if (!value.is_string())
      throw ValueError("unsupported operand type(s) for +=: '" + type_name(value) + "' and 'str'");
    return Value(do_indent(value.as_string(), args, limits));
  }
  if (name == "center") {
    std::string text = python_str(value);
    int64_t width = int_arg(args, 0, "width", 80);
    int64_t length = static_cast<int64_t>(utf8_length(text));
    if (width <= length) return Value(text);
    charge(add_bytes(text.size(), static_cast<size_t>(width - length)), limits, "center");
    int64_t left = (width - length) / 2 + ((width - length) % 2 & width % 2);
    return Value(std::string(left, ' ') + text + std::string(width - length - left, ' '));
  }
  if (name == "wordcount") {
    std::string text = python_str(value);
    int64_t words = 0;
    bool in_word = false;
    for (char c : text) {
      bool word = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || static_cast<unsigned char>(c) >= 0x80;
      if (word && !in_word) ++words;
      in_word = word;
    }
    return Value(words);
  }
  if (name == "format") {
    return Value(python_percent_format(python_str(value), Value::tuple(args.positional), limits));
  }
  if (name == "pprint") return Value(python_repr(value));

  return std::nullopt;
}

// Filters that make or take numbers; nullopt: not one of them.
std::optional<Value> number_filter(std::string_view name, const Value& value, const Args& args) {
  if ((name == "int" || name == "float") && value.is_undefined()) throw_undefined(value);  // int(Undefined) fails
  if (name == "int") {
    int64_t fallback = int_arg(args, 0, "default", 0);
    if (value.is_float()) {
      double f = value.as_float();
      if (std::isnan(f)) return Value(fallback);
      if (!(f > -9.2e18 && f < 9.2e18))
        throw ValueError("int(" + python_float_repr(f) + ") does not fit in a signed 64-bit integer");
      return Value(static_cast<int64_t>(f));
    }
    if (value.is_number()) return Value(value.as_int());
    if (value.is_string()) {
      std::string text = python_strip(value.as_string(), Value(None{}), true, true);
      char* end = nullptr;
      long long parsed = std::strtoll(text.c_str(), &end, static_cast<int>(int_arg(args, 1, "base", 10)));
      if (!text.empty() && end == text.c_str() + text.size()) return Value(static_cast<int64_t>(parsed));
      double f = std::strtod(text.c_str(), &end);
      if (!text.empty() && end == text.c_str() + text.size() && std::isfinite(f) && f > -9.2e18 && f < 9.2e18)
        return Value(static_cast<int64_t>(f));
    }
    return Value(fallback);
  }
  if (name == "float") {
    Value fallback = arg(args, 0, "default", Value(0.0));
    if (value.is_number()) return Value(value.as_float());
    if (value.is_string()) {
      std::string text = python_strip(value.as_string(), Value(None{}), true, true);
      char* end = nullptr;
      double f = std::strtod(text.c_str(), &end);
      if (!text.empty() && end == text.c_str() + text.size()) return Value(f);
    }
    return fallback;
  }
  if (name == "abs") {
    if (value.is_float()) return Value(std::fabs(value.as_float()));
    if (value.is_number()) {
      if (value.as_int() == INT64_MIN)
        throw ValueError("integer overflow: abs(" + std::to_string(INT64_MIN) +
                         ") does not fit in a signed 64-bit integer");
      return Value(std::abs(value.as_int()));
    }
    throw ValueError("bad operand type for abs(): '" + type_name(value) + "'");
  }
  if (name == "round") {
    if (!value.is_number()) throw ValueError("type " + type_name(value) + " doesn't define __round__ method");
    int64_t precision = int_arg(args, 0, "precision", 0);
    std::string method = python_str(arg(args, 1, "method", Value("common")));
    double scale = std::pow(10.0, static_cast<double>(precision));
    if (method == "ceil") return Value(std::ceil(value.as_float() * scale) / scale);
    if (method == "floor") return Value(std::floor(value.as_float() * scale) / scale);
    if (!value.is_float()) return Value(value.as_int());  // Python: round(3, 0) is the int 3
    return Value(python_round(value.as_float(), precision));
  }
  return std::nullopt;
}

// Filters of sequences and mappings; nullopt: not one of them.
std::optional<Value> sequence_filter(std::string_view name, const Value& value, const Args& args,
                                     const RenderLimits& limits) {
  if (name == "length" || name == "count") {
    if (value.is_undefined()) return Value(0);
    if (value.is_string()) return Value(static_cast<int64_t>(utf8_length(value.as_string())));
    if (value.is_list()) return Value(static_cast<int64_t>(value.as_list().size()));
    if (value.is_dict() && !value.as_dict().is_namespace) return Value(static_cast<int64_t>(value.as_dict().size()));
    throw ValueError("object of type '" + type_name(value) + "' has no len()");
  }
  if (name == "default" || name == "d") {
    bool boolean = truthy(arg(args, 1, "boolean", Value(false)));
    bool use_default = value.is_undefined() || (boolean && !truthy(value));
    return use_default ? arg(args, 0, "default_value", Value("")) : value;
  }
  if (name == "join") {
    std::string separator = python_str(arg(args, 0, "d", Value("")));
    Value attribute = arg(args, 1, "attribute", Value(None{}));
    std::string out;
    bool first = true;
    for (const Value& item : iterate(value, limits)) {
      std::string part =
          python_str(attribute.is_none() ? item : lookup_attribute(item, attribute, limits), limits.max_output_bytes);
      charge(add_bytes(out.size(), add_bytes(first ? 0 : separator.size(), part.size())), limits, "join");
      if (!first) out += separator;
      first = false;
      out += part;
    }
    return Value(std::move(out));
  }
  if (name == "first" || name == "last") {
    List items = iterate(value, limits);
    if (items.empty()) return Value::undefined(std::string("No ") + std::string(name) + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value(iterate(value, limits));
  if (name == "map") {
    List out;
    if (!truthy(value)) return Value(std::move(out));  // Jinja2 maps only a truthy value
    Value attribute = arg(args, Args::kKeywordOnly, "attribute", Value());
    size_t bytes = 0;  // each mapped item may be as large as the limit: the list is charged as it grows
    for (const Value& item : iterate(value, limits)) {
      if (!attribute.is_undefined()) {
        Value mapped = lookup_attribute(item, attribute, limits);
        if (mapped.is_undefined() && args.has(Args::kKeywordOnly, "default"))
          mapped = args.get(Args::kKeywordOnly, "default");
        out.push_back(mapped);
      } else {
        if (args.positional.empty()) throw ValueError("map needs a filter name or attribute=");
        Args rest;
        rest.positional.assign(args.positional.begin() + 1, args.positional.end());
        rest.keyword = args.keyword;
        out.push_back(call_filter(python_str(args.positional[0]), item, rest, limits));
      }
      bytes = add_bytes(bytes, value_bytes(out.back(), limits.max_output_bytes));
      charge(bytes, limits, "map");
    }
    return Value(std::move(out));
  }
  if (name == "select") return select(value, args, true, false, limits);
  if (name == "reject") return select(value, args, false, false, limits);
  if (name == "selectattr") return select(value, args, true, true, limits);
  if (name == "rejectattr") return select(value, args, false, true, limits);
  if (name == "sum") {
    Value attribute = arg(args, 0, "attribute", Value());
    Value total = arg(args, 1, "start", Value(0));
    for (const Value& item : iterate(value, limits)) {
      total = binary_operation("+", total, attribute.is_undefined() ? item : lookup_attribute(item, attribute, limits),
                               limits);
    }
    return total;
  }
  if (name == "attr") return get_attribute(value, python_str(arg(args, 0, "name", Value(""))), limits);

  return std::nullopt;
}

// Filters that order, pick or pair up the items of a sequence or mapping; nullopt: not one of them.
std::optional<Value> ordering_filter(std::string_view name, const Value& value, const Args& args,
                                     const RenderLimits& limits) {
  if (name == "items") {
    if (value.is_undefined()) return Value(List{});
    if (!value.is_dict()) throw ValueError("items filter needs a mapping, got " + type_name(value));
    List items;
    for (const auto& [key, item] : value.as_dict().entries()) items.push_back(Value::tuple({Value(key), item}));
    return Value(std::move(items));
  }
  if (name == "dictsort") {
    if (!value.is_dict()) throw ValueError("dictsort needs a mapping, got " + type_name(value));
    bool case_sensitive = truthy(arg(args, 0, "case_sensitive", Value(false)));
    std::string by = python_str(arg(args, 1, "by", Value("key")));
    bool reverse = truthy(arg(args, 2, "reverse", Value(false)));
    List items;
    for (const auto& [key, item] : value.as_dict().entries()) items.push_back(Value::tuple({Value(key), item}));
    size_t index = by == "value" ? 1 : 0;
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      int c = compare_values(sort_key(a.as_list()[index], Value(), case_sensitive, limits),
                             sort_key(b.as_list()[index], Value(), case_sensitive, limits));
      return reverse ? c > 0 : c < 0;
    });
    return Value(std::move(items));
  }
  if (name == "sort") {
    bool reverse = truthy(arg(args, 0, "reverse", Value(false)));
    bool case_sensitive = truthy(arg(args, 1, "case_sensitive", Value(false)));
    Value attribute = arg(args, 2, "attribute", Value());
    List items = iterate(value, limits);
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      int c = compare_values(sort_key(a, attribute, case_sensitive, limits),
                             sort_key(b, attribute, case_sensitive, limits));
      return reverse ? c > 0 : c < 0;
    });
    return Value(std::move(items));
  }
  if (name == "unique") {
    bool case_sensitive = truthy(arg(args, 0, "case_sensitive", Value(false)));
    Value attribute = arg(args, 1, "attribute", Value());
    List out, seen;
    for (const Value& item : iterate(value, limits)) {
      Value key = sort_key(item, attribute, case_sensitive, limits);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return values_equal(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value(std::move(out));
  }
  if (name == "reverse") {
    if (value.is_string()) {
      std::u32string chars = utf8_decode(value.as_string());
      std::reverse(chars.begin(), chars.end());
      return Value(utf8_encode(chars));
    }
    List items = iterate(value, limits);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "min") return min_max(value, args, false, limits);
  if (name == "max") return min_max(value, args, true, limits);
  return std::nullopt;
}

}  // namespace

Value call_filter(std::string_view name, const Value& value, const Args& args, const RenderLimits& limits) {
  if (std::optional<Value> v = text_filter(name, value, args, limits)) return *std::move(v);
  if (std::optional<Value> v = number_filter(name, value, args)) return *std::move(v);
  if (std::optional<Value> v = sequence_filter(name, value, args, limits)) return *std::move(v);
  if (std::optional<Value> v = ordering_filter(name, value, args, limits)) return *std::move(v);
  throw ValueError("no filter named '" + std::string(name) + "'");
}

}  // namespace tessera::tokenizer::jinja
