#include "tokenizer/jinja/format.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/utf8.h"

namespace tessera::tokenizer::jinja {
namespace {

const std::string kComma = ",";
const std::string kCommaSpace = ", ";

bool is_printable(char32_t c) {
  // Python's str.isprintable(): false for control, format and separator characters other than ' '.
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if ((c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x206F)) return false;
  if (c == 0x1680 || c == 0x3000 || c == 0xFEFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
  return true;
}

std::string repr_string(const std::string& text) {
  bool has_single = text.find('\'') != std::string::npos;
  bool has_double = text.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8_decode(text)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!is_printable(c)) {
      if (c < 0x100) {
        out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
      } else if (c < 0x10000) {
        out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      } else {
        out += fmt::format("\\U{:08x}", static_cast<unsigned>(c));
      }
    } else {
      utf8_append(out, c);
    }
  }
  out.push_back(quote);
  return out;
}

void json_string(std::string& out, const std::string& text, bool ensure_ascii) {
  out.push_back('"');
  for (char32_t c : utf8_decode(text)) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {
            char32_t v = c - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
          }
        } else {
          utf8_append(out, c);
        }
    }
  }
  out.push_back('"');
}

[[noreturn]] void over_limit(const char* what, size_t max_bytes) {
  throw ValueError(std::string(what) + " would build more than the chat template's output limit of " +
                   std::to_string(max_bytes) + " bytes");
}

void json_dump(std::string& out, const Value& value, const JsonDumpOptions& options, int depth) {
  if (out.size() > options.max_bytes) over_limit("tojson", options.max_bytes);
  auto newline = [&](int level) {
    // Charged before appending: indent=10**9 must not allocate gigabytes of spaces.
    size_t spaces = static_cast<size_t>(std::max(0, *options.indent));
    size_t pad = spaces * static_cast<size_t>(level);  // both below 2^31: no overflow
    if (out.size() + 1 + pad > options.max_bytes) over_limit("tojson(indent)", options.max_bytes);
    out.push_back('\n');
    out.append(pad, ' ');
  };
  const std::string& item_separator = options.item_separator ? *options.item_separator
                                      : options.indent       ? kComma
                                                             : kCommaSpace;
  switch (value.type()) {
    case Value::Type::kNone:
      out += "null";
      return;
    case Value::Type::kBool:
      out += value.as_bool() ? "true" : "false";
      return;
    case Value::Type::kInt:
      out += std::to_string(value.as_int());
      return;
    case Value::Type::kFloat: {
      double f = value.as_float();
      out += std::isnan(f) ? "NaN" : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity") : python_float_repr(f);
      return;
    }
    case Value::Type::kString:
      json_string(out, value.as_string(), options.ensure_ascii);
      return;
    case Value::Type::kList: {
      const List& list = value.as_list();
      if (list.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < list.size(); ++i) {
        if (i) out += item_separator;
        if (options.indent) newline(depth + 1);
        json_dump(out, list[i], options, depth + 1);
      }
      if (options.indent) newline(depth);
      out.push_back(']');
      return;
    }
    case Value::Type::kDict: {
      if (value.as_dict().is_namespace) break;
      std::vector<const Dict::Entry*> entries;
      for (const auto& entry : value.as_dict().entries()) entries.push_back(&entry);
      if (options.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      if (entries.empty()) {
        out += "{}";
        return;
      }
      out.push_back('{');
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_separator;
        if (options.indent) newline(depth + 1);
        json_string(out, entries[i]->first, options.ensure_ascii);
        out += options.key_separator;
        json_dump(out, entries[i]->second, options, depth + 1);
      }
      if (options.indent) newline(depth);
      out.push_back('}');
      return;
    }
    default:
      break;
  }
  throw ValueError("Object of type " + type_name(value) + " is not JSON serializable");
}

}  // namespace

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (value == 0) return std::signbit(value) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed notation for 1e-4 <= |x| < 1e16.
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string scientific(buffer, result.ptr);
  size_t e = scientific.find('e');
  std::string mantissa = scientific.substr(0, e);
  int exponent = std::stoi(scientific.substr(e + 1));
  bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = negative ? "-" : "";
  if (exponent >= -5 + 1 && exponent < 16) {
    if (exponent >= 0) {
      if (digits.size() <= static_cast<size_t>(exponent) + 1) {
        out += digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
      }
    } else {
      out += "0." + std::string(-exponent - 1, '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out;
}

std::string python_repr(const Value& value) { return python_repr(value, SIZE_MAX); }

std::string python_str(const Value& value) { return python_str(value, SIZE_MAX); }

std::string python_repr(const Value& value, size_t max_bytes) {
  if (value.is_string()) return repr_string(value.as_string());
  return python_str(value, max_bytes);
}

std::string python_str(const Value& value, size_t max_bytes) {
  auto check = [max_bytes](const std::string& out) {
    if (out.size() > max_bytes) over_limit("printing a list or dict", max_bytes);
  };
  switch (value.type()) {
    case Value::Type::kUndefined:
      return "";
    case Value::Type::kNone:
      return "None";
    case Value::Type::kBool:
      return value.as_bool() ? "True" : "False";
    case Value::Type::kInt:
      return std::to_string(value.as_int());
    case Value::Type::kFloat:
      return python_float_repr(value.as_float());
    case Value::Type::kString:
      return value.as_string();
    case Value::Type::kList: {
      std::string out = value.is_tuple() ? "(" : "[";
      const List& list = value.as_list();
      for (size_t i = 0; i < list.size(); ++i) {
        if (i) out += ", ";
        out += python_repr(list[i], max_bytes);
        check(out);
      }
      if (value.is_tuple() && list.size() == 1) out += ",";
      return out + (value.is_tuple() ? ")" : "]");
    }
    case Value::Type::kDict: {
      if (value.as_dict().is_namespace) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [key, item] : value.as_dict().entries()) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(key) + ": " + python_repr(item, max_bytes);
        check(out);
      }
      return out + "}";
    }
    case Value::Type::kFunction:
      return "<function " + value.as_function().name + ">";
  }
  return "";
}

std::string python_json_dumps(const Value& value, const JsonDumpOptions& options) {
  std::string out;
  json_dump(out, value, options, 0);
  if (out.size() > options.max_bytes) over_limit("tojson", options.max_bytes);
  return out;
}

}  // namespace tessera::tokenizer::jinja
