// The bookkeeping one generation request shares across protocols (server-internal): its choices as they
// stream in from the engine, the reasoning / tool-call parsers per choice, and the ProtocolWriter that turns
// them into one API's stream events and response body (OpenAI chat, OpenAI completions, Anthropic
// Messages, Responses; see protocol_writers.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/async_engine.h"
#include "server/api_common.h"
#include "server/http_types.h"
#include "server/parsers/chat_output_parser.h"

namespace tessera::tokenizer {
class Tokenizer;
}

namespace tessera::server::api {

// One choice (one sequence) of a generation request.
struct Choice {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;
  std::vector<TokenLogprob> prompt_logprobs;  // when the engine scored the prompt (from its second token on)
  bool echoed = false;                        // streamed completions with echo + logprobs: the prompt went out
  std::string finish_reason;
  ojson stop_reason = nullptr;
  std::string stop_string;
  std::string error;
  bool done = false;
};

class ProtocolWriter;

// One generation request (one or several engine requests), owned by the engine callbacks and the strand.
struct Gen {
  std::shared_ptr<Exchange> ex;
  std::unique_ptr<ProtocolWriter> writer;
  bool stream = false, include_usage = false, continuous_usage = false, echo = false;
  std::string id, model;
  int64_t created = 0;
  int n = 1;
  int logprobs = -1;
  // What the client gets back as vLLM's prompt_logprobs (-1: no such field): its prompt_logprobs, or
  // /v1/completions' logprobs with echo. The engine may score the prompt for echo alone (max_tokens 0).
  int prompt_logprobs = -1;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> engine_ids;
  std::vector<int> prompt_tokens;
  std::vector<std::string> prompt_texts;
  std::vector<std::vector<int32_t>> prompt_ids;  // kept for echo with logprobs
  int cached_tokens = 0;
  std::vector<Choice> choices;
  int remaining = 0;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double ttft = 0;
  // vLLM's per-request timings for /metrics (seconds; -1 until a sequence reports them; the first one's).
  double queue_time = -1, prefill_time = -1, decode_time = -1, inference_time = -1;
  int max_tokens = 0;  // the request's max_tokens as the engine runs it (the first prompt's)
  bool complete = false;
  // Reasoning / tool-call parsers, one per choice (chat-based APIs only; empty when none applies).
  std::vector<std::unique_ptr<ChatOutputParser>> parsers;
  std::vector<bool> tools_called;
  std::function<void()> on_release;  // run when the request is gone

  ~Gen() {
    if (on_release) on_release();
  }

  // One detokenized delta of choice `ci` through its parsers (with their tail on the last delta), or the
  // delta's text as content when no parser applies.
  ChatDelta parsed_delta(size_t ci, const StreamDelta& d, bool has_text);
  // Choice `ci`'s whole output through its parsers, or its text as content.
  ChatParseResult parsed_output(size_t ci) const;
  // OpenAI usage: prompt, completion and total tokens, cached prompt tokens.
  ojson usage() const;
};

// Token text for logprobs, as vLLM reports it.
class TokenText {
 public:
  explicit TokenText(const tokenizer::Tokenizer& tok) : tok_(tok) {}
  std::string token_string(int32_t id) const;
  ojson token_bytes(int32_t id) const;
  // choices[].logprobs of chat completions ({"content": [...]}).
  ojson chat_logprobs(const std::vector<TokenLogprob>& lps, int top) const;
  // choices[].logprobs of completions (tokens, token_logprobs, top_logprobs, text_offset).
  ojson completion_logprobs(const std::vector<TokenLogprob>& lps, int top, size_t text_offset) const;
  // The same with echo: the prompt's tokens first (the first with null logprobs, as OpenAI and vLLM
  // report it; the others from `prompt_lps`), then the output's; text offsets from 0.
  ojson echo_logprobs(const std::vector<int32_t>& prompt, const std::vector<TokenLogprob>& prompt_lps,
                      const std::vector<TokenLogprob>& lps, int top) const;
  // vLLM's prompt_logprobs: null for the first prompt token, then per token an object keyed by token id
  // with {logprob, rank, decoded_token} for the prompt token and the `top` most likely ones.
  ojson prompt_logprobs(const std::vector<TokenLogprob>& prompt_lps, int top) const;
  const tokenizer::Tokenizer& tokenizer() const { return tok_; }

 private:
  const tokenizer::Tokenizer& tok_;
};

// How one API writes a generation request: its stream events and its response body. The shared
// bookkeeping (Gen) calls begin_stream once, stream_delta for every engine delta of a streamed request,
// then end_stream; or response() once for a request that is not streamed.
class ProtocolWriter {
 public:
  virtual ~ProtocolWriter() = default;
  virtual const char* id_prefix() const = 0;
  // Anthropic Messages and Responses lower a max_tokens above the room left in the context to that room
  // (and to the generation config's max_new_tokens), as vLLM's get_max_tokens does, instead of refusing it.
  virtual bool clamps_max_tokens() const { return false; }
  // Called once the request has its id, model and creation time.
  virtual void attach(const Gen&) {}
  virtual std::string begin_stream(Gen& g) = 0;
  virtual std::string stream_delta(Gen& g, size_t ci, const StreamDelta& d, const std::vector<TokenLogprob>& lps) = 0;
  virtual std::string end_stream(Gen& g) = 0;
  virtual ojson response(Gen& g) = 0;
};

}  // namespace tessera::server::api
