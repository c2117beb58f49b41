// Methods of Python's str, dict and list that chat templates call. Mutating methods (append, pop,
// update) are absent on purpose: transformers renders in an ImmutableSandboxedEnvironment, where they fail.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

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

std::vector<std::string> python_split(const std::string& text, const Value& separator, int64_t max_split,
                                      bool from_right) {
  std::vector<std::string> parts;
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
    return parts;
  }
  const std::string& sep = string_arg(separator, "split");
  if (sep.empty()) throw ValueError("empty separator");
  if (!from_right) {
    size_t start = 0;
    while (true) {
      size_t found = text.find(sep, start);
      if (found == std::string::npos || (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split)) {
        parts.push_back(text.substr(start));
        return parts;
      }
      parts.push_back(text.substr(start, found - start));
      start = found + sep.size();
    }
  }
  size_t end = text.size();
  while (true) {
    size_t found = end >= sep.size() ? text.rfind(sep, end - sep.size()) : std::string::npos;
    if (found == std::string::npos || (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split)) {
      parts.push_back(text.substr(0, end));
      break;
    }
    parts.push_back(text.substr(found + sep.size(), end - found - sep.size()));
    end = found;
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
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
std::string python_format(const std::string& format, const Args& args) {
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
      out += python_str(value);
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

std::optional<Value> string_method(const std::string& text, const std::string& name) {
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
    return method(name, [text, from_right](Args& a) {
      Value max_split = a.get(1, "maxsplit");
      return to_list(python_split(text, a.get(0, "sep"), max_split.is_number() ? max_split.as_int() : -1, from_right));
    });
  }
  if (name == "splitlines") {
    return method(name, [text](Args&) {
      std::vector<std::string> lines = python_split(text, Value("\n"), -1, false);
      if (!lines.empty() && lines.back().empty()) lines.pop_back();
      for (auto& line : lines) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
      }
      return to_list(lines);
    });
  }
  if (name == "replace") {
    return method(name, [text](Args& a) {
      Value count = a.get(2, "count");
      return call_filter("replace", Value(text),
                         Args{{a.get(0, "old"), a.get(1, "new"), count.is_undefined() ? Value(-1) : count}, {}}, {});
    });
  }
  if (name == "upper") return method(name, [text](Args&) { return Value(python_upper(text)); });
  if (name == "lower") return method(name, [text](Args&) { return Value(python_lower(text)); });
  if (name == "title") return method(name, [text](Args&) { return Value(python_title(text)); });
  if (name == "capitalize")
    return method(name, [text](Args& a) { return call_filter("capitalize", Value(text), a, {}); });
  if (name == "format") return method(name, [text](Args& a) { return Value(python_format(text, a)); });
  if (name == "join") {
    return method(name, [text](Args& a) {
      std::string out;
      bool first = true;
      for (const Value& item : iterate(a.get(0, "iterable"))) {
        if (!first) out += text;
        first = false;
        out += string_arg(item, "join");
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

std::optional<Value> bound_method(const Value& object, const std::string& name) {
  if (object.is_string()) return string_method(object.as_string(), name);
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

// printf-style formatting as Python's str % args: flags "-+ 0#", width, precision; types s r d i f F e E g G x X o c.
std::string python_percent_format(const std::string& format, const Value& arguments) {
  List values = arguments.is_tuple() ? arguments.as_list() : List{arguments};
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    size_t spec_begin = i + 1;
    size_t p = spec_begin;
    while (p < format.size() && std::strchr("-+ 0#", format[p])) ++p;
    while (p < format.size() && std::isdigit(static_cast<unsigned char>(format[p]))) ++p;
    if (p < format.size() && format[p] == '.') {
      ++p;
      while (p < format.size() && std::isdigit(static_cast<unsigned char>(format[p]))) ++p;
    }
    if (p >= format.size()) throw ValueError("incomplete format");
    char type = format[p];
    std::string flags_width_precision = format.substr(spec_begin, p - spec_begin);
    i = p;
    if (type == '%') {
      out.push_back('%');
      continue;
    }
    if (next >= values.size()) throw ValueError("not enough arguments for format string");
    const Value& v = values[next++];
    std::string spec = "%" + flags_width_precision;
    char buffer[512];
    if (type == 's' || type == 'r') {
      std::string text = type == 's' ? python_str(v) : python_repr(v);
      // Width and precision count characters; pad with code points so non-ASCII text lines up as in Python.
      bool left = flags_width_precision.find('-') != std::string::npos;
      size_t dot = flags_width_precision.find('.');
      std::string width_part = flags_width_precision.substr(0, dot);
      width_part.erase(0, width_part.find_first_not_of("-+ 0#"));
      std::u32string chars = utf8_decode(text);
      if (dot != std::string::npos) chars = chars.substr(0, std::stoul("0" + flags_width_precision.substr(dot + 1)));
      size_t width = width_part.empty() ? 0 : std::stoul(width_part);
      std::string body = utf8_encode(chars);
      std::string padding(width > chars.size() ? width - chars.size() : 0, ' ');
      out += left ? body + padding : padding + body;
    } else if (std::strchr("dioxXc", type)) {
      if (!v.is_number())
        throw ValueError(std::string("%") + type + " format: a number is required, not " + type_name(v));
      long long n = v.is_float() ? static_cast<long long>(v.as_float()) : v.as_int();
      if (type == 'c') {
        utf8_append(out, static_cast<char32_t>(n));
        continue;
      }
      std::snprintf(buffer, sizeof(buffer), (spec + "ll" + (type == 'i' ? 'd' : type)).c_str(), n);
      out += buffer;
    } else if (std::strchr("fFeEgG", type)) {
      if (!v.is_number())
        throw ValueError(std::string("%") + type + " format: a real number is required, not " + type_name(v));
      std::snprintf(buffer, sizeof(buffer), (spec + type).c_str(), v.as_float());
      out += buffer;
    } else {
      throw ValueError(std::string("unsupported format character '") + type + "'");
    }
  }
  // Python: unused arguments are an error, except a single mapping-like argument (dict or list).
  bool mapping_like = !arguments.is_tuple() && (arguments.is_dict() || arguments.is_list());
  if (next < values.size() && !mapping_like) throw ValueError("not all arguments converted during string formatting");
  return out;
}

}  // namespace tessera::tokenizer::jinja
