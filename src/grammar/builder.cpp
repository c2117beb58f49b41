// GrammarBuilder: collects rules from the front ends into one RuleSet.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "grammar/fsm.h"
#include "grammar/ir.h"

namespace tessera::grammar {

struct GrammarBuilder::Impl {
  explicit Impl(CompileLimits l) : limits(l), budget(l) {}
  CompileLimits limits;
  Budget budget;
  RuleSet rules;
  int counter = 0;

  std::string next_prefix(const char* kind) { return fmt::format("{}_{}", kind, ++counter); }
  std::string rule_with_body(const char* kind, int body) {
    const int rule = rules.new_rule(next_prefix(kind));
    rules.define(rule, body);
    return rules.rule_name(rule);
  }
};

GrammarBuilder::GrammarBuilder(CompileLimits limits) : impl_(std::make_unique<Impl>(limits)) {}
GrammarBuilder::~GrammarBuilder() = default;
GrammarBuilder::GrammarBuilder(GrammarBuilder&&) noexcept = default;
GrammarBuilder& GrammarBuilder::operator=(GrammarBuilder&&) noexcept = default;

void GrammarBuilder::add_ebnf(std::string_view text) { parse_ebnf(text, impl_->rules, impl_->budget); }

void GrammarBuilder::add_lark(std::string_view text) { parse_lark(text, impl_->rules, impl_->budget); }

std::string GrammarBuilder::add_json_schema(const nlohmann::ordered_json& schema, const JsonOptions& options) {
  const int rule = lower_json_schema(schema, options, impl_->rules, impl_->budget, impl_->next_prefix("json"));
  return impl_->rules.rule_name(rule);
}

std::string GrammarBuilder::add_json_schema_text(std::string_view schema_json, const JsonOptions& options) {
  if (schema_json.size() > impl_->limits.max_grammar_bytes) {
    throw GrammarError(fmt::format("JSON Schema is {} bytes, more than the limit of {}", schema_json.size(),
                                   impl_->limits.max_grammar_bytes));
  }
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(schema_json);
  } catch (const nlohmann::json::exception& e) {
    std::string message = e.what();
    if (const auto pos = message.find("] "); pos != std::string::npos) message = message.substr(pos + 2);
    throw GrammarError("JSON Schema is not valid JSON: " + message);
  }
  return add_json_schema(schema, options);
}

std::string GrammarBuilder::add_any_json_object(const JsonOptions& options) {
  const int rule = lower_any_json_object(options, impl_->rules, impl_->budget, impl_->next_prefix("json_object"));
  return impl_->rules.rule_name(rule);
}

std::string GrammarBuilder::add_regex(std::string_view pattern) {
  return impl_->rule_with_body("regex", lower_regex(pattern, impl_->rules, impl_->budget));
}

std::string GrammarBuilder::add_choice(const std::vector<std::string>& choices) {
  if (choices.empty()) throw GrammarError("choice: no choices given");
  if (choices.size() > impl_->limits.max_enum_values) {
    throw GrammarError(
        fmt::format("choice has {} values, more than the limit of {}", choices.size(), impl_->limits.max_enum_values));
  }
  std::vector<int> alts;
  for (const auto& c : choices) alts.push_back(impl_->rules.bytes(c));
  return impl_->rule_with_body("choice", impl_->rules.choice(std::move(alts)));
}

std::string GrammarBuilder::add_literal(std::string_view text) {
  return impl_->rule_with_body("literal", impl_->rules.bytes(text));
}

std::string GrammarBuilder::add_triggered_tags(const std::vector<TriggeredTag>& tags,
                                               const std::vector<std::string>& triggers) {
  RuleSet& rules = impl_->rules;
  if (triggers.empty()) throw GrammarError("structural tag: 'triggers' is empty; give at least one trigger string");
  if (triggers.size() > impl_->limits.max_enum_values || tags.size() > impl_->limits.max_enum_values) {
    throw GrammarError(fmt::format("structural tag has {} triggers and {} tags, more than the limit of {}",
                                   triggers.size(), tags.size(), impl_->limits.max_enum_values));
  }
  std::vector<std::vector<int>> alternatives(triggers.size());
  for (size_t t = 0; t < triggers.size(); ++t)
    if (triggers[t].empty()) throw GrammarError(fmt::format("structural tag: trigger {} is an empty string", t));
  for (size_t i = 0; i < tags.size(); ++i) {
    const TriggeredTag& tag = tags[i];
    const int content = rules.find_rule(tag.content);
    if (content < 0) throw GrammarError(fmt::format("structural tag {}: rule '{}' is not defined", i, tag.content));
    bool started = false;
    for (size_t t = 0; t < triggers.size(); ++t) {
      if (!tag.begin.starts_with(triggers[t])) continue;
      started = true;
      alternatives[t].push_back(rules.sequence({rules.bytes(std::string_view(tag.begin).substr(triggers[t].size())),
                                                rules.ref(content), rules.bytes(tag.end)}));
    }
    if (!started) {
      throw GrammarError(
          fmt::format("structural tag {}: begin '{}' starts with none of the triggers; make each "
                      "begin start with a trigger",
                      i, tag.begin));
    }
  }
  std::vector<int> continuations;
  for (size_t t = 0; t < triggers.size(); ++t) {
    if (alternatives[t].empty()) {
      throw GrammarError(
          fmt::format("structural tag: trigger '{}' starts no tag's begin; remove it or add a tag "
                      "whose begin starts with it",
                      triggers[t]));
    }
    continuations.push_back(rules.choice(std::move(alternatives[t])));
  }
  return impl_->rule_with_body("triggered_tags", rules.tag_dispatch(triggers, std::move(continuations)));
}

std::string GrammarBuilder::add_structural_tag(const nlohmann::ordered_json& format, const JsonOptions& options,
                                               const std::string& path) {
  const int body = lower_structural_tag(format, options, impl_->rules, impl_->budget, path, false);
  return impl_->rule_with_body("structural_tag", body);
}

void check_structural_tag(const nlohmann::ordered_json& format, const std::string& path) {
  CompileLimits limits;
  Budget budget(limits);
  RuleSet rules;
  lower_structural_tag(format, JsonOptions{}, rules, budget, path, true);
}

std::shared_ptr<const Grammar> GrammarBuilder::build(std::string_view root) {
  const int rule = impl_->rules.find_rule(std::string(root));
  if (rule < 0) throw GrammarError(fmt::format("root rule '{}' is not defined", root));
  for (size_t r = 0; r < impl_->rules.rules().size(); ++r) {
    if (!impl_->rules.defined(static_cast<int>(r))) {
      throw GrammarError(
          fmt::format("rule '{}' is referenced but not defined", impl_->rules.rule_name(static_cast<int>(r))));
    }
  }
  if (impl_->rules.rules().size() > impl_->limits.max_rules) {
    throw GrammarError(fmt::format("grammar has {} rules, more than the limit of {}", impl_->rules.rules().size(),
                                   impl_->limits.max_rules));
  }
  auto grammar = std::make_shared<Grammar>();
  grammar->rules = impl_->rules;
  grammar->root = rule;
  grammar->limits = impl_->limits;
  // Lower to automata now so that every grammar error surfaces here, not at compile().
  Budget budget(impl_->limits);
  grammar->fsm = std::make_shared<const Fsm>(build_fsm(*grammar, budget));
  return grammar;
}

}  // namespace tessera::grammar
