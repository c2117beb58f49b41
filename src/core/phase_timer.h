// Host time per phase of a loop (the engine's step, the executor's), averaged over the
// passes after the first few (warm-up: a prefill, CUDA graph captures) and logged once at
// destruction, with each warm-up pass's own time (what a one-time cost adds to a short run). On only when
// TESSERA_STEP_TIMING=1: a diagnostic of where the host spends a step's time (with CUDA graphs, how much of a decode
// step is host time at all).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

class PhaseTimer {
 public:
  // `on` defaults to TESSERA_STEP_TIMING=1; `skip` passes are not counted.
  explicit PhaseTimer(std::string what, int skip = 8);
  PhaseTimer(std::string what, bool on, int skip);
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  bool on() const { return on_; }
  // Starts a pass: the time until the first mark() counts for that mark's phase. A pass
  // started but never done (an empty step, an exception) is dropped.
  void start() {
    if (!on_) return;
    started_ = last_ = std::chrono::steady_clock::now();
    pass_.assign(pass_.size(), 0.0);
  }
  // Ends phase `i` of the current pass (phases numbered in pass order; `name` names it).
  // Off (the default), this and pass_done() are an inline test: no call on the step's path.
  void mark(size_t i, const char* name) {
    if (on_) record_mark(i, name);
  }
  // Ends the pass: its phases count unless it is one of the warm-up passes.
  void pass_done() {
    if (on_) record_pass();
  }
  // Mean microseconds of phase i over the counted passes (0 if none); the same for the time
  // from one pass's end to the next one's start.
  double mean_us(size_t i) const;
  double between_us() const;
  std::string summary() const;

 private:
  void record_mark(size_t i, const char* name);
  void record_pass();
  uint64_t counted_passes() const { return passes_ > static_cast<uint64_t>(skip_) ? passes_ - skip_ : 0; }

  std::string what_;
  bool on_ = false;
  int skip_ = 0;
  std::chrono::steady_clock::time_point started_, last_, end_;
  std::vector<std::string> names_;
  std::vector<double> seconds_;  // per phase, summed over the counted passes
  std::vector<double> pass_;     // per phase, the current pass
  double between_ = 0;
  uint64_t passes_ = 0;
  std::vector<double> warmup_ms_;  // each warm-up pass, start to done (a capture shows there)
};

}  // namespace tessera
