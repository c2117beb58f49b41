#include "bench/agent_runner.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "bench/request_observer.h"

namespace tessera::bench {
namespace {

class AgentDriver {
 public:
  AgentDriver(boost::asio::io_context& io, HttpClient& client, const AgentWorkload& workload,
              const AgentOptions& options, const RequestSettings& settings, const ProgressHandler& progress)
      : io_(io), client_(client), options_(options), settings_(settings), progress_(progress) {
    for (size_t c = 0; c < workload.user_messages.size(); ++c)
      conversations_.emplace_back(workload.system_prompt, workload.user_messages[c]);
    LevelConfig& config = result_.conversations.config;
    config.label = "agent";
    config.max_concurrency = static_cast<int>(conversations_.size());
  }

  AgentRunResult run(const std::vector<std::string>& reference_prompts) {
    for (const std::string& prompt : reference_prompts) run_reference(prompt);
    run_conversations();
    return std::move(result_);
  }

 private:
  void send(const std::vector<ChatMessage>& messages, int max_tokens, Clock::time_point run_start,
            CompletionObserver::DoneHandler on_done) {
    HttpExchange exchange;
    exchange.method = "POST";
    exchange.path = endpoint_path(ApiEndpoint::kChatCompletions);
    exchange.body = build_chat_request_body(messages, max_tokens, settings_.generation);
    exchange.timeout = settings_.timeout;
    // The answer's text goes back into the conversation: always kept.
    auto observer =
        std::make_shared<CompletionObserver>(ApiEndpoint::kChatCompletions, settings_.generation.stream, 0,
                                             /*keep_output_text=*/true, run_start, Clock::now(), std::move(on_done));
    client_.send(exchange, std::move(observer));
  }

  // One reference request, alone: nothing else is in flight while it runs.
  void run_reference(const std::string& prompt) {
    const Clock::time_point start = Clock::now();
    send({{"user", prompt}}, options_.reference_output_len, start,
         [this](RequestRecord&& record) { result_.reference.push_back(std::move(record)); });
    io_.restart();
    io_.run();
  }

  void run_conversations() {
    LevelResult& level = result_.conversations;
    LoopLagProbe lag_probe(io_, level.overhead.loop_lag_ms);
    const size_t connections_before = client_.connections_opened();
    const double cpu_before = thread_cpu_seconds();
    start_ = Clock::now();
    level.started_at = start_;
    level.wall_started_at = std::chrono::system_clock::now();
    lag_probe_ = &lag_probe;
    lag_probe.start(start_);
    for (size_t c = 0; c < conversations_.size(); ++c) send_turn(c);
    io_.restart();
    io_.run();
    lag_probe_ = nullptr;
    level.overhead.cpu_seconds = thread_cpu_seconds() - cpu_before;
    level.overhead.connections_opened = client_.connections_opened() - connections_before;
  }

  void send_turn(size_t c) {
    Conversation& conversation = conversations_[c];
    const int turn = conversation.turns_started();
    ++in_flight_;
    result_.conversations.max_in_flight = std::max(result_.conversations.max_in_flight, in_flight_);
    send(conversation.start_turn(), options_.turn_output_len, start_, [this, c, turn](RequestRecord&& record) {
      record.prompt_index = c;
      record.turn = turn;
      on_turn_done(c, std::move(record));
    });
  }

  void on_turn_done(size_t c, RequestRecord&& record) {
    --in_flight_;
    Conversation& conversation = conversations_[c];
    LevelResult& level = result_.conversations;
    const bool answered = record.success;
    if (answered) conversation.finish_turn(record.output_content);
    level.records.push_back(std::move(record));
    level.duration_s = std::chrono::duration<double>(Clock::now() - start_).count();
    const int left = conversation.turns() - conversation.turns_started();
    if (answered && left > 0) {
      send_turn(c);
    } else {
      result_.turns_not_sent += static_cast<size_t>(left);
      if (++conversations_done_ == conversations_.size() && lag_probe_) lag_probe_->stop();
    }
    const size_t total = conversations_.size() * static_cast<size_t>(options_.turns);
    if (progress_) progress_(level.records.size() + result_.turns_not_sent, total, in_flight_);
  }

  boost::asio::io_context& io_;
  HttpClient& client_;
  const AgentOptions& options_;
  const RequestSettings& settings_;
  const ProgressHandler& progress_;
  std::vector<Conversation> conversations_;
  AgentRunResult result_;
  LoopLagProbe* lag_probe_ = nullptr;
  Clock::time_point start_{};
  size_t in_flight_ = 0;
  size_t conversations_done_ = 0;
};

}  // namespace

AgentRunResult run_agent(boost::asio::io_context& io, HttpClient& client, const AgentWorkload& workload,
                         const AgentOptions& options, const RequestSettings& settings,
                         const ProgressHandler& progress) {
  AgentDriver driver(io, client, workload, options, settings, progress);
  return driver.run(workload.reference_prompts);
}

}  // namespace tessera::bench
