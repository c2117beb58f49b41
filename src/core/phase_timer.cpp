#include "core/phase_timer.h"

#include "core/env.h"
#include "core/logging.h"

namespace tessera {

PhaseTimer::PhaseTimer(std::string what, int skip)
    : PhaseTimer(std::move(what), env_switch("TESSERA_STEP_TIMING", false), skip) {}

PhaseTimer::PhaseTimer(std::string what, bool on, int skip) : what_(std::move(what)), on_(on), skip_(skip) {}

PhaseTimer::~PhaseTimer() {
  if (on_ && counted_passes() > 0) TLOG_INFO("{}", summary());
}

void PhaseTimer::record_mark(size_t i, const char* name) {
  const auto now = std::chrono::steady_clock::now();
  if (names_.size() <= i) {
    names_.resize(i + 1);
    seconds_.resize(i + 1, 0.0);
    pass_.resize(i + 1, 0.0);
  }
  if (names_[i].empty()) names_[i] = name;
  pass_[i] += std::chrono::duration<double>(now - last_).count();
  last_ = now;
}

void PhaseTimer::record_pass() {
  const uint64_t skip = static_cast<uint64_t>(skip_);
  if (passes_ >= skip) {  // past the warm-up (passes_ counts the passes done before this one)
    for (size_t i = 0; i < pass_.size(); ++i) seconds_[i] += pass_[i];
    if (passes_ > skip) between_ += std::chrono::duration<double>(started_ - end_).count();
  }
  ++passes_;
  end_ = std::chrono::steady_clock::now();
  if (passes_ <= skip) warmup_ms_.push_back(1e3 * std::chrono::duration<double>(end_ - started_).count());
}

double PhaseTimer::mean_us(size_t i) const {
  const uint64_t n = counted_passes();
  return n && i < seconds_.size() ? 1e6 * seconds_[i] / n : 0.0;
}

double PhaseTimer::between_us() const {
  const uint64_t n = counted_passes();
  return n > 1 ? 1e6 * between_ / (n - 1) : 0.0;
}

std::string PhaseTimer::summary() const {
  std::string s;
  double total = 0;
  for (size_t i = 0; i < names_.size(); ++i) {
    s += fmt::format("{}{} {:.1f} us", i ? ", " : "", names_[i], mean_us(i));
    total += mean_us(i);
  }
  std::string warm;
  for (double ms : warmup_ms_) warm += fmt::format("{}{:.2f}", warm.empty() ? "" : " ", ms);
  return fmt::format(
      "{}: {} passes after {} of warm-up, host time per pass: {} (sum {:.1f} us); between passes "
      "{:.1f} us; the warm-up passes took {} ms",
      what_, counted_passes(), skip_, s, total, between_us(), warm);
}

}  // namespace tessera
