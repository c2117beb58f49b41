// Agent-style multi-turn conversations (--dataset-name agent): what coding agents send. Every
// conversation starts with the same long system prompt; each turn appends the answer the server
// gave to the previous turn and a new user message, so turn N+1's prompt is turn N's prompt plus
// those two messages (vLLM's benchmarks/multi_turn and SGLang's multi-turn bench drive the same
// shape with their client and round counts).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/openai_protocol.h"

namespace tessera::bench {

class TokenCounter;

struct AgentOptions {
  int conversations = 8;          // concurrent conversations (clients), each its own message list
  int turns = 10;                 // requests per conversation, one after another
  int system_prompt_len = 20000;  // tokens of the system prompt every conversation shares
  int turn_input_len = 200;       // tokens of each turn's new user message
  int turn_output_len = 300;      // max_tokens of each turn (with ignore_eos: exactly that many)
  int reference_len = 500;        // tokens of the reference prompt, sent alone before the conversations
  int reference_runs = 3;         // reference requests (each its own text, so none hits the prefix cache)
  int reference_output_len = 8;   // max_tokens of each reference request (TTFT does not depend on it)
  uint64_t seed = 0;
};

// Throws tessera::Error naming the flag for a value out of range.
void check_agent_options(const AgentOptions& options);

// The texts of a run, drawn from options.seed: random_text of the given lengths (exact with a
// `counter`, about that many tokens without one).
struct AgentWorkload {
  std::string system_prompt;                            // shared by every conversation
  std::vector<std::vector<std::string>> user_messages;  // [conversation][turn]
  std::vector<std::string> reference_prompts;           // one per reference run
};
AgentWorkload agent_workload(const AgentOptions& options, const TokenCounter* counter = nullptr);

// One conversation's message list as it grows: [system, user 1, assistant 1, user 2, ...].
class Conversation {
 public:
  Conversation(std::string system_prompt, std::vector<std::string> user_messages);
  int turns() const { return static_cast<int>(user_messages_.size()); }
  int turns_started() const { return started_; }
  bool done() const { return started_ == turns() && !waiting_; }
  // Appends the next turn's user message and returns the messages to send. The previous turn must
  // have been answered (finish_turn) and a turn must be left.
  const std::vector<ChatMessage>& start_turn();
  // The server's answer to the turn started last, appended as the assistant's message.
  void finish_turn(std::string answer);
  const std::vector<ChatMessage>& messages() const { return messages_; }

 private:
  std::vector<std::string> user_messages_;
  std::vector<ChatMessage> messages_;
  int started_ = 0;
  bool waiting_ = false;  // a turn was started and not answered yet
};

}  // namespace tessera::bench
