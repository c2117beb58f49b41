// Methods of Python's str, dict and list that chat templates call. Mutating methods (append, pop,
// update) are absent on purpose: transformers renders in an ImmutableSandboxedEnvironment, where they fail.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>

#include "tokenizer/jinja/budget.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/format.h"
#include "tokenizer/jinja/operators.h"
#include "tokenizer/jinja/utf8.h"

namespace tessera::tokenizer::jinja {
namespace {

const std::string& string_arg(const Value& value, const char* method) {
  if (!value.is_string()) {
    throw ValueError(std::string(method) + "() argument must be str, not " + type_name(value));
  }
  return value.as_string();
}

// The list a split builds, charged part by part: a Value each, plus the text.
class SplitParts {
 public:
  explicit SplitParts(const RenderLimits& limits) : limits_(limits) {}
  void push_back(std::string part) {
    used_ = add_bytes(used_, add_bytes(sizeof(Value), part.size()));
    charge(used_, limits_, "split()");
    parts_.push_back(std::move(part));
  }
  std::vector<std::string> take() { return std::move(parts_); }

 private:
  const RenderLimits& limits_;
  size_t used_ = 0;
  std::vector<std::string> parts_;
};

std::vector<std::string> python_split(const std::string& text, const Value& separator, int64_t max_split,
                                      bool from_right, const RenderLimits& limits) {
  SplitParts parts(limits);
  if (separator.is_undefined() || separator.is_none()) {
    // Runs of whitespace separate; leading and trailing whitespace is ignored.
    std::u32string s = utf8_decode(text);
    std::vector<std::u32string> words;
    if (!from_right) {
      size_t i = 0;
      while (i < s.size()) {
        while (i < s.size() && is_python_space(s[i])) ++i;
        if (i == s.size()) break;
        if (max_split >= 0 && static_cast<int64_t>(words.size()) == max_split) {
          size_t end = s.size();
          while (end > i && is_python_space(s[end - 1])) --end;
          words.push_back(s.substr(i, end - i));
          break;
        }
        size_t j = i;
        while (j < s.size() && !is_python_space(s[j])) ++j;
        words.push_back(s.substr(i, j - i));
        i = j;
      }
    } else {
      int64_t i = static_cast<int64_t>(s.size());
      while (i > 0) {
        while (i > 0 && is_python_space(s[i - 1])) --i;
        if (i == 0) break;
        if (max_split >= 0 && static_cast<int64_t>(words.size()) == max_split) {
          size_t begin = 0;
          while (begin < static_cast<size_t>(i) && is_python_space(s[begin])) ++begin;
          words.push_back(s.substr(begin, i - begin));
          break;
        }
        int64_t j = i;
        while (j > 0 && !is_python_space(s[j - 1])) --j;
        words.push_back(s.substr(j, i - j));
        i = j;
      }
      std::reverse(words.begin(), words.end());
    }
    for (auto& w : words) parts.push_back(utf8_encode(w));
    return parts.take();
  }
  const std::string& sep = string_arg(separator, "split");
  if (sep.empty()) throw ValueError("empty separator");
  int64_t split_count = 0;
  if (!from_right) {
    size_t start = 0;
    while (true) {
      size_t found = text.find(sep, start);
      if (found == std::string::npos || (max_split >= 0 && split_count == max_split)) {
        parts.push_back(text.substr(start));
        return parts.take();
      }
      ++split_count;
      parts.push_back(text.substr(start, found - start));
      start = found + sep.size();
    }
  }
  size_t end = text.size();
  while (true) {
    size_t found = end >= sep.size() ? text.rfind(sep, end - sep.size()) : std::string::npos;
    if (found == std::string::npos || (max_split >= 0 && split_count == max_split)) {
      parts.push_back(text.substr(0, end));
      break;
    }
    ++split_count;
    parts.push_back(text.substr(found + sep.size(), end - found - sep.size()));
    end = found;
  }
  std::vector<std::string> out = parts.take();
  std::reverse(out.begin(), out.end());
  return out;
}

Value to_list(const std::vector<std::string>& parts) {
  List list;
  for (const auto& p : parts) list.emplace_back(p);
  return Value(std::move(list));
}

bool affix_matches(const std::string& text, const Value& affix, bool prefix, const char* method) {
  auto one = [&](const Value& candidate) {
    const std::string& a = string_arg(candidate, method);
    if (a.size() > text.size()) return false;
    return prefix ? text.compare(0, a.size(), a) == 0 : text.compare(text.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_list()) {
    return std::any_of(affix.as_list().begin(), affix.as_list().end(), one);
  }
  return one(affix);
}

std::string python_title(const std::string& text) {
  std::string out;
  bool previous_cased = false;
  for (char32_t c : utf8_decode(text)) {
    bool letter = is_letter(c);
    utf8_append(out, letter ? (previous_cased ? to_lower(c) : to_upper(c)) : c);
    previous_cased = letter;
  }
  return out;
}

// str.format with "{}", "{0}" and "{name}" fields (no format specs beyond what str() prints).
std::string python_format(const std::string& format, const Args& args, const RenderLimits& limits) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    char c = format[i];
    if (c == '{' && i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      ++i;
    } else if (c == '}' && i + 1 < format.size() && format[i + 1] == '}') {
      out.push_back('}');
      ++i;
    } else if (c == '{') {
      size_t close = format.find('}', i);
      if (close == std::string::npos) throw ValueError("Single '{' encountered in format string");
      std::string field = format.substr(i + 1, close - i - 1);
      field = field.substr(0, field.find(':'));
      Value value;
      if (field.empty()) {
        value = args.get(auto_index++, Args::kPositionalOnly);
      } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
        value = args.get(std::stoul(field), Args::kPositionalOnly);
      } else {
        value = args.get(Args::kKeywordOnly, field);
      }
      if (value.is_undefined()) throw ValueError("format field '" + field + "' has no argument");
      std::string text = python_str(value, limits.max_output_bytes);
      charge(add_bytes(out.size(), text.size()), limits, "str.format()");
      out += text;
      i = close;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

Value method(std::string name, std::function<Value(Args&)> call) {
  return make_function(std::move(name), std::move(call));
}

std::optional<Value> string_method(const std::string& text, const std::string& name, const RenderLimits& limits) {
  if (name == "startswith" || name == "endswith") {
    bool prefix = name == "startswith";
    return method(name, [text, prefix, name](Args& a) {
      return Value(affix_matches(text, a.get(0, Args::kPositionalOnly), prefix, name.c_str()));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool left = name != "rstrip", right = name != "lstrip";
    return method(name,
                  [text, left, right](Args& a) { return Value(python_strip(text, a.get(0, "chars"), left, right)); });
  }
  if (name == "split" || name == "rsplit") {
    bool from_right = name == "rsplit";
    return method(name, [text, from_right, limits](Args& a) {
      Value max_split = a.get(1, "maxsplit");
      return to_list(
          python_split(text, a.get(0, "sep"), max_split.is_number() ? max_split.as_int() : -1, from_right, limits));
    });
  }
  if (name == "splitlines") {
    return method(name, [text, limits](Args&) {
      std::vector<std::string> lines = python_split(text, Value("\n"), -1, false, limits);
      if (!lines.empty() && lines.back().empty()) lines.pop_back();
      for (auto& line : lines) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
      }
      return to_list(lines);
    });
  }
  if (name == "replace") {
    return method(name, [text, limits](Args& a) {
      Value count = a.get(2, "count");
      return call_filter("replace", Value(text),
                         Args{{a.get(0, "old"), a.get(1, "new"), count.is_undefined() ? Value(-1) : count}, {}},
                         limits);
    });
  }
  if (name == "upper") return method(name, [text](Args&) { return Value(python_upper(text)); });
  if (name == "lower") return method(name, [text](Args&) { return Value(python_lower(text)); });
  if (name == "title") return method(name, [text](Args&) { return Value(python_title(text)); });
  if (name == "capitalize")
    return method(name, [text, limits](Args& a) { return call_filter("capitalize", Value(text), a, limits); });
  if (name == "format") return method(name, [text, limits](Args& a) { return Value(python_format(text, a, limits)); });
  if (name == "join") {
    return method(name, [text, limits](Args& a) {
      std::string out;
      bool first = true;
      for (const Value& item : iterate(a.get(0, "iterable"), limits)) {
        const std::string& part = string_arg(item, "join");
        charge(add_bytes(out.size(), add_bytes(first ? 0 : text.size(), part.size())), limits, "str.join()");
        if (!first) out += text;
        first = false;
        out += part;
      }
      return Value(std::move(out));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    return method(name, [text, name](Args& a) {
      const std::string sub = string_arg(a.get(0, "sub"), name.c_str());  // a copy: get() returns a temporary
      size_t found = name[0] == 'r' ? text.rfind(sub) : text.find(sub);
      if (found == std::string::npos) {
        if (name.find("index") != std::string::npos) throw ValueError("substring not found");
        return Value(-1);
      }
      return Value(static_cast<int64_t>(utf8_length(std::string_view(text).substr(0, found))));
    });
  }
  if (name == "count") {
    return method(name, [text](Args& a) {
      const std::string sub = string_arg(a.get(0, "sub"), "count");
      int64_t n = 0;
      if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(text) + 1));
      for (size_t p = text.find(sub); p != std::string::npos; p = text.find(sub, p + sub.size())) ++n;
      return Value(n);
    });
  }
  auto predicate = [&](auto test) {
    return method(name, [text, test](Args&) {
      std::u32string s = utf8_decode(text);
      return Value(!s.empty() && std::all_of(s.begin(), s.end(), test));
    });
  };
  if (name == "isdigit") return predicate([](char32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha") return predicate([](char32_t c) { return c > 127 || std::isalpha(static_cast<int>(c)); });
  if (name == "isalnum") return predicate([](char32_t c) { return c > 127 || std::isalnum(static_cast<int>(c)); });
  if (name == "isspace") return predicate([](char32_t c) { return is_python_space(c); });
  if (name == "isupper")
    return method(name, [text](Args&) { return Value(python_upper(text) == text && python_lower(text) != text); });
  if (name == "islower")
    return method(name, [text](Args&) { return Value(python_lower(text) == text && python_upper(text) != text); });
  return std::nullopt;
}

std::optional<Value> dict_method(const Value& object, const std::string& name) {
  DictPtr dict = object.dict_ptr();
  if (dict->is_namespace) return std::nullopt;
  if (name == "items") {
    return method(name, [dict](Args&) {
      List items;
      for (const auto& [key, value] : dict->entries()) items.push_back(Value::tuple({Value(key), value}));
      return Value(std::move(items));
    });
  }
  if (name == "keys") {
    return method(name, [dict](Args&) {
      List keys;
      for (const auto& entry : dict->entries()) keys.emplace_back(entry.first);
      return Value(std::move(keys));
    });
  }
  if (name == "values") {
    return method(name, [dict](Args&) {
      List values;
      for (const auto& entry : dict->entries()) values.push_back(entry.second);
      return Value(std::move(values));
    });
  }
  if (name == "get") {
    // Python's dict.get: the default is None, not Undefined.
    return method(name, [dict](Args& a) {
      Value key = a.get(0, "key");
      if (key.is_string()) {
        if (const Value* found = dict->find(key.as_string())) return *found;
      }
      return a.has(1, "default") ? a.get(1, "default") : Value(None{});
    });
  }
  if (name == "copy") return method(name, [dict](Args&) { return Value(std::make_shared<Dict>(*dict)); });
  return std::nullopt;
}

std::optional<Value> list_method(const Value& object, const std::string& name) {
  ListPtr list = object.list_ptr();
  if (name == "index") {
    return method(name, [list](Args& a) {
      Value item = a.get(0, "value");
      for (size_t i = 0; i < list->size(); ++i) {
        if (values_equal((*list)[i], item)) return Value(static_cast<int64_t>(i));
      }
      throw ValueError(python_repr(item) + " is not in list");
    });
  }
  if (name == "count") {
    return method(name, [list](Args& a) {
      Value item = a.get(0, "value");
      return Value(static_cast<int64_t>(
          std::count_if(list->begin(), list->end(), [&](const Value& v) { return values_equal(v, item); })));
    });
  }
  if (name == "append" || name == "pop" || name == "extend" || name == "insert" || name == "remove") {
    return method(name, [name](Args&) -> Value {
      throw ValueError("access to attribute '" + name + "' of 'list' object is unsafe (templates are immutable)");
    });
  }
  return std::nullopt;
}

}  // namespace

std::optional<Value> bound_method(const Value& object, const std::string& name, const RenderLimits& limits) {
  if (object.is_string()) return string_method(object.as_string(), name, limits);
  if (object.is_dict()) return dict_method(object, name);
  if (object.is_list()) return list_method(object, name);
  return std::nullopt;
}

std::string python_strip(const std::string& text, const Value& chars, bool left, bool right) {
  std::u32string s = utf8_decode(text);
  std::u32string set;
  bool whitespace = chars.is_undefined() || chars.is_none();
  if (!whitespace) set = utf8_decode(string_arg(chars, "strip"));
  auto strippable = [&](char32_t c) { return whitespace ? is_python_space(c) : set.find(c) != std::u32string::npos; };
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end && strippable(s[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strippable(s[end - 1])) --end;
  }
  if (begin == 0 && end == s.size()) return text;
  return utf8_encode(std::u32string_view(s).substr(begin, end - begin));
}

std::string python_upper(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : utf8_decode(text)) {
    if (c == 0xDF) {
      out += "SS";  // Python: 'ß'.upper() == 'SS'
    } else {
      utf8_append(out, to_upper(c));
    }
  }
  return out;
}

std::string python_lower(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t c : utf8_decode(text)) utf8_append(out, to_lower(c));
  return out;
}

namespace {

// One conversion of printf-style formatting: "%-08.3f" is flags "-0", width 8, precision 3, type 'f'.
struct PercentSpec {
  std::string flags;
  size_t width = 0;
  std::optional<size_t> precision;
  char type = 0;
};

// Decimal digits from `p` on, saturating at SIZE_MAX; moves p past them.
size_t read_count(const std::string& format, size_t* p) {
  size_t n = 0;
  while (*p < format.size() && std::isdigit(static_cast<unsigned char>(format[*p]))) {
    n = add_bytes(multiply_bytes(n, 10), static_cast<size_t>(format[*p] - '0'));
    ++*p;
  }
  return n;
}

// Parses the spec after the '%' at `percent`; returns the index of its type character.
size_t parse_percent_spec(const std::string& format, size_t percent, PercentSpec* spec) {
  size_t p = percent + 1;
  while (p < format.size() && std::strchr("-+ 0#", format[p])) spec->flags.push_back(format[p++]);
  spec->width = read_count(format, &p);
  if (p < format.size() && format[p] == '.') {
    ++p;
    spec->precision = read_count(format, &p);
  }
  if (p >= format.size()) throw ValueError("incomplete format");
  spec->type = format[p];
  return p;
}

// %s and %r: width and precision count characters, so non-ASCII text lines up as in Python.
std::string format_text(const PercentSpec& spec, const Value& v, const RenderLimits& limits) {
  std::string text =
      spec.type == 's' ? python_str(v, limits.max_output_bytes) : python_repr(v, limits.max_output_bytes);
  std::u32string chars = utf8_decode(text);
  if (spec.precision && *spec.precision < chars.size()) chars.resize(*spec.precision);
  std::string body = utf8_encode(chars);
  size_t padding = spec.width > chars.size() ? spec.width - chars.size() : 0;
  charge(add_bytes(body.size(), padding), limits, "'%' formatting (its width)");
  bool left = spec.flags.find('-') != std::string::npos;
  return left ? body + std::string(padding, ' ') : std::string(padding, ' ') + body;
}

// Numbers through snprintf, sized for the whole result: a width or precision is charged first and
// never cut at a fixed buffer's end.
std::string format_number(const PercentSpec& spec, const Value& v, const RenderLimits& limits) {
  bool integer = std::strchr("dioxX", spec.type) != nullptr;
  if (!v.is_number()) {
    throw ValueError(std::string("%") + spec.type + (integer ? " format: a number" : " format: a real number") +
                     " is required, not " + type_name(v));
  }
  // Besides width and precision, a double prints at most 309 integer digits and a sign.
  size_t bytes = add_bytes(add_bytes(spec.width, spec.precision.value_or(0)), 400);
  if (bytes > INT32_MAX) bytes = SIZE_MAX;  // snprintf's widths are ints
  charge(bytes, limits, "'%' formatting (its width and precision)");
  std::string c_format = "%" + spec.flags + (spec.width ? std::to_string(spec.width) : "") +
                         (spec.precision ? "." + std::to_string(*spec.precision) : "");
  std::string out;
  auto print = [&](const auto& number) {
    int n = std::snprintf(nullptr, 0, c_format.c_str(), number);
    if (n < 0) throw ValueError(std::string("cannot format this number with %") + spec.type);
    out.resize(static_cast<size_t>(n) + 1);
    std::snprintf(out.data(), out.size(), c_format.c_str(), number);
    out.resize(static_cast<size_t>(n));
  };
  if (integer) {
    double f = v.as_float();
    if (v.is_float() && !(f > -9.2e18 && f < 9.2e18)) throw ValueError("%d format: the number does not fit in 64 bits");
    long long n = v.is_float() ? static_cast<long long>(f) : v.as_int();
    c_format += std::string("ll") + (spec.type == 'i' ? 'd' : spec.type);
    print(n);
  } else {
    c_format.push_back(spec.type);
    print(v.as_float());
  }
  return out;
}

}  // namespace

// printf-style formatting as Python's str % args: flags "-+ 0#", width, precision; types s r d i f F e E g G x X o c.
std::string python_percent_format(const std::string& format, const Value& arguments, const RenderLimits& limits) {
  List values = arguments.is_tuple() ? arguments.as_list() : List{arguments};
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    PercentSpec spec;
    i = parse_percent_spec(format, i, &spec);
    if (spec.type == '%') {
      out.push_back('%');
      continue;
    }
    if (next >= values.size()) throw ValueError("not enough arguments for format string");
    const Value& v = values[next++];
    std::string piece;
    if (spec.type == 's' || spec.type == 'r') {
      piece = format_text(spec, v, limits);
    } else if (spec.type == 'c') {
      if (!v.is_number() || v.is_float()) throw ValueError("%c requires an int, not " + type_name(v));
      int64_t code_point = v.as_int();
      if (code_point < 0 || code_point > 0x10FFFF) throw ValueError("%c arg not in range(0x110000)");
      utf8_append(piece, static_cast<char32_t>(code_point));
    } else if (std::strchr("dioxXfFeEgG", spec.type)) {
      piece = format_number(spec, v, limits);
    } else {
      throw ValueError(std::string("unsupported format character '") + spec.type + "'");
    }
    charge(add_bytes(out.size(), piece.size()), limits, "'%' formatting");
    out += piece;
  }
  // Python: unused arguments are an error, except a single mapping-like argument (dict or list).
  bool mapping_like = !arguments.is_tuple() && (arguments.is_dict() || arguments.is_list());
  if (next < values.size() && !mapping_like) throw ValueError("not all arguments converted during string formatting");
  return out;
}

}  // namespace tessera::tokenizer::jinja
