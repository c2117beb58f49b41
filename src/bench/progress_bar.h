// A one-line progress bar on stderr, redrawn at most ten times a second; silent when stderr
// is not a terminal (logs and CI get one line per finished level instead).
#pragma once
#include <chrono>
#include <string>

namespace tessera::bench {

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled);
  void start_level(const std::string& label, size_t level_index, size_t level_count);
  void update(size_t completed, size_t total, size_t in_flight);
  void finish_level(size_t completed, size_t failed, double duration_s);

 private:
  void draw(size_t completed, size_t total, size_t in_flight);

  bool enabled_;
  bool interactive_;
  std::string label_;
  size_t level_index_ = 0, level_count_ = 0;
  std::chrono::steady_clock::time_point level_start_, last_draw_;
};

}  // namespace tessera::bench
