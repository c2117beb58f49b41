#include "bench/conversation.h"

#include <random>
#include <utility>

#include "bench/workload.h"
#include "core/error.h"

namespace tessera::bench {

void check_agent_options(const AgentOptions& o) {
  auto at_least = [](int value, int least, const char* flag) {
    if (value < least) fail(ErrorKind::kInvalidArgument, "{} must be at least {}, got {}", flag, least, value);
  };
  at_least(o.conversations, 1, "--agent-conversations");
  at_least(o.turns, 1, "--agent-turns");
  at_least(o.system_prompt_len, 1, "--agent-system-prompt-len");
  at_least(o.turn_input_len, 1, "--agent-turn-input-len");
  at_least(o.turn_output_len, 1, "--agent-turn-output-len");
  at_least(o.reference_len, 1, "--agent-reference-len");
  at_least(o.reference_runs, 0, "--agent-reference-runs");
  at_least(o.reference_output_len, 1, "--agent-reference-output-len");
}

AgentWorkload agent_workload(const AgentOptions& o, const TokenCounter* counter) {
  check_agent_options(o);
  std::mt19937_64 rng(o.seed);
  AgentWorkload w;
  w.system_prompt = random_text(rng, o.system_prompt_len, counter);
  w.user_messages.resize(static_cast<size_t>(o.conversations));
  for (auto& messages : w.user_messages)
    for (int t = 0; t < o.turns; ++t) messages.push_back(random_text(rng, o.turn_input_len, counter));
  for (int r = 0; r < o.reference_runs; ++r) w.reference_prompts.push_back(random_text(rng, o.reference_len, counter));
  return w;
}

Conversation::Conversation(std::string system_prompt, std::vector<std::string> user_messages)
    : user_messages_(std::move(user_messages)) {
  messages_.push_back({"system", std::move(system_prompt)});
}

const std::vector<ChatMessage>& Conversation::start_turn() {
  TESSERA_CHECK(!waiting_ && started_ < turns(), "turn {} of {} started out of order", started_ + 1, turns());
  messages_.push_back({"user", user_messages_[static_cast<size_t>(started_++)]});
  waiting_ = true;
  return messages_;
}

void Conversation::finish_turn(std::string answer) {
  TESSERA_CHECK(waiting_, "an answer without a turn waiting for one");
  messages_.push_back({"assistant", std::move(answer)});
  waiting_ = false;
}

}  // namespace tessera::bench
