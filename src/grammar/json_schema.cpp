// JSON Schema keywords, objects and arrays. Unknown keywords are ignored (as JSON Schema does with
// annotations); the known keywords this lowering cannot honour fail with their name and JSON pointer.
#include "grammar/json_schema.h"

#include <fmt/format.h>

#include <set>

namespace tessera::grammar {
namespace {

// Keywords that constrain documents in ways no grammar here expresses.
const std::set<std::string> kUnsupported = {"if",
                                            "then",
                                            "else",
                                            "patternProperties",
                                            "dependentSchemas",
                                            "dependentRequired",
                                            "dependencies",
                                            "not",
                                            "multipleOf",
                                            "contains",
                                            "minContains",
                                            "maxContains",
                                            "propertyNames",
                                            "unevaluatedProperties",
                                            "unevaluatedItems",
                                            "$dynamicRef",
                                            "$recursiveRef",
                                            "minProperties",
                                            "maxProperties"};

// Keywords that do not constrain (annotations) or that are only containers for other schemas.
const std::set<std::string> kAnnotations = {"title", "description", "examples",         "$schema",         "default",
                                            "$id",   "$comment",    "deprecated",       "readOnly",        "writeOnly",
                                            "$defs", "definitions", "contentMediaType", "contentEncoding", "$anchor"};

std::string escape_pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

// Merges `b` into `a` (allOf, and sibling keywords of anyOf/oneOf): properties and required are
// combined; any other keyword present in both must be equal.
bool merge_into(ojson& a, const ojson& b, std::string& conflict) {
  for (auto it = b.begin(); it != b.end(); ++it) {
    const std::string& key = it.key();
    if (kAnnotations.count(key)) continue;
    if (!a.contains(key)) {
      a[key] = it.value();
    } else if (key == "required" && a[key].is_array() && it.value().is_array()) {
      for (const auto& name : it.value())
        if (std::find(a[key].begin(), a[key].end(), name) == a[key].end()) a[key].push_back(name);
    } else if (key == "properties" && a[key].is_object() && it.value().is_object()) {
      for (auto p = it.value().begin(); p != it.value().end(); ++p) {
        if (a[key].contains(p.key()) && a[key][p.key()] != p.value()) {
          conflict = "properties/" + p.key();
          return false;
        }
        a[key][p.key()] = p.value();
      }
    } else if (a[key] != it.value()) {
      conflict = key;
      return false;
    }
  }
  return true;
}

bool has_constraints(const ojson& schema, std::initializer_list<const char*> except) {
  for (auto it = schema.begin(); it != schema.end(); ++it) {
    if (kAnnotations.count(it.key())) continue;
    bool skip = false;
    for (const char* e : except) skip |= it.key() == e;
    if (!skip) return true;
  }
  return false;
}

}  // namespace

SchemaLowering::SchemaLowering(const ojson& root, const JsonOptions& options, RuleSet& rules, Budget& budget,
                               std::string prefix)
    : root_(root), options_(options), rules_(rules), budget_(budget), prefix_(std::move(prefix)) {}

void SchemaLowering::fail(const std::string& pointer, const std::string& what) const {
  throw GrammarError(fmt::format("JSON Schema at #{}: {}", pointer, what));
}

int SchemaLowering::lower_root() {
  const int rule = rules_.new_rule(prefix_);
  ref_rules_[""] = rule;
  rules_.define(rule, value(root_, "", 0));
  return rule;
}

int SchemaLowering::rule_for(const std::string& pointer, const std::string& hint, int body) {
  std::string name = prefix_ + "_" + hint;
  const int rule = rules_.new_rule(name);
  rules_.define(rule, body);
  if (rules_.rules().size() > budget_.limits().max_rules) {
    fail(pointer, fmt::format("the grammar needs more than {} rules", budget_.limits().max_rules));
  }
  return rules_.ref(rule);
}

void SchemaLowering::check_keywords(const ojson& schema, const std::string& pointer) const {
  for (auto it = schema.begin(); it != schema.end(); ++it) {
    const std::string& key = it.key();
    if (kUnsupported.count(key)) {
      if ((key == "minProperties" && it.value() == 0)) continue;
      fail(pointer, fmt::format("keyword '{}' is not supported", key));
    }
    if (key == "uniqueItems" && it.value() == true) fail(pointer, "keyword 'uniqueItems' (true) is not supported");
  }
}

int SchemaLowering::value(const ojson& schema, const std::string& pointer, int depth) {
  budget_.check_depth(depth, fmt::format("JSON Schema at #{}", pointer));
  budget_.check_time("JSON Schema");
  if (schema.is_boolean()) {
    if (schema.get<bool>()) return rules_.ref(any_value_rule());
    fail(pointer, "schema 'false' matches nothing");
  }
  if (!schema.is_object()) fail(pointer, "a schema must be an object or a boolean");
  check_keywords(schema, pointer);

  if (schema.contains("$ref")) {
    if (has_constraints(schema, {"$ref"})) {
      for (auto it = schema.begin(); it != schema.end(); ++it) {
        if (it.key() != "$ref" && !kAnnotations.count(it.key())) {
          fail(pointer, fmt::format("keyword '{}' beside $ref is not supported", it.key()));
        }
      }
    }
    if (!schema["$ref"].is_string()) fail(pointer, "$ref must be a string");
    return ref_rule(schema["$ref"].get<std::string>(), pointer, depth);
  }
  if (schema.contains("allOf")) {
    const ojson& all = schema["allOf"];
    if (!all.is_array() || all.empty()) fail(pointer, "allOf must be a non-empty array");
    ojson merged = schema;
    merged.erase("allOf");
    for (size_t i = 0; i < all.size(); ++i) {
      ojson part = all[i];
      if (part.is_object() && part.contains("$ref") && !has_constraints(part, {"$ref"})) {
        const std::string ref = part["$ref"].get<std::string>();
        if (ref.empty() || ref[0] != '#') fail(pointer + "/allOf/" + std::to_string(i), "only local $ref is supported");
        try {
          part = root_.at(ojson::json_pointer(ref.substr(1)));
        } catch (const std::exception&) {
          fail(pointer + "/allOf/" + std::to_string(i), fmt::format("$ref '{}' does not resolve", ref));
        }
      }
      std::string conflict;
      if (!part.is_object() || !merge_into(merged, part, conflict)) {
        fail(pointer, fmt::format("allOf with conflicting '{}' (only schemas that combine by merging are supported)",
                                  conflict.empty() ? "schema" : conflict));
      }
    }
    return value(merged, pointer, depth + 1);
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!schema.contains(key)) continue;
    const ojson& branches = schema[key];
    if (!branches.is_array() || branches.empty()) fail(pointer, fmt::format("{} must be a non-empty array", key));
    ojson siblings = schema;
    siblings.erase(key);
    const bool merge = has_constraints(siblings, {});
    std::vector<int> alts;
    for (size_t i = 0; i < branches.size(); ++i) {
      const std::string branch_pointer = fmt::format("{}/{}/{}", pointer, key, i);
      if (!merge) {
        alts.push_back(value(branches[i], branch_pointer, depth + 1));
        continue;
      }
      ojson branch = siblings;
      std::string conflict;
      if (!branches[i].is_object() || !merge_into(branch, branches[i], conflict)) {
        fail(branch_pointer, fmt::format("{} branch conflicts with its parent on '{}'", key, conflict));
      }
      alts.push_back(value(branch, branch_pointer, depth + 1));
    }
    return rules_.choice(std::move(alts));
  }
  if (schema.contains("const")) return constant(schema["const"], 0);
  if (schema.contains("enum")) {
    const ojson& values = schema["enum"];
    if (!values.is_array() || values.empty()) fail(pointer, "enum must be a non-empty array");
    if (values.size() > budget_.limits().max_enum_values) {
      fail(pointer, fmt::format("enum has {} values, more than the limit of {}", values.size(),
                                budget_.limits().max_enum_values));
    }
    std::vector<int> alts;
    for (const auto& v : values) alts.push_back(constant(v, 0));
    return rules_.choice(std::move(alts));
  }

  std::vector<std::string> types;
  if (schema.contains("type")) {
    const ojson& t = schema["type"];
    if (t.is_string()) {
      types.push_back(t.get<std::string>());
    } else if (t.is_array() && !t.empty()) {
      for (const auto& item : t) {
        if (!item.is_string()) fail(pointer, "type array entries must be strings");
        types.push_back(item.get<std::string>());
      }
    } else {
      fail(pointer, "type must be a string or a non-empty array of strings");
    }
  } else {
    auto any = [&](std::initializer_list<const char*> keys) {
      for (const char* k : keys)
        if (schema.contains(k)) return true;
      return false;
    };
    if (any({"properties", "required", "additionalProperties"})) types.push_back("object");
    if (any({"items", "prefixItems", "minItems", "maxItems"})) types.push_back("array");
    if (any({"pattern", "format", "minLength", "maxLength"})) types.push_back("string");
    if (any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
    if (types.empty()) return rules_.ref(any_value_rule());  // nullable adds nothing to "any value"
  }
  if (schema.value("nullable", false) && std::find(types.begin(), types.end(), "null") == types.end()) {
    types.push_back("null");
  }
  std::vector<int> alts;
  for (const auto& type : types) alts.push_back(typed_value(schema, type, pointer, depth));
  return rules_.choice(std::move(alts));
}

int SchemaLowering::typed_value(const ojson& schema, const std::string& type, const std::string& pointer, int depth) {
  if (type == "string") return string_value(schema, pointer);
  if (type == "integer") return integer_value(schema, pointer);
  if (type == "number") return number_value(schema, pointer);
  if (type == "boolean") return rules_.choice({rules_.bytes("true"), rules_.bytes("false")});
  if (type == "null") return rules_.bytes("null");
  if (type == "object") return object_value(schema, pointer, depth);
  if (type == "array") return array_value(schema, pointer, depth);
  fail(pointer, fmt::format("unknown type '{}'", type));
}

int SchemaLowering::ref_rule(const std::string& ref, const std::string& pointer, int depth) {
  if (ref.empty() || ref[0] != '#')
    fail(pointer, fmt::format("$ref '{}': only local references (#...) are supported", ref));
  const std::string target = ref.substr(1);
  auto it = ref_rules_.find(target);
  if (it != ref_rules_.end()) return rules_.ref(it->second);
  const ojson* schema = nullptr;
  try {
    schema = &root_.at(ojson::json_pointer(target));
  } catch (const std::exception&) {
    fail(pointer, fmt::format("$ref '{}' does not resolve", ref));
  }
  std::string hint = target.substr(target.rfind('/') + 1);
  for (char& c : hint)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  const int rule = rules_.new_rule(prefix_ + "_" + (hint.empty() ? "ref" : hint));
  ref_rules_[target] = rule;
  rules_.define(rule, value(*schema, target, depth + 1));
  return rules_.ref(rule);
}

int SchemaLowering::object_value(const ojson& schema, const std::string& pointer, int depth) {
  std::vector<std::string> names;
  std::vector<const ojson*> schemas;
  static const ojson kTrue = true;
  if (schema.contains("properties")) {
    const ojson& props = schema["properties"];
    if (!props.is_object()) fail(pointer, "properties must be an object");
    for (auto it = props.begin(); it != props.end(); ++it) {
      names.push_back(it.key());
      schemas.push_back(&it.value());
    }
  }
  const ojson* additional = options_.strict ? nullptr : &kTrue;
  if (schema.contains("additionalProperties")) {
    const ojson& a = schema["additionalProperties"];
    additional = a.is_boolean() && !a.get<bool>() ? nullptr : &a;
  }
  std::vector<bool> required(names.size(), false);
  if (schema.contains("required")) {
    if (!schema["required"].is_array()) fail(pointer, "required must be an array");
    for (const auto& r : schema["required"]) {
      if (!r.is_string()) fail(pointer, "required entries must be strings");
      const auto name = r.get<std::string>();
      auto at = std::find(names.begin(), names.end(), name);
      if (at == names.end()) {
        if (!additional) fail(pointer, fmt::format("required property '{}' is not in properties", name));
        names.push_back(name);
        schemas.push_back(additional);
        required.push_back(true);
      } else {
        required[at - names.begin()] = true;
      }
    }
  }
  std::vector<int> entries;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string child = pointer + "/properties/" + escape_pointer_token(names[i]);
    entries.push_back(
        rules_.sequence({rules_.bytes(ojson(names[i]).dump()), separator(':'), value(*schemas[i], child, depth + 1)}));
  }
  int extra = -1;  // (, key: value)* after the listed properties
  int extra_entry = -1;
  if (additional) {
    const int key = names.empty() ? rules_.ref(string_rule()) : key_excluding(names);
    extra_entry =
        rules_.sequence({key, separator(':'), value(*additional, pointer + "/additionalProperties", depth + 1)});
    extra = rules_.repeat(rules_.sequence({separator(','), extra_entry}), 0, kUnbounded);
  }
  // tails[j]: the entries from j on, after at least one entry was written.
  std::vector<int> tails(names.size() + 1);
  tails[names.size()] = extra >= 0 ? extra : rules_.empty();
  for (size_t j = names.size(); j-- > 0;) {
    int e = rules_.sequence({separator(','), entries[j]});
    if (!required[j]) e = rules_.repeat(e, 0, 1);
    tails[j] = rules_.sequence({e, tails[j + 1]});
  }
  std::vector<int> firsts;
  bool any_required = false;
  for (size_t k = 0; k < names.size(); ++k) {
    firsts.push_back(rules_.sequence({entries[k], tails[k + 1]}));
    if (required[k]) {
      any_required = true;
      break;
    }
  }
  if (!any_required && extra_entry >= 0) firsts.push_back(rules_.sequence({extra_entry, extra}));
  std::vector<int> alts;
  if (!firsts.empty()) alts.push_back(rules_.sequence({open('{'), rules_.choice(std::move(firsts)), close('}')}));
  if (!any_required) alts.push_back(rules_.sequence({rules_.bytes("{"), ws(), rules_.bytes("}")}));
  return rule_for(pointer, "object", rules_.choice(std::move(alts)));
}

int SchemaLowering::array_value(const ojson& schema, const std::string& pointer, int depth) {
  std::vector<int> prefix;
  const ojson* rest = nullptr;
  static const ojson kTrue = true;
  std::string rest_pointer;
  if (schema.contains("prefixItems")) {
    if (!schema["prefixItems"].is_array()) fail(pointer, "prefixItems must be an array");
    for (size_t i = 0; i < schema["prefixItems"].size(); ++i) {
      prefix.push_back(value(schema["prefixItems"][i], fmt::format("{}/prefixItems/{}", pointer, i), depth + 1));
    }
    rest = schema.contains("items") ? &schema["items"] : &kTrue;
    rest_pointer = pointer + "/items";
  } else if (schema.contains("items") && schema["items"].is_array()) {  // draft 4-7 tuples
    for (size_t i = 0; i < schema["items"].size(); ++i) {
      prefix.push_back(value(schema["items"][i], fmt::format("{}/items/{}", pointer, i), depth + 1));
    }
    rest = schema.contains("additionalItems") ? &schema["additionalItems"] : &kTrue;
    rest_pointer = pointer + "/additionalItems";
  } else {
    rest = schema.contains("items") ? &schema["items"] : &kTrue;
    rest_pointer = pointer + "/items";
  }
  const bool rest_allowed = !(rest->is_boolean() && !rest->get<bool>());
  auto count = [&](const char* key, int64_t fallback) -> int64_t {
    if (!schema.contains(key)) return fallback;
    if (!schema[key].is_number_integer() && !schema[key].is_number_unsigned())
      fail(pointer, fmt::format("{} must be an integer", key));
    return schema[key].get<int64_t>();
  };
  const int64_t min_items = count("minItems", 0);
  int64_t max_items = count("maxItems", -1);
  const int64_t k = static_cast<int64_t>(prefix.size());
  if (!rest_allowed && (max_items < 0 || max_items > k)) max_items = k;
  if (max_items >= 0 && min_items > max_items) fail(pointer, "minItems is greater than maxItems");
  if (min_items > 100000 || max_items > 100000) fail(pointer, "minItems/maxItems over 100000");
  const int64_t used = max_items >= 0 ? std::min(k, max_items) : k;
  prefix.resize(used);

  const int empty = rules_.sequence({rules_.bytes("["), ws(), rules_.bytes("]")});
  if (max_items == 0) return empty;
  int rest_expr = -1;
  if (rest_allowed && (max_items < 0 || max_items > used)) rest_expr = value(*rest, rest_pointer, depth + 1);
  // The elements after prefix element i-1, with at least `i` already written.
  auto rest_part = [&](int64_t written) {
    if (rest_expr < 0) return rules_.empty();
    const int64_t min = std::max<int64_t>(0, min_items - written);
    const int64_t max = max_items < 0 ? kUnbounded : max_items - written;
    return rules_.repeat(rules_.sequence({separator(','), rest_expr}), static_cast<int>(min), static_cast<int>(max));
  };
  int nonempty;
  if (used == 0) {
    if (rest_expr < 0) return empty;
    nonempty = rules_.sequence({rest_expr, rest_part(1)});
  } else {
    int tail = rest_part(used);
    for (int64_t i = used - 1; i >= 1; --i) {
      int t = rules_.sequence({separator(','), prefix[i], tail});
      tail = i >= min_items ? rules_.repeat(t, 0, 1) : t;
    }
    nonempty = rules_.sequence({prefix[0], tail});
  }
  const int full = rules_.sequence({open('['), nonempty, close(']')});
  return rule_for(pointer, "array", min_items == 0 ? rules_.choice({empty, full}) : full);
}

int lower_json_schema(const ojson& schema, const JsonOptions& options, RuleSet& rules, Budget& budget,
                      const std::string& prefix) {
  return SchemaLowering(schema, options, rules, budget, prefix).lower_root();
}

int lower_any_json_object(const JsonOptions& options, RuleSet& rules, Budget& budget, const std::string& prefix) {
  static const ojson kEmpty = ojson::object();
  return SchemaLowering(kEmpty, options, rules, budget, prefix).any_object_rule();
}

}  // namespace tessera::grammar
