// Reading one API request (server-internal): the JSON body, the sampling fields, the prompt (rendered chat or
// completions' prompts), tools and structured output, into a PreparedRequest ready for the engine. Every
// refusal is an ApiError (a 400 naming the field); nothing here touches a connection or the engine's queue
// (the generation bookkeeping is api_server.cpp's).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/async_engine.h"
#include "engine/sampling_params.h"
#include "server/api_common.h"
#include "server/api_server.h"
#include "server/http_types.h"
#include "server/parsers/tool_parser.h"
#include "server/structured_output.h"

namespace tessera::tokenizer {
class Tokenizer;
class ChatTemplate;
}  // namespace tessera::tokenizer

namespace tessera::server::api {

// A request read and ready to generate: token ids per prompt, the sampling parameters, and how max_tokens is
// settled once each prompt's length is known.
struct PreparedRequest {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;
  SamplingParams params;
  bool max_tokens_given = false;
  int default_max_tokens = -1;  // -1: max_model_len - prompt
  // Anthropic Messages and Responses: a max_tokens above the room left in the context (Claude Code asks for
  // 32000) is lowered to that room and to the generation config's max_new_tokens, as vLLM's get_max_tokens
  // does, instead of refused.
  bool clamp_max_tokens = false;
  // The body field that holds the prompt (the error `param` when the engine refuses the prompt).
  std::string prompt_param = "messages";
  // vLLM's truncate_prompt_tokens: only the last k tokens of each prompt are kept. 0: all.
  int truncate_prompt_tokens = 0;
  std::string structured_field;  // the field a constraint came from, when there is one
  ToolChoicePlan tools;          // chat: what tool_choice asks of the output
  bool echo = false;             // completions: the prompt comes back before the output
};

// Fields of vLLM's or OpenAI's requests that change what is generated and that this server does not act on:
// a 400 naming each ("'<name>': <why>"), never a silent 200 with other output than asked. A value that asks
// for nothing (false, an empty list) is accepted.
struct RefusedField {
  const char* name;
  const char* why;
};
extern const RefusedField kRefusedFields[6];

class RequestReader {
 public:
  RequestReader(const ApiOptions& opt, EngineClient& engine, const tokenizer::Tokenizer& tok,
                const tokenizer::ChatTemplate* tmpl);
  ~RequestReader();

  // The body as a JSON object (bounded nesting), else a 400 saying what is wrong with it.
  static ojson parse_body(const HttpRequest& r);
  // A 404 when `model` is given and is not one of the served names.
  void check_model(const ojson& body) const;

  // An OpenAI chat request (also Anthropic Messages and Responses, translated): tools, sampling fields,
  // structured output or a tool-call grammar, the rendered and tokenised prompt.
  PreparedRequest read_chat(const ojson& body, bool clamp_max_tokens);
  // A /v1/completions request: sampling fields, `echo` and the prompt(s) (text or token ids; their text kept
  // when echo needs it).
  PreparedRequest read_completions(const ojson& body);
  // The chat template's prompt for a body with `messages` (also /tokenize and count_tokens).
  std::string render_chat(const ojson& body) const;

 private:
  SamplingParams base_params() const;
  void read_params(const ojson& body, PreparedRequest& pr);
  std::vector<std::vector<int32_t>> bad_words_ids(const ojson& words) const;
  void check_tools(const ojson& body, ToolChoicePlan* plan) const;
  std::shared_ptr<const TokenConstraintFactory> compile_constraint(const StructuredOutputSpec& spec);

  const ApiOptions& opt_;
  EngineClient& engine_;
  const tokenizer::Tokenizer& tok_;
  const tokenizer::ChatTemplate* tmpl_;
  // Structured output: compiled against the vocabulary on first use (the vocabulary's bytes take a moment).
  std::once_flag structured_once_;
  std::unique_ptr<StructuredOutputCompiler> structured_;
};

}  // namespace tessera::server::api
