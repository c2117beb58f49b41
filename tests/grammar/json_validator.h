// An independent JSON Schema validator for the tests, over the keywords the grammar library supports:
// written from the JSON Schema text, not from the library, so that a lowering bug shows as a
// disagreement. Property order: required as the library documents (declared properties in schema order,
// then additional ones).
#pragma once
#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

namespace tessera::grammar::testing {

class JsonValidator {
 public:
  using json = nlohmann::ordered_json;
  explicit JsonValidator(const json& root) : root_(root) {}

  // Empty when `value` is valid, else why not.
  std::string validate(const json& value) const { return check(root_, value, "#"); }

  // Parses generated text. Exponents beyond a double's range are valid JSON the parser refuses, so on
  // that error they are shrunk to e0 (bounded numbers never have exponents, so no bound check is lost).
  static json parse(const std::string& text) {
    try {
      return json::parse(text);
    } catch (const nlohmann::json::out_of_range&) {
      return json::parse(std::regex_replace(text, std::regex(R"(([0-9])[eE][+-]?[0-9]+)"), "$1e0"));
    }
  }

 private:
  static size_t codepoints(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }

  static bool full_match(const std::string& pattern, const std::string& s) {
    std::string p = pattern;
    if (!p.empty() && p.front() == '^') p.erase(0, 1);
    if (!p.empty() && p.back() == '$') p.pop_back();
    return std::regex_match(s, std::regex(p, std::regex::ECMAScript));
  }

  static bool format_ok(const std::string& format, const std::string& s) {
    static const std::string date = R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))";
    static const std::string time = R"(([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|[+-]\d\d:\d\d))";
    if (format == "date") return full_match(date, s);
    if (format == "time") return full_match(time, s);
    if (format == "date-time") return full_match(date + "T" + time, s);
    if (format == "email") return full_match(R"([^@\s"]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,})", s);
    if (format == "uuid") return full_match(R"([0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})", s);
    if (format == "uri") return full_match(R"([A-Za-z][A-Za-z0-9+.-]*:\S+)", s);
    return true;
  }

  static std::string type_of(const json& v) {
    if (v.is_null()) return "null";
    if (v.is_boolean()) return "boolean";
    if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
    // An integer too large for 64 bits parses as a double.
    if (v.is_number_float() && std::fabs(v.get<double>()) >= 9.2e18 && std::floor(v.get<double>()) == v.get<double>())
      return "integer";
    if (v.is_number()) return "number";
    if (v.is_string()) return "string";
    if (v.is_array()) return "array";
    return "object";
  }

  static bool type_matches(const std::string& type, const json& v) {
    const std::string actual = type_of(v);
    return type == actual || (type == "number" && actual == "integer");
  }

  std::string check(const json& schema, const json& v, const std::string& at) const {
    if (schema.is_boolean()) return schema.get<bool>() ? "" : at + ": false schema";
    if (schema.contains("$ref")) {
      const std::string ref = schema["$ref"].get<std::string>();
      return check(root_.at(json::json_pointer(ref.substr(1))), v, at);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!schema.contains(key)) continue;
      bool any = false;
      for (const auto& branch : schema[key]) any |= check(branch, v, at).empty();
      if (!any) return at + ": no " + key + " branch matches";
    }
    if (schema.contains("allOf")) {
      for (const auto& part : schema["allOf"]) {
        if (auto e = check(part, v, at); !e.empty()) return e;
      }
    }
    if (schema.contains("const") && schema["const"] != v) return at + ": not the const";
    if (schema.contains("enum")) {
      bool found = false;
      for (const auto& e : schema["enum"]) found |= e == v;
      if (!found) return at + ": not in enum";
    }
    if (schema.contains("type")) {
      bool ok = schema.value("nullable", false) && v.is_null();
      if (schema["type"].is_string())
        ok |= type_matches(schema["type"].get<std::string>(), v);
      else
        for (const auto& t : schema["type"]) ok |= type_matches(t.get<std::string>(), v);
      if (!ok) return at + ": wrong type " + type_of(v);
    }
    if (v.is_string()) return check_string(schema, v.get<std::string>(), at);
    if (v.is_number()) return check_number(schema, v, at);
    if (v.is_array()) return check_array(schema, v, at);
    if (v.is_object()) return check_object(schema, v, at);
    return "";
  }

  std::string check_string(const json& schema, const std::string& s, const std::string& at) const {
    if (schema.contains("minLength") && codepoints(s) < schema["minLength"].get<size_t>()) return at + ": too short";
    if (schema.contains("maxLength") && codepoints(s) > schema["maxLength"].get<size_t>()) return at + ": too long";
    if (schema.contains("pattern") && !full_match(schema["pattern"].get<std::string>(), s)) return at + ": pattern";
    if (schema.contains("format") && !format_ok(schema["format"].get<std::string>(), s)) return at + ": format";
    return "";
  }

  std::string check_number(const json& schema, const json& v, const std::string& at) const {
    const double x = v.get<double>();
    const bool draft4_min = schema.contains("exclusiveMinimum") && schema["exclusiveMinimum"].is_boolean();
    const bool draft4_max = schema.contains("exclusiveMaximum") && schema["exclusiveMaximum"].is_boolean();
    if (schema.contains("minimum")) {
      const double m = schema["minimum"].get<double>();
      if (x < m || (draft4_min && schema["exclusiveMinimum"].get<bool>() && x == m)) return at + ": below minimum";
    }
    if (schema.contains("maximum")) {
      const double m = schema["maximum"].get<double>();
      if (x > m || (draft4_max && schema["exclusiveMaximum"].get<bool>() && x == m)) return at + ": above maximum";
    }
    if (!draft4_min && schema.contains("exclusiveMinimum") && x <= schema["exclusiveMinimum"].get<double>())
      return at + ": not above exclusiveMinimum";
    if (!draft4_max && schema.contains("exclusiveMaximum") && x >= schema["exclusiveMaximum"].get<double>())
      return at + ": not below exclusiveMaximum";
    return "";
  }

  std::string check_array(const json& schema, const json& v, const std::string& at) const {
    if (schema.contains("minItems") && v.size() < schema["minItems"].get<size_t>()) return at + ": too few items";
    if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<size_t>()) return at + ": too many items";
    const json* prefix = schema.contains("prefixItems")                           ? &schema["prefixItems"]
                         : schema.contains("items") && schema["items"].is_array() ? &schema["items"]
                                                                                  : nullptr;
    const json* rest = schema.contains("prefixItems") ? (schema.contains("items") ? &schema["items"] : nullptr)
                       : prefix ? (schema.contains("additionalItems") ? &schema["additionalItems"] : nullptr)
                                : (schema.contains("items") ? &schema["items"] : nullptr);
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string child = at + "/" + std::to_string(i);
      if (prefix && i < prefix->size()) {
        if (auto e = check((*prefix)[i], v[i], child); !e.empty()) return e;
      } else if (rest) {
        if (auto e = check(*rest, v[i], child); !e.empty()) return e;
      }
    }
    return "";
  }

  std::string check_object(const json& schema, const json& v, const std::string& at) const {
    const json empty = json::object();
    const json& props = schema.contains("properties") ? schema["properties"] : empty;
    if (schema.contains("required")) {
      for (const auto& r : schema["required"])
        if (!v.contains(r.get<std::string>())) return at + ": missing " + r.get<std::string>();
    }
    // Declared properties first, in schema order.
    long last_declared = -1;
    bool seen_additional = false;
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string child = at + "/" + it.key();
      if (props.contains(it.key())) {
        long index = 0;
        for (auto p = props.begin(); p != props.end() && p.key() != it.key(); ++p) ++index;
        if (seen_additional || index <= last_declared) return at + ": order";
        last_declared = index;
        if (auto e = check(props[it.key()], it.value(), child); !e.empty()) return e;
        continue;
      }
      seen_additional = true;
      if (schema.contains("additionalProperties")) {
        if (auto e = check(schema["additionalProperties"], it.value(), child); !e.empty()) return e;
      }
    }
    return "";
  }

  const json& root_;
};

}  // namespace tessera::grammar::testing
