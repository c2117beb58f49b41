// JSON Schema lowering (internal): one SchemaLowering per add_json_schema call. The keyword dispatch and
// objects/arrays live in json_schema.cpp, leaf values (strings, numbers, constants, whitespace, the shared
// any-value rules) in json_values.cpp.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>

#include "grammar/ir.h"

namespace tessera::grammar {

using ojson = nlohmann::ordered_json;

class SchemaLowering {
 public:
  SchemaLowering(const ojson& root, const JsonOptions& options, RuleSet& rules, Budget& budget, std::string prefix);

  int lower_root();       // the rule for the whole schema
  int any_object_rule();  // any JSON object

 private:
  friend struct SchemaLoweringTest;
  [[noreturn]] void fail(const std::string& pointer, const std::string& what) const;

  // json_schema.cpp
  int value(const ojson& schema, const std::string& pointer, int depth);
  int typed_value(const ojson& schema, const std::string& type, const std::string& pointer, int depth);
  int ref_rule(const std::string& ref, const std::string& pointer, int depth);
  int object_value(const ojson& schema, const std::string& pointer, int depth);
  int array_value(const ojson& schema, const std::string& pointer, int depth);
  int rule_for(const std::string& pointer, const std::string& hint, int body);
  void check_keywords(const ojson& schema, const std::string& pointer) const;

  // json_values.cpp
  int ws();               // whitespace between tokens (empty in the compact form)
  int separator(char c);  // ws c ws, or ", " / ": " in the compact form
  int open(char c);       // c ws
  int close(char c);      // ws c
  int string_value(const ojson& schema, const std::string& pointer);
  int integer_value(const ojson& schema, const std::string& pointer);
  int number_value(const ojson& schema, const std::string& pointer);
  int constant(const ojson& value, int depth);  // exactly this JSON value (whitespace per the options)
  int string_rule();                            // any JSON string (shared)
  int string_rest_rule();                       // the rest of a JSON string after its first character (shared)
  int key_excluding(const std::vector<std::string>& names);  // any key but these
  int integer_rule();                                        // any JSON integer (shared)
  int number_rule();                                         // any JSON number (shared)
  int any_value_rule();
  int any_array_rule();
  int int_range(std::optional<int64_t> lo, std::optional<int64_t> hi);  // exact
  int nonneg_range(uint64_t lo, uint64_t hi);
  int nonneg_at_least(uint64_t lo);
  int same_length_range(const std::string& lo, const std::string& hi);
  int digits(int min, int max);

  const ojson& root_;
  JsonOptions options_;
  RuleSet& rules_;
  Budget& budget_;
  std::string prefix_;
  std::unordered_map<std::string, int> ref_rules_;  // JSON pointer -> rule
  int string_rule_ = -1, string_rest_rule_ = -1, integer_rule_ = -1, number_rule_ = -1, any_value_rule_ = -1,
      any_object_rule_ = -1, any_array_rule_ = -1;
  int ws_expr_ = -1;
};

}  // namespace tessera::grammar
