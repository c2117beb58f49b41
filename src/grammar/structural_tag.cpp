// xgrammar's structural tag formats lowered to the IR: const_string, json_schema, grammar (EBNF), regex,
// any_text, sequence, or, tag, triggered_tags, tags_with_separator and qwen_xml_parameter, nested as xgrammar
// allows. any_text, triggered_tags and tags_with_separator are "unlimited" (they cannot tell where they end
// by themselves): such a format must come last in a sequence, an `or` takes all unlimited or none, and inside
// a tag the unlimited content ends where the tag's end string first occurs (the end string is its stop).
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "grammar/ir.h"

namespace tessera::grammar {
namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* kTypes =
    "const_string, json_schema, grammar, regex, any_text, sequence, or, tag, triggered_tags, tags_with_separator, "
    "qwen_xml_parameter";

class StructuralTagLowering {
 public:
  StructuralTagLowering(const JsonOptions& options, RuleSet& rules, Budget& budget, bool check_only)
      : options_(options), rules_(rules), budget_(budget), check_only_(check_only) {}

  struct Part {
    int expr;
    bool unlimited;
  };

  // `end`: the end string of the nearest enclosing tag (an unlimited format stops where it occurs).
  Part lower(const ojson& f, const std::string& path, const std::optional<std::string>& end, int depth) {
    budget_.check_depth(depth, fmt::format("'{}'", path));
    budget_.check_time("structural tag");
    if (!f.is_object()) fail(path, fmt::format("must be an object with a 'type' ({})", kTypes));
    auto t = f.find("type");
    if (t == f.end() || !t->is_string()) fail(path + ".type", fmt::format("must be one of {}", kTypes));
    const std::string& type = t->get_ref<const std::string&>();
    if (type == "const_string") {
      expect_keys(f, {"type", "value"}, path, type);
      return {rules_.bytes(string_field(f, "value", path, true)), false};
    }
    if (type == "json_schema") return {json_schema(f, path), false};
    if (type == "grammar") return {grammar(f, path), false};
    if (type == "regex") {
      expect_keys(f, {"type", "pattern"}, path, type);
      const std::string pattern = string_field(f, "pattern", path, true);
      if (check_only_) return {rules_.empty(), false};
      return {wrap(path + ".pattern", [&] { return lower_regex(pattern, rules_, budget_); }), false};
    }
    if (type == "any_text") {
      expect_keys(f, {"type"}, path, type);
      if (end) return {rules_.tag_dispatch({}, {}, {*end}, true), true};
      return {rules_.repeat(rules_.char_class({{0, kMaxCodepoint}}), 0, kUnbounded), true};
    }
    if (type == "sequence" || type == "or") return sequence_or(f, path, end, depth, type == "or");
    if (type == "tag") return {tag(f, path, depth, nullptr), false};
    if (type == "triggered_tags") return {triggered_tags(f, path, end, depth), true};
    if (type == "tags_with_separator") return {tags_with_separator(f, path, end, depth), true};
    if (type == "qwen_xml_parameter") return {qwen_xml_parameter(f, path), false};
    fail(path + ".type", fmt::format("is '{}', not a structural tag format ({})", type, kTypes));
  }

 private:
  [[noreturn]] static void fail(const std::string& path, const std::string& what) {
    throw GrammarError(fmt::format("'{}' {}", path, what));
  }

  static void expect_keys(const ojson& f, std::initializer_list<const char*> keys, const std::string& path,
                          const std::string& type) {
    for (const auto& item : f.items()) {
      const std::string& key = item.key();
      if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return key == k; })) {
        std::string list;
        for (const char* k : keys) list += (list.empty() ? "" : ", ") + std::string(k);
        fail(path + "." + key, fmt::format("is not a field of a {} format (its fields: {})", type, list));
      }
    }
  }

  static std::string string_field(const ojson& f, const char* key, const std::string& path, bool non_empty) {
    auto it = f.find(key);
    if (it == f.end() || !it->is_string() || (non_empty && it->get_ref<const std::string&>().empty()))
      fail(path + "." + key, non_empty ? "must be a non-empty string" : "must be a string");
    return it->get<std::string>();
  }

  static bool flag(const ojson& f, const char* key, const std::string& path) {
    auto it = f.find(key);
    if (it == f.end()) return false;
    if (!it->is_boolean()) fail(path + "." + key, "must be a boolean");
    return it->get<bool>();
  }

  static const ojson& list_field(const ojson& f, const char* key, const std::string& path, const char* what) {
    auto it = f.find(key);
    if (it == f.end() || !it->is_array() || it->empty())
      fail(path + "." + key, fmt::format("must be a non-empty list of {}", what));
    return *it;
  }

  // Runs a front end, prefixing its GrammarError with the path of the field it came from.
  template <typename F>
  int wrap(const std::string& path, F lower_part) {
    try {
      return lower_part();
    } catch (const GrammarError& e) {
      throw GrammarError(fmt::format("'{}': {}", path, e.what()));
    }
  }

  // A rule-name prefix no rule has yet (the front ends name their rules after it).
  std::string unique_prefix(const char* hint) {
    std::string prefix;
    do prefix = fmt::format("{}_{}", hint, ++counter_);
    while (rules_.find_rule(prefix) >= 0 || rules_.find_rule(prefix + "_1") >= 0);
    return prefix;
  }

  int as_rule(int expr, const char* hint) {
    const int rule = rules_.new_rule(fmt::format("stag_{}", hint));
    rules_.define(rule, expr);
    return rules_.ref(rule);
  }

  int json_schema(const ojson& f, const std::string& path) {
    expect_keys(f, {"type", "json_schema"}, path, "json_schema");
    auto s = f.find("json_schema");
    if (s == f.end() || !(s->is_object() || s->is_boolean()))
      fail(path + ".json_schema", "must be a JSON Schema (an object or a boolean)");
    if (check_only_) return rules_.empty();
    return wrap(path + ".json_schema", [&] {
      return rules_.ref(lower_json_schema(*s, options_, rules_, budget_, unique_prefix("stag_json")));
    });
  }

  // An EBNF grammar (start rule `root`), parsed on its own and copied in under fresh rule names.
  int grammar(const ojson& f, const std::string& path) {
    expect_keys(f, {"type", "grammar"}, path, "grammar");
    const std::string text = string_field(f, "grammar", path, true);
    if (check_only_) return rules_.empty();
    return wrap(path + ".grammar", [&] {
      RuleSet own;
      parse_ebnf(text, own, budget_);
      const int root = own.find_rule("root");
      if (root < 0) throw GrammarError("the grammar has no rule 'root' (its start rule)");
      const std::string prefix = unique_prefix("stag_grammar") + "_";
      std::vector<int> renamed(own.rules().size());
      for (size_t r = 0; r < own.rules().size(); ++r) {
        if (!own.defined(static_cast<int>(r)))
          throw GrammarError(
              fmt::format("rule '{}' is referenced but not defined", own.rule_name(static_cast<int>(r))));
        renamed[r] = rules_.new_rule(prefix + own.rule_name(static_cast<int>(r)));
      }
      for (size_t r = 0; r < own.rules().size(); ++r)
        rules_.define(renamed[r], copy_expr(own, own.rules()[r].body, renamed));
      return rules_.ref(renamed[root]);
    });
  }

  int copy_expr(const RuleSet& from, int id, const std::vector<int>& renamed) {
    Expr e = from.expr(id);
    if (e.kind == ExprKind::kRuleRef) return rules_.ref(renamed[e.rule]);
    switch (e.kind) {
      case ExprKind::kEmpty:
        return rules_.empty();
      case ExprKind::kBytes:
        return rules_.bytes(e.bytes);
      case ExprKind::kClass:
        return rules_.char_class(e.ranges);
      default:
        break;
    }
    std::vector<int> items;
    for (int item : e.items) items.push_back(copy_expr(from, item, renamed));
    if (e.kind == ExprKind::kSequence) return rules_.sequence(std::move(items));
    if (e.kind == ExprKind::kChoice) return rules_.choice(std::move(items));
    if (e.kind == ExprKind::kRepeat) return rules_.repeat(items[0], e.min, e.max);
    return rules_.tag_dispatch(e.strings, std::move(items), e.stops, e.loop);
  }

  Part sequence_or(const ojson& f, const std::string& path, const std::optional<std::string>& end, int depth,
                   bool is_or) {
    const char* type = is_or ? "or" : "sequence";
    expect_keys(f, {"type", "elements"}, path, type);
    const ojson& elements = list_field(f, "elements", path, "formats");
    std::vector<int> items;
    bool any_unlimited = false, all_unlimited = true;
    for (size_t i = 0; i < elements.size(); ++i) {
      const std::string at = fmt::format("{}.elements[{}]", path, i);
      const Part p = lower(elements[i], at, end, depth + 1);
      if (!is_or && p.unlimited && i + 1 < elements.size())
        fail(at,
             "is unlimited (any_text, triggered_tags or tags_with_separator): only the last element of a "
             "sequence may be; wrap it in a tag with an end string");
      any_unlimited |= p.unlimited;
      all_unlimited &= p.unlimited;
      items.push_back(p.expr);
    }
    if (is_or && any_unlimited && !all_unlimited)
      fail(path,
           "mixes unlimited elements (any_text, triggered_tags, tags_with_separator) with limited ones; "
           "make them all one kind");
    return {is_or ? rules_.choice(std::move(items)) : rules_.sequence(std::move(items)), any_unlimited};
  }

  // A tag: begin, content, end (the content's stop when it is unlimited). With `dispatch_begin`, the part of
  // `begin` after the trigger that dispatched it is written there and the returned expression omits begin.
  int tag(const ojson& f, const std::string& path, int depth, std::string* begin_out) {
    if (!f.is_object()) fail(path, "must be a tag object: {\"type\": \"tag\", \"begin\", \"content\", \"end\"}");
    if (auto t = f.find("type"); t != f.end() && *t != "tag") fail(path + ".type", "must be \"tag\"");
    expect_keys(f, {"type", "begin", "content", "end"}, path, "tag");
    const std::string begin = string_field(f, "begin", path, false);
    const std::string end = string_field(f, "end", path, false);
    auto content = f.find("content");
    if (content == f.end()) fail(path + ".content", "is required (a format)");
    const Part p = lower(*content, path + ".content", end.empty() ? std::nullopt : std::optional(end), depth + 1);
    if (p.unlimited && end.empty())
      fail(path + ".end", "must be non-empty: the content is unlimited and stops where the end string occurs");
    const int body = rules_.sequence({p.expr, rules_.bytes(p.unlimited ? "" : end)});
    if (begin_out) {
      *begin_out = begin;
      return as_rule(body, "tag_body");
    }
    return rules_.sequence({rules_.bytes(begin), as_rule(body, "tag_body")});
  }

  // Each tag of a list as {begin, the rest}.
  std::vector<std::pair<std::string, int>> tag_list(const ojson& f, const std::string& path, int depth) {
    const ojson& tags = list_field(f, "tags", path, "tags");
    if (tags.size() > budget_.limits().max_enum_values)
      fail(path + ".tags", fmt::format("has more than {} tags", budget_.limits().max_enum_values));
    std::vector<std::pair<std::string, int>> out;
    for (size_t i = 0; i < tags.size(); ++i) {
      std::string begin;
      const int rest = tag(tags[i], fmt::format("{}.tags[{}]", path, i), depth + 1, &begin);
      out.emplace_back(std::move(begin), rest);
    }
    return out;
  }

  int any_tag(const std::vector<std::pair<std::string, int>>& tags) {
    std::vector<int> alts;
    for (const auto& [begin, rest] : tags) alts.push_back(rules_.sequence({rules_.bytes(begin), rest}));
    return as_rule(rules_.choice(std::move(alts)), "tags");
  }

  int triggered_tags(const ojson& f, const std::string& path, const std::optional<std::string>& end, int depth) {
    expect_keys(f, {"type", "triggers", "tags", "at_least_one", "stop_after_first"}, path, "triggered_tags");
    const bool at_least_one = flag(f, "at_least_one", path), stop_after_first = flag(f, "stop_after_first", path);
    const ojson& list = list_field(f, "triggers", path, "non-empty strings (the text that starts a tag)");
    std::vector<std::string> triggers;
    for (size_t t = 0; t < list.size(); ++t) {
      if (!list[t].is_string() || list[t].get_ref<const std::string&>().empty())
        fail(fmt::format("{}.triggers[{}]", path, t), "must be a non-empty string");
      triggers.push_back(list[t].get<std::string>());
    }
    const auto tags = tag_list(f, path, depth);
    std::vector<std::vector<int>> groups(triggers.size());
    for (size_t i = 0; i < tags.size(); ++i) {
      bool started = false;
      for (size_t t = 0; t < triggers.size(); ++t) {
        if (!tags[i].first.starts_with(triggers[t])) continue;
        started = true;
        groups[t].push_back(rules_.sequence({rules_.bytes(tags[i].first.substr(triggers[t].size())), tags[i].second}));
      }
      if (!started)
        fail(fmt::format("{}.tags[{}].begin", path, i),
             fmt::format("'{}' starts with none of the triggers; make each begin start with a trigger", tags[i].first));
    }
    std::vector<int> continuations;
    for (size_t t = 0; t < triggers.size(); ++t) {
      if (groups[t].empty())
        fail(fmt::format("{}.triggers[{}]", path, t),
             fmt::format("'{}' starts no tag's begin; remove it or add a tag whose begin starts with it", triggers[t]));
      continuations.push_back(as_rule(rules_.choice(std::move(groups[t])), "triggered_group"));
    }
    std::vector<std::string> stops;
    if (end) stops.push_back(*end);
    if (at_least_one && stop_after_first) return rules_.sequence({any_tag(tags), rules_.bytes(end.value_or(""))});
    const int dispatch =
        as_rule(rules_.tag_dispatch(triggers, std::move(continuations), stops, !stop_after_first), "dispatch");
    return at_least_one ? rules_.sequence({any_tag(tags), dispatch}) : dispatch;
  }

  int tags_with_separator(const ojson& f, const std::string& path, const std::optional<std::string>& end, int depth) {
    expect_keys(f, {"type", "tags", "separator", "at_least_one", "stop_after_first"}, path, "tags_with_separator");
    const bool at_least_one = flag(f, "at_least_one", path), stop_after_first = flag(f, "stop_after_first", path);
    const std::string separator = string_field(f, "separator", path, true);
    const int one = any_tag(tag_list(f, path, depth));
    int body = one;
    if (!stop_after_first)
      body = rules_.sequence({one, rules_.repeat(rules_.sequence({rules_.bytes(separator), one}), 0, kUnbounded)});
    if (!at_least_one) body = rules_.choice({body, rules_.empty()});
    return rules_.sequence({body, rules_.bytes(end.value_or(""))});
  }

  // Qwen's XML parameters: `<parameter=NAME>VALUE</parameter>` for each declared property in order (optional
  // ones may be left out), whitespace before each and around each value; a plain string value is raw text
  // without < > & or control characters, every other value JSON.
  int qwen_xml_parameter(const ojson& f, const std::string& path) {
    expect_keys(f, {"type", "json_schema"}, path, "qwen_xml_parameter");
    const std::string at = path + ".json_schema";
    auto s = f.find("json_schema");
    if (s == f.end() || !s->is_object() || s->value("type", ojson()) != "object")
      fail(at, "must be an object schema with \"type\": \"object\" (its properties are the parameters)");
    if (auto ap = s->find("additionalProperties"); ap != s->end() && *ap != false)
      fail(at + ".additionalProperties", "is not supported here (only false): declare each parameter");
    std::vector<std::string> required;
    if (auto r = s->find("required"); r != s->end() && r->is_array())
      for (const auto& x : *r)
        if (x.is_string()) required.push_back(x.get<std::string>());
    const ojson no_properties = ojson::object();
    auto props = s->find("properties");
    const ojson& properties = props != s->end() && props->is_object() ? *props : no_properties;
    for (const auto& name : required)
      if (!properties.contains(name))
        fail(at + ".required", fmt::format("names '{}', which is not in properties", name));
    if (check_only_) return rules_.empty();
    const int ws = rules_.repeat(rules_.char_class({{' ', ' '}, {'\n', '\n'}, {'\t', '\t'}}), 0, kUnbounded);
    std::vector<int> items;
    for (const auto& property : properties.items()) {
      const std::string& name = property.key();
      const ojson& schema = property.value();
      const int value = wrap(fmt::format("{}.properties.{}", at, name), [&] { return xml_value(schema, *s); });
      const int one =
          rules_.sequence({ws, rules_.bytes("<parameter=" + name + ">"), ws, value, ws, rules_.bytes("</parameter>")});
      const bool needed = std::find(required.begin(), required.end(), name) != required.end();
      items.push_back(needed ? one : rules_.repeat(one, 0, 1));
    }
    return as_rule(rules_.sequence(std::move(items)), "qwen_xml");
  }

  int xml_value(const ojson& schema, const ojson& root) {
    const bool raw = schema.is_object() && schema.value("type", ojson()) == "string" && !schema.contains("enum") &&
                     !schema.contains("const");
    if (raw) {
      if (auto p = schema.find("pattern"); p != schema.end() && p->is_string())
        return lower_regex(p->get<std::string>(), rules_, budget_);
      // One character: anything but < > & backslash and controls, or a JSON escape (as xgrammar).
      const int hex = rules_.char_class({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
      const int escape = rules_.sequence(
          {rules_.bytes("\\"),
           rules_.choice(
               {rules_.char_class(
                    {{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 'b'}, {'f', 'f'}, {'n', 'n'}, {'r', 'r'}, {'t', 't'}}),
                rules_.sequence({rules_.bytes("u"), hex, hex, hex, hex})})});
      const int text = rules_.choice(
          {rules_.char_class(complement_ranges({{0, 0x1F}, {'<', '<'}, {'>', '>'}, {'&', '&'}, {'\\', '\\'}})),
           escape});
      const int min = schema.value("minLength", 0);
      const int max = schema.contains("maxLength") ? schema.value("maxLength", 0) : kUnbounded;
      if (min < 0 || (max != kUnbounded && max < min) || std::max(min, max) > 10000)
        throw GrammarError("minLength/maxLength must be 0 <= minLength <= maxLength <= 10000");
      return rules_.repeat(text, min, max);
    }
    // JSON; the object's $defs and definitions stay reachable from the value's schema.
    ojson value = schema;
    if (value.is_object())
      for (const char* defs : {"$defs", "definitions"})
        if (root.contains(defs) && !value.contains(defs)) value[defs] = root[defs];
    return rules_.ref(lower_json_schema(value, options_, rules_, budget_, unique_prefix("stag_xml")));
  }

  const JsonOptions& options_;
  RuleSet& rules_;
  Budget& budget_;
  bool check_only_;
  int counter_ = 0;
};

}  // namespace

int lower_structural_tag(const ojson& format, const JsonOptions& options, RuleSet& rules, Budget& budget,
                         const std::string& path, bool check_only) {
  StructuralTagLowering lowering(options, rules, budget, check_only);
  return lowering.lower(format, path, std::nullopt, 0).expr;
}

}  // namespace tessera::grammar
