#include "bench/progress_bar.h"

#include <unistd.h>

#include <cstdio>

namespace tessera::bench {

ProgressBar::ProgressBar(bool enabled) : enabled_(enabled), interactive_(enabled && isatty(STDERR_FILENO)) {}

void ProgressBar::start_level(const std::string& label, size_t level_index, size_t level_count) {
  label_ = label;
  level_index_ = level_index;
  level_count_ = level_count;
  level_start_ = std::chrono::steady_clock::now();
  last_draw_ = {};
}

void ProgressBar::update(size_t completed, size_t total, size_t in_flight) {
  if (!interactive_) return;
  auto now = std::chrono::steady_clock::now();
  if (completed != total && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(completed, total, in_flight);
}

void ProgressBar::draw(size_t completed, size_t total, size_t in_flight) {
  constexpr int kWidth = 30;
  int filled = total ? static_cast<int>(kWidth * completed / total) : kWidth;
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : '.';
  bar[kWidth] = 0;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - level_start_).count();
  std::fprintf(stderr, "\r[%zu/%zu] %-16s [%s] %zu/%zu done, %zu in flight, %.1f s   ", level_index_ + 1, level_count_,
               label_.c_str(), bar, completed, total, in_flight, elapsed);
  std::fflush(stderr);
}

void ProgressBar::finish_level(size_t completed, size_t failed, double duration_s) {
  if (!enabled_) return;
  if (interactive_)
    std::fprintf(stderr, "\n");
  else
    std::fprintf(stderr, "[%zu/%zu] %s: %zu ok, %zu failed in %.2f s\n", level_index_ + 1, level_count_, label_.c_str(),
                 completed, failed, duration_s);
}

}  // namespace tessera::bench
