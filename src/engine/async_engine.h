// The thread-safe front of the engine. One engine thread owns the LLMEngine and
// runs steps while there is work; other threads (HTTP handlers, the CLI) submit
// requests and abort them. Outputs are detokenized here (streaming, stop strings),
// so every front end gets the same text.
//
// Contract (docs/engine.md):
//  - submit/abort/stats/drain may be called from any thread;
//  - `on_output` runs on the engine thread: it must not block (post to your own
//    executor); the last call for a request has finished = true, exactly once;
//  - after drain() returns, no callback runs again.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"

namespace tessera::tokenizer {
class Tokenizer;
}

namespace tessera {

struct GenerationRequest {
  std::string id;
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
};

// New output of one sequence (index i of the request's n) after a step.
struct StreamDelta {
  std::string request_id;
  int index = 0;
  std::vector<int32_t> token_ids;
  std::string text;  // new text; stop strings are cut (or kept with include_stop_str_in_output)
  std::vector<TokenLogprob> logprobs;
  // prompt_logprobs >= 0: once, with the sequence's first delta (one entry per prompt token from the second on).
  std::vector<TokenLogprob> prompt_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_string;            // the stop string that finished it, if any
  std::optional<int32_t> stop_token;  // or the stop token
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  double first_token_latency = 0;  // seconds from submit to this sequence's first token (set once)
  // vLLM's request timings in seconds (-1: not in this delta). With the first token: queue_time (submit to the
  // first step that computed the sequence) and prefill_time (that step to the first token). With later tokens:
  // inter_token_latency (since the sequence's previous tokens). With the last delta: decode_time (first token
  // to last token) and inference_time (first step to last token).
  double queue_time = -1, prefill_time = -1, inter_token_latency = -1, decode_time = -1, inference_time = -1;
};

using OutputCallback = std::function<void(const StreamDelta&)>;

struct AsyncEngineOptions {
  // Front-end requests (submit() calls, however many sequences each has) that may wait for their first
  // token; beyond this submit() answers kOverloaded (429).
  int max_waiting_requests = 1024;
  // vLLM's --max-logprobs: the most top logprobs per token a request may ask for; -1: the vocabulary.
  int max_logprobs = 20;
};

enum class SubmitError { kNone, kInvalid, kOverloaded, kDraining, kDead };

struct SubmitResult {
  SubmitError error = SubmitError::kNone;
  std::string message;
  // kInvalid: the request field at fault ("prompt", "max_tokens"; "" for others), as validate_request says.
  std::string param;
  bool ok() const { return error == SubmitError::kNone; }
};

struct AsyncEngineStats {
  EngineStats engine;
  size_t num_pending = 0;  // submitted, not yet seen by the engine thread
  bool alive = true;
  std::string fatal_error;
};

// What a front end needs of the engine. AsyncEngine is the real one; the API server's fuzz target
// drives the server with a stub that records what reaches this seam.
class EngineClient {
 public:
  virtual ~EngineClient() = default;
  // Queues the engine requests of one front-end request (several prompts of /v1/completions, say) as
  // one unit: all are queued or none is. The waiting queue counts units, not sequences, so one request
  // with many prompts takes one place; one whose sequences (prompts x n) alone exceed the queue is
  // refused with kInvalid. `on_output[i]` receives the outputs of `requests[i]`.
  virtual SubmitResult submit(std::vector<GenerationRequest> requests, std::vector<OutputCallback> on_output) = 0;
  // Thread-safe; the request's callback gets a finished delta with reason abort.
  virtual void abort(const std::string& id) = 0;
  virtual AsyncEngineStats stats() const = 0;
  virtual int max_model_len() const = 0;
  virtual int vocab_size() const = 0;
  // The tokens that end a sequence (EOS and generation_config's), fixed once the engine is built.
  virtual std::vector<int32_t> eos_token_ids() const = 0;
};

class AsyncEngine : public EngineClient {
 public:
  // `tok` may be null (token ids only, no text). Starts the engine thread.
  AsyncEngine(std::unique_ptr<LLMEngine> engine, const tokenizer::Tokenizer* tok, AsyncEngineOptions options = {});
  ~AsyncEngine() override;  // drains with a zero timeout

  // Validates each request (validate_request: the engine's one check of prompt, length and sampling
  // ranges) without touching engine state, then queues.
  SubmitResult submit(GenerationRequest request, OutputCallback on_output);
  SubmitResult submit(std::vector<GenerationRequest> requests, std::vector<OutputCallback> on_output) override;
  void abort(const std::string& id) override;
  // Stops accepting, lets in-flight requests finish for up to `timeout`, aborts the rest,
  // then stops the engine thread.
  void drain(std::chrono::milliseconds timeout);
  // Ends the engine after a failure outside it (a rank or a node of the job lost): every in-flight
  // and queued request gets its last delta with reason error and `what` as its text, submit()
  // answers kDead from then on, and the engine thread stops (after the step it is in, if any).
  void fail(const std::string& what);
  AsyncEngineStats stats() const override;

  int max_model_len() const override { return max_model_len_; }
  int vocab_size() const override { return vocab_size_; }
  std::vector<int32_t> eos_token_ids() const override { return eos_ids_; }
  const ModelConfig& model_config() const { return model_config_; }

 private:
  struct Sequence;
  struct Tracked;
  struct Pending {
    GenerationRequest request;
    OutputCallback callback;
    uint64_t group = 0;
  };
  SubmitResult check(const GenerationRequest& request) const;
  // Engine thread: `count` sequences of `group` stopped waiting (first token, finished, aborted, refused).
  void leave_waiting(uint64_t group, int count);
  void loop();
  // Engine thread: hands a submitted request to the engine (or refuses it with its last delta).
  void admit(Pending& pending, bool draining);
  // Engine thread: aborts a tracked request, with a last delta for each unfinished sequence.
  void abort_tracked(const std::string& id);
  // Engine thread, after a failed step or fail(): a last delta for every request, queued ones too
  // (`delta_text` for the in-flight ones, `what` for the queued ones).
  void fail_everything(const std::string& what, const std::string& delta_text);
  void handle_outputs(std::vector<RequestOutput>& outs);
  // Fills the delta's timings (StreamDelta::queue_time ...) from the sequence's clock.
  static void time_delta(const RequestOutput& o, Sequence& seq, Tracked& t, StreamDelta& d);

  std::unique_ptr<LLMEngine> engine_;
  const tokenizer::Tokenizer* tok_;
  AsyncEngineOptions options_;
  ModelConfig model_config_;
  int max_model_len_, vocab_size_;
  std::vector<int32_t> eos_ids_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  uint64_t next_group_ = 0;
  size_t waiting_groups_ = 0;  // submitted units with a sequence still waiting for its first token
  std::vector<std::string> pending_aborts_;
  bool draining_ = false, stop_ = false;
  std::optional<std::string> failure_;  // set by fail()
  std::chrono::steady_clock::time_point drain_deadline_;
  AsyncEngineStats snapshot_;

  // Engine-thread state.
  std::unordered_map<std::string, std::unique_ptr<Tracked>> tracked_;    // by request id
  std::unordered_map<std::string, std::pair<Tracked*, int>> seq_owner_;  // engine sequence id -> (request, index)
  std::unordered_map<uint64_t, int> group_waiting_;                      // unit -> sequences still waiting
  std::thread thread_;
};

}  // namespace tessera
