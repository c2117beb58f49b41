#include "server/structured_output.h"

#include <fmt/format.h>

#include <algorithm>
#include <initializer_list>

#include "core/logging.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace tessera::server {

using namespace api;

namespace {

using Kind = StructuredOutputSpec::Kind;

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kJsonSchema:
      return "json_schema";
    case Kind::kJsonObject:
      return "json_object";
    case Kind::kRegex:
      return "regex";
    case Kind::kChoice:
      return "choice";
    case Kind::kGrammar:
      return "grammar";
    case Kind::kToolCalls:
      return "tool_calls";
    case Kind::kStructuralTag:
      return "structural_tag";
  }
  return "";
}

// A schema given as an object (or true), or as JSON text (vLLM accepts both for guided_json / json).
ojson schema_value(const ojson& v, const std::string& where) {
  if (v.is_object() || v.is_boolean()) return v;
  if (v.is_string()) {
    try {
      ojson parsed = ojson::parse(v.get_ref<const std::string&>());
      if (parsed.is_object() || parsed.is_boolean()) return parsed;
    } catch (const std::exception& e) {
      bad(fmt::format("'{}' is not valid JSON: {}", where, json_error_text(e)), where);
    }
  }
  bad(fmt::format("'{}' must be a JSON Schema (an object, or its JSON text)", where), where);
}

std::string string_value(const ojson& v, const std::string& where) {
  if (!v.is_string() || v.get_ref<const std::string&>().empty())
    bad(fmt::format("'{}' must be a non-empty string", where), where);
  return v.get<std::string>();
}

std::vector<std::string> choices_value(const ojson& v, const std::string& where) {
  if (!v.is_array() || v.empty()) bad(fmt::format("'{}' must be a non-empty list of strings", where), where);
  std::vector<std::string> out;
  for (const auto& c : v) {
    if (!c.is_string()) bad(fmt::format("'{}' must be a non-empty list of strings", where), where);
    out.push_back(c.get<std::string>());
  }
  return out;
}

// A string member of a structural tag object; `what` names it in errors.
std::string tag_string(const ojson& o, const char* key, const std::string& what, const std::string& param,
                       bool non_empty) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_string() || (non_empty && it->get_ref<const std::string&>().empty()))
    bad(fmt::format("'{}.{}' must be a {}string", what, key, non_empty ? "non-empty " : ""), param);
  return it->get<std::string>();
}

void expect_keys(const ojson& o, std::initializer_list<const char*> keys, const std::string& what,
                 const std::string& param) {
  for (const auto& item : o.items()) {
    const std::string& key = item.key();
    if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return key == k; })) {
      std::string list;
      for (const char* k : keys) list += (list.empty() ? "" : ", ") + std::string(k);
      bad(fmt::format("'{}.{}' is not a field of a structural tag here (expected: {})", what, key, list), param);
    }
  }
}

void read_triggers(const ojson& o, const std::string& what, const std::string& param, StructuredOutputSpec& s) {
  auto t = o.find("triggers");
  if (t == o.end() || !t->is_array() || t->empty())
    bad(fmt::format("'{}.triggers' must be a non-empty list of strings (the text that starts a tag)", what), param);
  for (const auto& x : *t) {
    if (!x.is_string() || x.get_ref<const std::string&>().empty())
      bad(fmt::format("'{}.triggers' must hold non-empty strings", what), param);
    s.triggers.push_back(x.get<std::string>());
  }
}

// vLLM's form: {"type": "structural_tag" (optional), "structures": [{"begin", "schema", "end"}], "triggers"}.
void read_tag_structures(const ojson& o, const std::string& what, const std::string& param, StructuredOutputSpec& s) {
  expect_keys(o, {"type", "structures", "triggers"}, what, param);
  auto list = o.find("structures");
  if (list == o.end() || !list->is_array() || list->empty())
    bad(fmt::format("'{}.structures' must be a non-empty list of {{\"begin\", \"schema\", \"end\"}}", what), param);
  for (size_t i = 0; i < list->size(); ++i) {
    const ojson& st = (*list)[i];
    const std::string at = fmt::format("{}.structures[{}]", what, i);
    if (!st.is_object()) bad(fmt::format("'{}' must be an object with begin, schema and end", at), param);
    expect_keys(st, {"begin", "schema", "end"}, at, param);
    auto schema = st.find("schema");
    if (schema == st.end()) bad(fmt::format("'{}.schema' is required", at), param);
    s.structures.push_back({{"begin", tag_string(st, "begin", at, param, true)},
                            {"schema", schema_value(*schema, at + ".schema")},
                            {"end", tag_string(st, "end", at, param, false)}});
  }
  read_triggers(o, what, param, s);
}

// Whether an xgrammar format is the {"structures", "triggers"} form in other words: triggered_tags (flags false)
// whose tags have JSON Schema content. Such a format is read into `structures` so that both forms share a grammar.
bool is_structures_form(const ojson& f) {
  auto only = [](const ojson& o, std::initializer_list<const char*> keys) {
    for (const auto& item : o.items())
      if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return item.key() == k; })) return false;
    return true;
  };
  if (!f.is_object() || f.value("type", ojson()) != "triggered_tags" ||
      !only(f, {"type", "triggers", "tags", "at_least_one", "stop_after_first"}))
    return false;
  for (const char* flag : {"at_least_one", "stop_after_first"})
    if (f.contains(flag) && f[flag] != false) return false;
  auto tags = f.find("tags");
  if (tags == f.end() || !tags->is_array() || tags->empty()) return false;
  for (const auto& tag : *tags) {
    if (!tag.is_object() || tag.value("type", ojson("tag")) != "tag" || !only(tag, {"type", "begin", "content", "end"}))
      return false;
    auto content = tag.find("content");
    if (content == tag.end() || !content->is_object() || !only(*content, {"type", "json_schema"}) ||
        content->value("type", ojson()) != "json_schema" || !content->contains("json_schema"))
      return false;
  }
  return true;
}

// xgrammar's form: {"type": "structural_tag", "format": {...}}, any of its format types, nested.
void read_tag_format(const ojson& o, const std::string& what, const std::string& param, StructuredOutputSpec& s) {
  expect_keys(o, {"type", "format"}, what, param);
  const ojson& f = o["format"];
  const std::string at = what + ".format";
  if (!is_structures_form(f)) {
    try {
      grammar::check_structural_tag(f, at);
    } catch (const grammar::GrammarError& e) {
      bad(e.what(), param);
    }
    s.tag_format = f;
    return;
  }
  const ojson& tags = f["tags"];
  for (size_t i = 0; i < tags.size(); ++i) {
    const ojson& tag = tags[i];
    const std::string tat = fmt::format("{}.tags[{}]", at, i);
    s.structures.push_back({{"begin", tag_string(tag, "begin", tat, param, true)},
                            {"schema", schema_value(tag["content"]["json_schema"], tat + ".content.json_schema")},
                            {"end", tag_string(tag, "end", tat, param, false)}});
  }
  read_triggers(f, at, param, s);
}

// A structural tag given as an object or as its JSON text (vLLM passes structured_outputs.structural_tag as
// text); `what` is the field it came from.
StructuredOutputSpec read_structural_tag(const ojson& value, const std::string& what) {
  ojson o = value;
  if (value.is_string()) {
    try {
      o = ojson::parse(value.get_ref<const std::string&>());
    } catch (const std::exception& e) {
      bad(fmt::format("'{}' is not valid JSON: {}", what, json_error_text(e)), what);
    }
  }
  if (!o.is_object())
    bad(fmt::format("'{}' must be a structural tag: {{\"structures\": [{{\"begin\", \"schema\", \"end\"}}], "
                    "\"triggers\": [...]}}, as an object or its JSON text",
                    what),
        what);
  if (auto t = o.find("type"); t != o.end() && *t != "structural_tag")
    bad(fmt::format("'{}.type' must be \"structural_tag\"", what), what);
  StructuredOutputSpec s;
  s.kind = Kind::kStructuralTag;
  s.field = what;
  if (o.contains("format"))
    read_tag_format(o, what, what, s);
  else
    read_tag_structures(o, what, what, s);
  return s;
}

void read_response_format(const ojson& rf, std::vector<StructuredOutputSpec>& found) {
  if (!rf.is_object()) bad("'response_format' must be an object", "response_format");
  auto t = rf.find("type");
  if (t == rf.end() || !t->is_string())
    bad("'response_format.type' must be one of text, json_object, json_schema", "response_format");
  const std::string type = t->get<std::string>();
  if (type == "text") return;
  StructuredOutputSpec s;
  s.field = "response_format";
  if (type == "json_object") {
    s.kind = Kind::kJsonObject;
  } else if (type == "json_schema") {
    auto js = rf.find("json_schema");
    if (js == rf.end() || !js->is_object())
      bad("'response_format.json_schema' must be an object with a 'schema'", "response_format");
    auto schema = js->find("schema");
    if (schema == js->end()) bad("'response_format.json_schema.schema' is required", "response_format");
    s.kind = Kind::kJsonSchema;
    s.schema = schema_value(*schema, "response_format.json_schema.schema");
    if (auto st = js->find("strict"); st != js->end() && !st->is_null()) {
      if (!st->is_boolean()) bad("'response_format.json_schema.strict' must be a boolean", "response_format");
      s.strict = st->get<bool>();
    }
  } else if (type == "structural_tag") {
    s = read_structural_tag(rf, "response_format");
  } else {
    bad(fmt::format("'response_format.type' '{}' is not one of text, json_object, json_schema, structural_tag", type),
        "response_format");
  }
  found.push_back(std::move(s));
}

// vLLM's StructuredOutputsParams: exactly one of json, regex, choice, grammar, json_object, structural_tag,
// and the options disable_any_whitespace, disable_additional_properties, whitespace_pattern.
void read_structured_outputs(const ojson& so, std::vector<StructuredOutputSpec>& found) {
  const std::string f = "structured_outputs";
  if (!so.is_object()) bad("'structured_outputs' must be an object", f);
  StructuredOutputSpec s;
  int kinds = 0;
  for (const auto& [key, v] : so.items()) {
    const std::string where = f + "." + key;
    if (v.is_null()) continue;
    if (key == "json") {
      s.kind = Kind::kJsonSchema, s.schema = schema_value(v, where), ++kinds;
    } else if (key == "regex") {
      s.kind = Kind::kRegex, s.text = string_value(v, where), ++kinds;
    } else if (key == "choice") {
      s.kind = Kind::kChoice, s.choices = choices_value(v, where), ++kinds;
    } else if (key == "grammar") {
      s.kind = Kind::kGrammar, s.text = string_value(v, where), ++kinds;
    } else if (key == "json_object") {
      if (!v.is_boolean()) bad(fmt::format("'{}' must be a boolean", where), f);
      if (v.get<bool>()) s.kind = Kind::kJsonObject, ++kinds;
    } else if (key == "structural_tag") {
      StructuredOutputSpec tag = read_structural_tag(v, where);
      s.kind = tag.kind, s.structures = std::move(tag.structures), s.triggers = std::move(tag.triggers);
      s.tag_format = std::move(tag.tag_format), ++kinds;
    } else if (key == "disable_any_whitespace") {
      if (!v.is_boolean()) bad(fmt::format("'{}' must be a boolean", where), f);
      s.any_whitespace = !v.get<bool>();
    } else if (key == "disable_additional_properties") {
      if (!v.is_boolean()) bad(fmt::format("'{}' must be a boolean", where), f);
      s.strict = v.get<bool>();
    } else if (key == "whitespace_pattern") {
      s.whitespace_pattern = string_value(v, where);
    } else if (key == "disable_fallback" || key == "backend") {
      // One grammar engine serves every request: there is no backend to choose or fall back from.
      continue;
    } else {
      bad(fmt::format("'{}' is not a structured_outputs field (json, regex, choice, grammar, json_object, "
                      "structural_tag, disable_any_whitespace, disable_additional_properties, whitespace_pattern)",
                      where),
          f);
    }
    if (s.field.empty() && kinds == 1) s.field = where;
  }
  if (kinds == 0) bad("'structured_outputs' needs one of json, regex, choice, grammar, json_object, structural_tag", f);
  if (s.field.empty()) s.field = f;
  if (kinds > 1)
    bad("'structured_outputs' takes exactly one of json, regex, choice, grammar, json_object, structural_tag", f);
  found.push_back(std::move(s));
}

// The older vLLM fields: guided_json, guided_regex, guided_choice, guided_grammar, guided_whitespace_pattern.
void read_guided(const ojson& body, std::vector<StructuredOutputSpec>& found) {
  const size_t before = found.size();
  auto take = [&](const char* name, Kind kind) -> StructuredOutputSpec* {
    const ojson* v = field(body, name);
    if (!v) return nullptr;
    StructuredOutputSpec s;
    s.kind = kind;
    s.field = name;
    if (kind == Kind::kJsonSchema) s.schema = schema_value(*v, name);
    if (kind == Kind::kRegex || kind == Kind::kGrammar) s.text = string_value(*v, name);
    if (kind == Kind::kChoice) s.choices = choices_value(*v, name);
    found.push_back(std::move(s));
    return &found.back();
  };
  take("guided_json", Kind::kJsonSchema);
  take("guided_regex", Kind::kRegex);
  take("guided_choice", Kind::kChoice);
  take("guided_grammar", Kind::kGrammar);
  if (const ojson* v = field(body, "guided_json_object")) {
    if (!v->is_boolean()) bad("'guided_json_object' must be a boolean", "guided_json_object");
    if (v->get<bool>()) {
      StructuredOutputSpec s;
      s.field = "guided_json_object";
      found.push_back(std::move(s));
    }
  }
  if (const ojson* v = field(body, "guided_whitespace_pattern")) {
    const std::string pattern = string_value(*v, "guided_whitespace_pattern");
    bool applied = false;
    for (size_t i = before; i < found.size(); ++i)
      if (found[i].kind == Kind::kJsonSchema || found[i].kind == Kind::kJsonObject)
        found[i].whitespace_pattern = pattern, applied = true;
    if (!applied)
      bad("'guided_whitespace_pattern' applies to guided_json or guided_json_object, and neither was given",
          "guided_whitespace_pattern");
  }
  if (field(body, "structural_tag"))
    bad("'structural_tag' is not a request field; send it as response_format {\"type\": \"structural_tag\", "
        "\"structures\": [...], \"triggers\": [...]} or as structured_outputs.structural_tag",
        "structural_tag");
}

// The grammar of one tool's call in the parser's format.
std::string tool_call_rule(grammar::GrammarBuilder& b, const ojson& tool, const std::string& format, bool strict,
                           size_t index) {
  const std::string name = tool.at("name").get<std::string>();
  const ojson params = tool.contains("parameters") && tool["parameters"].is_object()
                           ? tool["parameters"]
                           : ojson{{"type", "object"}, {"properties", ojson::object()}};
  grammar::JsonOptions jo;
  jo.strict = strict;
  std::string body;
  if (format == "hermes" || format == "qwen3") {
    // <tool_call>{"name": NAME, "arguments": ARGS}</tool_call>, with the whitespace a model may put between
    // the parts (Qwen's template writes a newline inside the tags).
    auto lit = [&](std::string_view s) { return b.add_literal(s); };
    body = fmt::format(
        "{0} tool_ws {1} tool_ws {3} tool_ws {2} tool_ws {4} tool_ws {5} tool_ws {6} tool_ws {2} tool_ws "
        "{7} tool_ws {8} tool_ws {9}",
        lit("<tool_call>"), lit("{"), lit(":"), lit("\"name\""), lit(ojson(name).dump()), lit(","),
        lit("\"arguments\""), b.add_json_schema(params, jo), lit("}"), lit("</tool_call>"));
  } else {  // qwen3_coder / qwen3_xml: one <parameter=P> block per argument, strings raw, the rest JSON
    std::string seq = b.add_literal("<tool_call>\n<function=" + name + ">\n");
    std::vector<std::string> required;
    if (auto r = params.find("required"); r != params.end() && r->is_array())
      for (const auto& x : *r)
        if (x.is_string()) required.push_back(x.get<std::string>());
    if (auto props = params.find("properties"); props != params.end() && props->is_object()) {
      for (const auto& [pname, pschema] : props->items()) {
        std::string value;
        const bool is_string = pschema.is_object() && pschema.contains("type") && pschema["type"] == "string";
        if (is_string && pschema.contains("enum") && pschema["enum"].is_array()) {
          std::vector<std::string> values;
          for (const auto& e : pschema["enum"])
            if (e.is_string()) values.push_back(e.get<std::string>());
          value = b.add_choice(values);
        } else if (is_string) {
          value = b.add_regex("([^<]|<[^/])*");  // raw text up to </parameter>
        } else {
          grammar::JsonOptions compact = jo;
          compact.any_whitespace = false;
          value = b.add_json_schema(pschema, compact);
        }
        std::string one = fmt::format("{} {} {}", b.add_literal("<parameter=" + pname + ">\n"), value,
                                      b.add_literal("\n</parameter>\n"));
        const bool needed = std::find(required.begin(), required.end(), pname) != required.end();
        seq += needed ? " " + one : " (" + one + ")?";
      }
    }
    body = seq + " " + b.add_literal("</function>\n</tool_call>");
  }
  const std::string rule = fmt::format("tool_call_{}", index);
  b.add_ebnf(rule + " ::= " + body + "\n");
  return rule;
}

// Each structure's schema (errors name the structure), then the triggered tags over them.
std::string structural_tag_rule(grammar::GrammarBuilder& b, const StructuredOutputSpec& s,
                                const grammar::JsonOptions& jo) {
  std::vector<grammar::TriggeredTag> tags;
  for (size_t i = 0; i < s.structures.size(); ++i) {
    const ojson& st = s.structures[i];
    std::string content;
    try {
      content = b.add_json_schema(st["schema"], jo);
    } catch (const grammar::GrammarError& e) {
      throw grammar::GrammarError(fmt::format("structures[{}].schema: {}", i, e.what()));
    }
    tags.push_back({st["begin"].get<std::string>(), content, st["end"].get<std::string>()});
  }
  return b.add_triggered_tags(tags, s.triggers);
}

std::shared_ptr<const grammar::Grammar> build_grammar(const StructuredOutputSpec& s) {
  grammar::GrammarBuilder b;
  grammar::JsonOptions jo;
  jo.any_whitespace = s.any_whitespace;
  jo.whitespace_pattern = s.whitespace_pattern;
  jo.strict = s.strict;
  switch (s.kind) {
    case Kind::kJsonSchema:
      return b.build(b.add_json_schema(s.schema, jo));
    case Kind::kJsonObject:
      return b.build(b.add_any_json_object(jo));
    case Kind::kRegex:
      return b.build(b.add_regex(s.text));
    case Kind::kChoice:
      return b.build(b.add_choice(s.choices));
    case Kind::kGrammar: {
      if (s.text.find("::=") != std::string::npos)
        b.add_ebnf(s.text);
      else
        b.add_lark(s.text);
      // GBNF's and xgrammar's start rule is `root`; Lark's is `start`.
      return b.build(s.text.find("::=") != std::string::npos ? "root" : "start");
    }
    case Kind::kStructuralTag:
      if (!s.tag_format.is_null()) return b.build(b.add_structural_tag(s.tag_format, jo, s.field + ".format"));
      return b.build(structural_tag_rule(b, s, jo));
    case Kind::kToolCalls: {
      b.add_ebnf("tool_ws ::= [ \\t\\n]{0,4}\n");
      std::vector<std::string> calls;
      for (size_t i = 0; i < s.tools.size(); ++i) {
        const ojson& t = s.tools[i];
        calls.push_back(tool_call_rule(b, t, s.tool_format, t.value("strict", false), i));
      }
      std::string any = "tool_call_any ::= " + calls.front();
      for (size_t i = 1; i < calls.size(); ++i) any += " | " + calls[i];
      b.add_ebnf(any + "\n");
      b.add_ebnf(s.several_calls ? "tool_calls ::= tool_call_any (tool_ws tool_call_any)*\n"
                                 : "tool_calls ::= tool_call_any\n");
      return b.build("tool_calls");
    }
  }
  throw grammar::GrammarError("unknown structured output kind");
}

class GrammarConstraint : public TokenConstraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<const grammar::CompiledGrammar> g) : m_(std::move(g)) {}
  // (The compiler's vocabulary is the model's logits width: the engine's mask has mask_words() words.)
  void fill_mask(std::span<uint32_t> mask) override { m_.fill_next_token_bitmask(mask); }
  bool accept(int32_t token) override { return m_.accept_token(token); }
  bool is_finished() const override { return m_.is_terminated(); }
  void rollback(int num_tokens) override { m_.rollback(num_tokens); }

 private:
  grammar::Matcher m_;
};

class GrammarConstraintFactory : public TokenConstraintFactory {
 public:
  GrammarConstraintFactory(std::shared_ptr<const grammar::CompiledGrammar> g, std::string what)
      : g_(std::move(g)), what_(std::move(what)) {}
  std::unique_ptr<TokenConstraint> make() const override { return std::make_unique<GrammarConstraint>(g_); }
  std::string describe() const override { return what_; }

 private:
  std::shared_ptr<const grammar::CompiledGrammar> g_;
  std::string what_;
};

}  // namespace

std::string StructuredOutputSpec::key() const {
  ojson k = {{"kind", kind_name(kind)},  {"schema", schema},         {"text", text},
             {"choices", choices},       {"ws", any_whitespace},     {"wsp", whitespace_pattern},
             {"strict", strict},         {"tools", tools},           {"format", tool_format},
             {"several", several_calls}, {"structures", structures}, {"triggers", triggers},
             {"tag_format", tag_format}};
  return k.dump();
}

std::optional<StructuredOutputSpec> read_structured_output(const ojson& body) {
  std::vector<StructuredOutputSpec> found;
  if (const ojson* rf = field(body, "response_format")) read_response_format(*rf, found);
  if (const ojson* so = field(body, "structured_outputs")) read_structured_outputs(*so, found);
  read_guided(body, found);
  if (found.empty()) return std::nullopt;
  if (found.size() > 1)
    bad(fmt::format("'{}' and '{}' both constrain the output; send one of them", found[0].field, found[1].field),
        found[1].field);
  return std::move(found.front());
}

std::optional<StructuredOutputSpec> tool_call_structure(const ojson& body, const ToolChoicePlan& plan,
                                                        const std::string& tool_call_parser) {
  if (!plan.parse_tools) return std::nullopt;
  const ojson* choice = field(body, "tool_choice");
  const bool required = choice && choice->is_string() && *choice == "required";
  if (!required && plan.only_function.empty()) return std::nullopt;
  StructuredOutputSpec s;
  s.kind = Kind::kToolCalls;
  s.field = "tool_choice";
  s.tool_format = tool_call_parser;
  // parallel_tool_calls false (Anthropic: disable_parallel_tool_use): exactly one call.
  const ojson* parallel = field(body, "parallel_tool_calls");
  if (parallel && !parallel->is_boolean()) bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls");
  s.several_calls = plan.only_function.empty() && !(parallel && !parallel->get<bool>());
  if (const ojson* tools = field(body, "tools"))
    for (const auto& t : *tools) {
      const ojson& f = t.at("function");
      const std::string name = f.at("name").get<std::string>();
      if (!plan.only_function.empty() && name != plan.only_function) continue;
      ojson tool = {{"name", name}};
      if (auto p = f.find("parameters"); p != f.end() && p->is_object()) tool["parameters"] = *p;
      if (auto st = f.find("strict"); st != f.end() && st->is_boolean()) tool["strict"] = *st;
      s.tools.push_back(std::move(tool));
    }
  if (s.tools.empty()) return std::nullopt;
  return s;
}

StructuredOutputCompiler::StructuredOutputCompiler(const tokenizer::Tokenizer& tok, int model_vocab,
                                                   std::vector<int32_t> stop_ids, size_t cache_entries)
    : cache_entries_(std::max<size_t>(cache_entries, 1)) {
  auto info = std::make_shared<grammar::TokenizerInfo>();
  const int32_t n = static_cast<int32_t>(std::min<size_t>(tok.vocab_size(), static_cast<size_t>(model_vocab)));
  info->token_bytes.resize(static_cast<size_t>(n));
  info->special.resize(static_cast<size_t>(n));
  for (int32_t id = 0; id < n; ++id) {
    tok.append_token_bytes(id, false, info->token_bytes[static_cast<size_t>(id)]);
    info->special[static_cast<size_t>(id)] = tok.is_special(id);
  }
  info->stop_ids = std::move(stop_ids);
  info->vocab_size = model_vocab;
  info_ = std::move(info);
}

StructuredOutputCompiler::~StructuredOutputCompiler() = default;

std::shared_ptr<const TokenConstraintFactory> StructuredOutputCompiler::compile(const StructuredOutputSpec& spec) {
  const std::string key = spec.key();
  const std::string what = fmt::format("{} from '{}'", kind_name(spec.kind), spec.field);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      it->second.used = ++clock_;
      return std::make_shared<GrammarConstraintFactory>(it->second.grammar, what);
    }
  }
  std::shared_ptr<const grammar::CompiledGrammar> compiled;
  try {
    compiled = grammar::compile(build_grammar(spec), info_);
  } catch (const grammar::GrammarError& e) {
    bad(fmt::format("'{}': {}", spec.field, e.what()), spec.field);
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (cache_.size() >= cache_entries_) {
    auto oldest = std::min_element(cache_.begin(), cache_.end(),
                                   [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
    cache_.erase(oldest);
  }
  cache_[key] = Entry{compiled, ++clock_};
  return std::make_shared<GrammarConstraintFactory>(std::move(compiled), what);
}

}  // namespace tessera::server
