// Structured output: grammars (GBNF/EBNF, a Lark subset, regular expressions, JSON Schema, literal choices)
// compiled against a tokenizer's vocabulary, and per-sequence matchers that give the next token's mask.
// Knows nothing of HTTP, the engine or any backend: the server builds grammars from request fields, the
// engine sees a matcher through its TokenConstraint seam (engine/token_constraint.h).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tessera::grammar {

// A grammar, schema, regex or choice that cannot be compiled (unsupported keyword, syntax error, limits).
// what() names the construct at fault and, where it has one, its position; the server answers 400 with it.
class GrammarError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bounds on compile work and size: a pathological schema, regex or grammar fails with GrammarError
// instead of taking unbounded time or memory.
struct CompileLimits {
  size_t max_rules = 20000;            // rules after lowering (enums, nested schemas, regex alternations)
  size_t max_grammar_bytes = 1 << 20;  // input text (schema JSON, regex, grammar)
  int max_nesting = 64;                // schema / regex / grammar nesting depth
  size_t max_enum_values = 10000;
  std::chrono::milliseconds max_compile_time{2000};
  size_t max_states = 200000;  // automaton states after lowering (bounded repetitions, regex expansion)
  // compile(): token tables are built eagerly (nearest the start first) for at most this long; the rest
  // are built the first time a matcher reaches their position.
  std::chrono::milliseconds eager_table_time{30};
};

// JSON Schema options (vLLM/xgrammar's meaning).
struct JsonOptions {
  bool any_whitespace = true;  // false: the compact form (", " and ": " only, as json.dumps); guided_whitespace_pattern
  std::string whitespace_pattern;  // non-empty: the regex whitespace between tokens must match
  bool strict = false;             // true: additionalProperties defaults to false (OpenAI strict mode)
  int max_whitespace = 20;         // any_whitespace: at most this many whitespace bytes between two tokens
};

// The vocabulary as the matcher sees it: each token id's bytes (after the tokenizer's decoder; special and
// added control tokens marked special never match grammar text), the ids that end a sequence (EOS and
// stop ids: allowed exactly when the grammar can end), and the model's vocabulary size (the logits' width,
// which may exceed the tokenizer's: ids past it are never allowed).
struct TokenizerInfo {
  std::vector<std::string> token_bytes;
  std::vector<bool> special;  // same size as token_bytes
  std::vector<int32_t> stop_ids;
  int32_t vocab_size = 0;
};

// One tag of add_triggered_tags: `begin`, then the rule named `content`, then `end`.
struct TriggeredTag {
  std::string begin;
  std::string content;
  std::string end;
};

class Grammar;          // an immutable byte-level grammar (rules lowered from any of the front ends)
class CompiledGrammar;  // a Grammar bound to a TokenizerInfo, with its precomputed token tables

// Builds one grammar from parts: EBNF rules may reference rules added from a schema, a regex or a choice
// (by the name each add_* returns), so a tool call can be "literal prefix, arguments schema, literal suffix".
class GrammarBuilder {
 public:
  explicit GrammarBuilder(CompileLimits limits = {});
  ~GrammarBuilder();
  GrammarBuilder(GrammarBuilder&&) noexcept;
  GrammarBuilder& operator=(GrammarBuilder&&) noexcept;

  // GBNF (llama.cpp) / EBNF (xgrammar, W3C style) rules: `name ::= ...`, "literals", [char classes], ( ),
  // | * + ? {m,n}, comments. Returns nothing: its rules are referenced by name.
  void add_ebnf(std::string_view text);
  // A Lark subset (rule: alt | alt, "literal", /regex/, ?optional, */+, %ignore is an error).
  void add_lark(std::string_view text);
  // Each returns the name of a new rule that matches exactly the described strings.
  // The schema is an ordered_json so that properties keep the order the client wrote (the order the
  // output must follow).
  std::string add_json_schema(const nlohmann::ordered_json& schema, const JsonOptions& options = {});
  // The same from JSON text (parsed in order); malformed JSON is a GrammarError.
  std::string add_json_schema_text(std::string_view schema_json, const JsonOptions& options = {});
  std::string add_any_json_object(const JsonOptions& options = {});  // json_object mode: any JSON object
  std::string add_regex(std::string_view pattern);                   // ECMAScript-like syntax, whole match
  std::string add_choice(const std::vector<std::string>& choices);   // one of the literal strings
  std::string add_literal(std::string_view text);
  // Structural tags (xgrammar's triggered tags): free UTF-8 text in which each occurrence of a trigger starts
  // one of the tags whose `begin` starts with that trigger (the rest of `begin`, the content rule, `end`),
  // after which free text continues; the text may end anywhere outside a tag. Triggers must be non-empty,
  // every tag's `begin` must start with a trigger and every trigger must start some tag's `begin`.
  std::string add_triggered_tags(const std::vector<TriggeredTag>& tags, const std::vector<std::string>& triggers);
  // xgrammar's structural tag: `format` is its "format" object (const_string, json_schema, grammar, regex,
  // any_text, sequence, or, tag, triggered_tags, tags_with_separator, qwen_xml_parameter, nested). JSON Schemas
  // follow `options`. Errors name the offending member from `path` ("format.tags[1].content.type").
  std::string add_structural_tag(const nlohmann::ordered_json& format, const JsonOptions& options = {},
                                 const std::string& path = "format");

  // The finished grammar whose start rule is `root`. Throws GrammarError (an undefined or unreachable-only
  // rule, limits).
  std::shared_ptr<const Grammar> build(std::string_view root);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Checks a structural tag format's shape (types, fields, where unlimited formats may stand) without compiling
// its schemas, grammars and regular expressions; GrammarError as add_structural_tag's.
void check_structural_tag(const nlohmann::ordered_json& format, const std::string& path = "format");

// Binds a grammar to a vocabulary (precomputes what each token can do from each grammar position that does
// not depend on the stack). Thread-safe to share; matchers hold it.
std::shared_ptr<const CompiledGrammar> compile(std::shared_ptr<const Grammar> grammar,
                                               std::shared_ptr<const TokenizerInfo> tokenizer,
                                               const CompileLimits& limits = {});

// One sequence's position in a compiled grammar. Not thread-safe; one per sequence.
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~Matcher();
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;

  // Words in a next-token bitmask of this grammar's vocabulary: ceil(vocab_size / 32).
  size_t mask_words() const;
  // Bit t of mask (word t / 32, bit t % 32) set = token t may come next. Stop ids are allowed exactly when
  // the grammar can end here. Every word is written.
  void fill_next_token_bitmask(std::span<uint32_t> mask) const;
  // Advances by one token. False (state unchanged) when the grammar does not allow it. A stop id is
  // accepted only where the grammar can end, and then the matcher is terminated.
  bool accept_token(int32_t id);
  // Advances by raw bytes (tests, forced prefixes). False (state unchanged) when not allowed.
  bool accept_bytes(std::string_view bytes);
  // The bytes so far form a complete sentence of the grammar (a stop id would be accepted).
  bool can_terminate() const;
  // A stop id was accepted, or no token but a stop id can follow.
  bool is_terminated() const;
  // Undoes the last n accepted tokens (speculative decoding: drafts the target rejected).
  void rollback(int num_tokens);
  // Clears to the start state.
  void reset();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::grammar
