// The byte-level grammar IR every front end lowers to: named rules whose bodies are expressions over
// byte strings, Unicode character classes (matched as UTF-8), rule references, sequences, alternations,
// bounded or unbounded repetition and tag dispatch (free text in which triggers start structures).
// Expressions live in one arena and are referred to by index.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "grammar/grammar.h"

namespace tessera::grammar {

using CodepointRanges = std::vector<std::pair<uint32_t, uint32_t>>;  // inclusive, sorted, disjoint

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr int kUnbounded = -1;

enum class ExprKind { kEmpty, kBytes, kClass, kRuleRef, kSequence, kChoice, kRepeat, kTagDispatch };

struct Expr {
  ExprKind kind = ExprKind::kEmpty;
  std::string bytes;       // kBytes
  CodepointRanges ranges;  // kClass: one UTF-8 encoded codepoint in these ranges
  int rule = -1;           // kRuleRef
  std::vector<int> items;  // kSequence, kChoice; kRepeat: the one repeated expression; kTagDispatch: below
  int min = 0, max = 0;    // kRepeat: max kUnbounded for no bound
  // kTagDispatch: UTF-8 text in which the first occurrence of any trigger (strings[i]) continues with
  // items[i], after which free text starts again (`loop`) or the dispatch ends. Without `stops` it may end
  // anywhere in free text (not inside items[i]); with them it ends only where the first stop string occurs
  // (the stop string included), and without `loop` one of them must follow the first items[i].
  std::vector<std::string> strings;
  std::vector<std::string> stops;
  bool loop = true;
};

// Rules and their expressions. Rules are created by name (a reference before the definition creates an
// undefined rule, which build() reports).
class RuleSet {
 public:
  int bytes(std::string_view text);
  int char_class(CodepointRanges ranges);  // normalises (sorts, merges, drops surrogates)
  int ref(int rule);
  int sequence(std::vector<int> items);
  int choice(std::vector<int> items);
  int repeat(int item, int min, int max);
  // Free text with triggers: see ExprKind::kTagDispatch. triggers and continuations have the same size;
  // triggers and stops are non-empty strings.
  int tag_dispatch(std::vector<std::string> triggers, std::vector<int> continuations,
                   std::vector<std::string> stops = {}, bool loop = true);
  int empty();

  int rule_id(const std::string& name);        // finds or declares
  int new_rule(const std::string& name_hint);  // a fresh, unused name from the hint
  void define(int rule, int body);
  bool defined(int rule) const { return rules_[rule].body >= 0; }
  const std::string& rule_name(int rule) const { return rules_[rule].name; }
  int find_rule(const std::string& name) const;

  struct Rule {
    std::string name;
    int body = -1;
  };
  const std::vector<Rule>& rules() const { return rules_; }
  const std::vector<Expr>& exprs() const { return exprs_; }
  const Expr& expr(int id) const { return exprs_[id]; }

 private:
  int add(Expr e);
  std::vector<Expr> exprs_;
  std::vector<Rule> rules_;
  std::unordered_map<std::string, int> by_name_;
};

struct Fsm;

// What an immutable Grammar holds: the rules, the start rule and their automata.
class Grammar {
 public:
  RuleSet rules;
  int root = -1;
  CompileLimits limits;
  std::shared_ptr<const Fsm> fsm;
};

// Compile-work guard shared by the front ends: nesting depth and elapsed time.
class Budget {
 public:
  explicit Budget(const CompileLimits& limits)
      : limits_(limits), deadline_(std::chrono::steady_clock::now() + limits.max_compile_time) {}
  const CompileLimits& limits() const { return limits_; }
  // Throws GrammarError when `depth` exceeds the nesting limit; `what` names the construct.
  void check_depth(int depth, std::string_view what) const;
  // Throws GrammarError once the time limit has passed (checked every few calls).
  void check_time(std::string_view what);

 private:
  CompileLimits limits_;
  std::chrono::steady_clock::time_point deadline_;
  unsigned calls_ = 0;
};

// UTF-8 helpers.
// Decodes one codepoint at text[pos], advancing pos; invalid bytes decode as themselves (Latin-1).
uint32_t decode_utf8(std::string_view text, size_t& pos);
void append_utf8(uint32_t cp, std::string& out);
CodepointRanges normalize_ranges(CodepointRanges ranges);
CodepointRanges complement_ranges(const CodepointRanges& ranges);
// "line L column C" of byte `pos` of a grammar text (1-based), for error messages.
std::string text_position(std::string_view text, size_t pos);
// The character of a one-letter control escape shared by the grammar and regex syntaxes (\n \t \r \f \v \0);
// -1 for any other letter.
inline int32_t control_escape(char c) {
  switch (c) {
    case 'n':
      return '\n';
    case 't':
      return '\t';
    case 'r':
      return '\r';
    case 'f':
      return '\f';
    case 'v':
      return '\v';
    case '0':
      return 0;
    default:
      return -1;
  }
}
// Sequences of per-byte ranges whose union encodes exactly the codepoints in [lo, hi] (no surrogates).
using ByteRangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>& out);

// Lowers a regular expression (ECMAScript-like) into `rules`, returning the expression. With
// `json_string_body`, characters that JSON strings must escape (", \, controls) match their escaped form.
int lower_regex(std::string_view pattern, RuleSet& rules, Budget& budget, bool json_string_body = false);

// Front ends adding rules to `rules` (named in the text; references to other rules by name).
void parse_ebnf(std::string_view text, RuleSet& rules, Budget& budget);
void parse_lark(std::string_view text, RuleSet& rules, Budget& budget);

// JSON Schema: returns the rule matching documents valid against `schema` (ordered JSON keeps property
// order). `prefix` makes the generated rule names unique.
int lower_json_schema(const nlohmann::ordered_json& schema, const JsonOptions& options, RuleSet& rules, Budget& budget,
                      const std::string& prefix);
int lower_any_json_object(const JsonOptions& options, RuleSet& rules, Budget& budget, const std::string& prefix);

// xgrammar's structural tag format (structural_tag.cpp): returns the expression matching `format`; errors name
// `path`. check_only validates the shape without lowering schemas, grammars and regular expressions.
int lower_structural_tag(const nlohmann::ordered_json& format, const JsonOptions& options, RuleSet& rules,
                         Budget& budget, const std::string& path, bool check_only);

}  // namespace tessera::grammar
