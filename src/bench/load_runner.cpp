#include "bench/load_runner.h"

#include <sys/resource.h>

#include <boost/asio/steady_timer.hpp>

#include <memory>
#include <string>

#include "bench/request_observer.h"

namespace tessera::bench {

double thread_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

void LoopLagProbe::start(Clock::time_point from) {
  constexpr auto kPeriod = std::chrono::milliseconds(10);
  due_ = from + kPeriod;
  timer_.expires_at(due_);
  timer_.async_wait([this](boost::system::error_code ec) {
    // A probe that already expired still runs after cancel(); `stopped_` stops it re-arming.
    if (ec || stopped_) return;
    const Clock::time_point now = Clock::now();
    lag_ms_.push_back(std::chrono::duration<double, std::milli>(now - due_).count());
    start(now);
  });
}

void LoopLagProbe::stop() {
  stopped_ = true;
  timer_.cancel();
}

namespace {

using std::chrono::duration;

class LevelDriver {
 public:
  LevelDriver(boost::asio::io_context& io, HttpClient& client, const std::vector<PromptSpec>& prompts,
              const LevelConfig& config, const RequestSettings& settings, const ProgressHandler& progress)
      : io_(io),
        client_(client),
        prompts_(prompts),
        settings_(settings),
        progress_(progress),
        release_timer_(io),
        lag_probe_(io, result_.overhead.loop_lag_ms) {
    result_.config = config;
    result_.records.reserve(prompts.size());
    release_times_ = arrival_times(config.arrivals, prompts.size(), config.seed);
  }

  LevelResult run() {
    if (prompts_.empty()) return std::move(result_);
    size_t connections_before = client_.connections_opened();
    double cpu_before = thread_cpu_seconds();
    start_ = Clock::now();
    result_.started_at = start_;
    result_.wall_started_at = std::chrono::system_clock::now();
    result_.release_times = release_times_;
    lag_probe_.start(start_);
    release_due();
    io_.restart();
    io_.run();
    result_.overhead.cpu_seconds = thread_cpu_seconds() - cpu_before;
    result_.overhead.connections_opened = client_.connections_opened() - connections_before;
    return std::move(result_);
  }

 private:
  // Moves every request whose release time has come into the ready count, then waits for the next.
  void release_due() {
    double now_s = duration<double>(Clock::now() - start_).count();
    while (next_release_ < release_times_.size() && release_times_[next_release_] <= now_s) {
      ++next_release_;
      ++ready_;
    }
    dispatch();
    if (next_release_ < release_times_.size()) {
      release_timer_.expires_at(
          start_ + std::chrono::duration_cast<Clock::duration>(duration<double>(release_times_[next_release_])));
      release_timer_.async_wait([this](boost::system::error_code ec) {
        if (!ec) release_due();
      });
    }
  }

  void dispatch() {
    int limit = result_.config.max_concurrency;
    while (ready_ > 0 && (limit <= 0 || in_flight_ < static_cast<size_t>(limit))) {
      --ready_;
      send(next_prompt_++);
    }
  }

  void send(size_t prompt_index) {
    const PromptSpec& prompt = prompts_[prompt_index];
    ++in_flight_;
    result_.max_in_flight = std::max(result_.max_in_flight, in_flight_);
    HttpExchange exchange;
    exchange.method = "POST";
    exchange.path = endpoint_path(settings_.endpoint);
    exchange.body = build_request_body(settings_.endpoint, prompt, settings_.generation);
    exchange.timeout = settings_.timeout;
    if (!result_.config.request_id_prefix.empty())
      exchange.headers.emplace_back("x-request-id", result_.config.request_id_prefix + std::to_string(prompt_index));
    auto observer = std::make_shared<CompletionObserver>(
        settings_.endpoint, settings_.generation.stream, prompt.expected_prompt_tokens, settings_.keep_output_text,
        start_, Clock::now(), [this, prompt_index](RequestRecord&& record) {
          record.prompt_index = prompt_index;
          on_done(std::move(record));
        });
    client_.send(exchange, std::move(observer));
  }

  void on_done(RequestRecord&& record) {
    --in_flight_;
    result_.records.push_back(std::move(record));
    result_.duration_s = duration<double>(Clock::now() - start_).count();
    if (result_.records.size() == prompts_.size()) {
      release_timer_.cancel();
      lag_probe_.stop();
    } else {
      dispatch();
    }
    if (progress_) progress_(result_.records.size(), prompts_.size(), in_flight_);
  }

  boost::asio::io_context& io_;
  HttpClient& client_;
  const std::vector<PromptSpec>& prompts_;
  const RequestSettings& settings_;
  const ProgressHandler& progress_;
  boost::asio::steady_timer release_timer_;
  LevelResult result_;
  LoopLagProbe lag_probe_;
  std::vector<double> release_times_;
  Clock::time_point start_;
  size_t next_release_ = 0;
  size_t next_prompt_ = 0;
  size_t ready_ = 0;
  size_t in_flight_ = 0;
};

}  // namespace

LevelResult run_level(boost::asio::io_context& io, HttpClient& client, const std::vector<PromptSpec>& prompts,
                      const LevelConfig& config, const RequestSettings& settings, const ProgressHandler& progress) {
  LevelDriver driver(io, client, prompts, config, settings, progress);
  return driver.run();
}

}  // namespace tessera::bench
