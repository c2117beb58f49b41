// Runs --dataset-name agent on the calling thread: the reference prompts one at a time (each
// alone on the server), then every conversation at once, each sending its next turn (streamed,
// on /v1/chat/completions) when the answer to its previous one has arrived.
#pragma once
#include <vector>

#include "bench/conversation.h"
#include "bench/load_runner.h"

namespace tessera::bench {

struct AgentRunResult {
  std::vector<RequestRecord> reference;  // the reference requests, in order
  // Every turn sent: record.prompt_index is the conversation, record.turn the turn (from 0); the
  // level's duration, concurrency and client overhead.
  LevelResult conversations;
  // Turns never sent because an earlier turn of their conversation failed (there was no answer to
  // send back).
  size_t turns_not_sent = 0;
};

// Runs `io` until every conversation is done; `io` must not be running elsewhere. `settings.generation`
// (model, temperature, stream, ignore_eos, extra body) goes into every request; `progress` is called after
// each turn with (turns done, turns in all, turns in flight).
AgentRunResult run_agent(boost::asio::io_context& io, HttpClient& client, const AgentWorkload& workload,
                         const AgentOptions& options, const RequestSettings& settings, const ProgressHandler& progress);

}  // namespace tessera::bench
