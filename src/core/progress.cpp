#include "core/progress.h"

#include <unistd.h>

#include <fmt/format.h>
#include <cstdio>

namespace tessera {

namespace {
std::string clock_text(double s) {
  int t = static_cast<int>(s);
  return fmt::format("{:02d}:{:02d}", t / 60, t % 60);
}
}  // namespace

ProgressBar::ProgressBar(std::string label, size_t total)
    : label_(std::move(label)),
      total_(total),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_),
      tty_(isatty(STDERR_FILENO)) {}

void ProgressBar::update(size_t done, const std::string& suffix) {
  auto now = std::chrono::steady_clock::now();
  const bool last = done >= total_;
  // Redraw at most 10 times a second on a terminal; in logs only at the end.
  if (!last && (!tty_ || now - last_draw_ < std::chrono::milliseconds(100))) return;
  last_draw_ = now;
  double elapsed = std::chrono::duration<double>(now - start_).count();
  double rate = elapsed > 0 ? done / elapsed : 0;
  double remaining = rate > 0 ? (total_ - done) / rate : 0;
  const int width = 20;
  int filled = total_ ? static_cast<int>(width * done / total_) : width;
  std::string bar;
  for (int i = 0; i < width; ++i) bar += i < filled ? "\u2588" : " ";
  std::fprintf(stderr, "%s%s: %3d%% |%s| %zu/%zu [%s<%s, %.2fit/s]%s%s", tty_ ? "\r" : "", label_.c_str(),
               total_ ? static_cast<int>(100 * done / total_) : 100, bar.c_str(), done, total_,
               clock_text(elapsed).c_str(), clock_text(remaining).c_str(), rate, suffix.empty() ? "" : " ",
               suffix.c_str());
  if (last) {
    std::fputc('\n', stderr);
    finished_ = true;
  }
  std::fflush(stderr);
}

void ProgressBar::finish(const std::string& suffix) {
  if (!finished_) update(total_, suffix);
}

}  // namespace tessera
