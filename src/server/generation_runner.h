// The generation bookkeeping every protocol shares (server-internal): a PreparedRequest (request_reader.h)
// into engine requests (max_tokens settled per prompt, the logprob budget, the request log, one unit through
// EngineClient::submit), then the engine's deltas, posted back to the connection's strand, into the request's
// choices and out through its ProtocolWriter (a stream, or one response when the last choice is done), with
// the metrics of each finished request and aborts when the client goes away.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/async_engine.h"
#include "server/api_common.h"
#include "server/api_server.h"
#include "server/generation.h"
#include "server/metrics.h"
#include "server/request_reader.h"

namespace tessera::server::api {

class GenerationRunner {
 public:
  // `active` counts the requests in flight (ApiServer::active_requests).
  GenerationRunner(const ApiOptions& opt, EngineClient& engine, Metrics& metrics, std::atomic<size_t>& active)
      : opt_(opt), engine_(engine), metrics_(metrics), active_(active) {}

  // A request's Gen: its id, model, stream options, the writer attached; counted in `active` until released.
  std::shared_ptr<Gen> new_gen(std::unique_ptr<ProtocolWriter> writer, const std::shared_ptr<Exchange>& ex,
                               const ojson& body);
  // Reasoning and tool-call parsers for each of the n choices, when either applies.
  void add_parsers(Gen& g, const ojson& body, const ToolChoicePlan& plan, int n) const;
  // Submits the prepared request (an ApiError when it is refused: 400 / 429 / 503) and, for a stream, starts it.
  void start_generation(std::shared_ptr<Gen> g, PreparedRequest& pr);

 private:
  void fit_max_tokens(const PreparedRequest& pr, size_t prompt_len, SamplingParams& p) const;
  void log_request(const std::string& id, const std::string& text, const std::vector<int32_t>& ids,
                   const SamplingParams& p) const;
  void on_delta(Gen& g, int prompt_index, const StreamDelta& d);
  void record_timings(Gen& g, const StreamDelta& d);
  void finalize(Gen& g);
  void idle();

  const ApiOptions& opt_;
  EngineClient& engine_;
  Metrics& metrics_;
  std::atomic<size_t>& active_;
  std::atomic<int64_t> last_trim_ms_{0};
};

}  // namespace tessera::server::api
