// Structured output at the API: reads what a request asks its output to match (OpenAI response_format,
// vLLM's structured_outputs and guided_* fields, a required or named tool_choice in the tool-call parser's
// format), compiles it with the grammar library against the tokenizer's vocabulary (a cache keeps each
// compiled grammar), and hands the engine a TokenConstraintFactory. Errors are 400s naming the field.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/token_constraint.h"
#include "server/api_common.h"
#include "server/parsers/tool_parser.h"

namespace tessera::tokenizer {
class Tokenizer;
}

namespace tessera::grammar {
struct TokenizerInfo;
class CompiledGrammar;
}  // namespace tessera::grammar

namespace tessera::server {

using api::ojson;

// What one request asks its output to match, before compiling.
struct StructuredOutputSpec {
  enum class Kind { kJsonSchema, kJsonObject, kRegex, kChoice, kGrammar, kToolCalls, kStructuralTag };
  Kind kind = Kind::kJsonObject;
  std::string field;  // the request field it came from ("response_format", "structured_outputs.regex", ...)
  ojson schema;       // kJsonSchema
  std::string text;   // kRegex, kGrammar (EBNF/GBNF when it has "::=", else Lark)
  std::vector<std::string> choices;
  bool any_whitespace = true;
  std::string whitespace_pattern;
  bool strict = false;  // additionalProperties false unless the schema says otherwise
  // kToolCalls: the tools a call may name ({"name", "parameters"} each), the parser's format, and
  // whether several calls may follow one another ("required") or exactly one ("named").
  ojson tools = ojson::array();
  std::string tool_format;
  bool several_calls = true;
  // kStructuralTag: free text in which each trigger starts one of the structures ({"begin", "schema",
  // "end"} each) whose begin starts with it.
  ojson structures = ojson::array();
  std::vector<std::string> triggers;
  // kStructuralTag in xgrammar's format form (any format but the triggered tags above): the "format" object.
  ojson tag_format;

  // The cache key: everything above, serialized.
  std::string key() const;
};

// The structured-output fields of a chat or completion request: response_format (json_object,
// json_schema; "text" is none), structured_outputs, guided_json / guided_regex / guided_choice /
// guided_grammar (+ guided_whitespace_pattern); response_format or structured_outputs structural_tag
// (vLLM's {"structures", "triggers"}, or xgrammar's {"format": ...} with any of its format types).
// More than one of them is a 400 naming both. None given: nullopt.
std::optional<StructuredOutputSpec> read_structured_output(const ojson& body);

// The constraint a required or named tool_choice puts on the output: calls in the --tool-call-parser's
// format (hermes, qwen3_coder) to the request's tools, their arguments matching each tool's parameters.
// nullopt when the plan needs none (auto, none).
std::optional<StructuredOutputSpec> tool_call_structure(const ojson& body, const ToolChoicePlan& plan,
                                                        const std::string& tool_call_parser);

// Compiles specs against one tokenizer (thread-safe; compiled grammars are cached by spec).
class StructuredOutputCompiler {
 public:
  // model_vocab: the logits' width; stop_ids: the tokens that end a sequence (EOS, generation_config's).
  StructuredOutputCompiler(const tokenizer::Tokenizer& tok, int model_vocab, std::vector<int32_t> stop_ids,
                           size_t cache_entries = 256);
  ~StructuredOutputCompiler();
  // A 400 (ApiError naming spec.field) when the spec cannot be compiled.
  std::shared_ptr<const TokenConstraintFactory> compile(const StructuredOutputSpec& spec);

 private:
  std::shared_ptr<const grammar::TokenizerInfo> info_;
  std::mutex mu_;
  size_t cache_entries_;
  uint64_t clock_ = 0;
  struct Entry {
    std::shared_ptr<const grammar::CompiledGrammar> grammar;
    uint64_t used = 0;
  };
  std::unordered_map<std::string, Entry> cache_;
};

}  // namespace tessera::server
