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

// `width` cells, the share `done` of `total` of them `full`, the rest `empty`.
std::string cells(size_t done, size_t total, int width, std::string_view full, std::string_view empty) {
  int filled = total ? static_cast<int>(width * done / total) : width;
  std::string out;
  for (int i = 0; i < width; ++i) out += i < filled ? full : empty;
  return out;
}

}  // namespace

ProgressBar::ProgressBar(Layout layout, bool enabled)
    : layout_(layout), enabled_(enabled), interactive_(enabled && isatty(STDERR_FILENO)) {}

ProgressBar::ProgressBar(std::string label, size_t total) : ProgressBar(Layout::kRate) {
  start(std::move(label), total);
}

void ProgressBar::start(std::string label, size_t total, size_t index, size_t count) {
  label_ = std::move(label);
  total_ = total;
  index_ = index;
  count_ = count;
  start_ = std::chrono::steady_clock::now();
  // A kRate bar's first line waits its 100 ms as the others do; a level's is drawn at once.
  last_draw_ = layout_ == Layout::kRate ? start_ : std::chrono::steady_clock::time_point{};
  finished_ = false;
}

void ProgressBar::update(size_t done, size_t in_flight) {
  const bool last = done >= total_;
  // Where stderr is not a terminal, only a kRate bar's finished line is drawn.
  if (!interactive_ && !(enabled_ && last && layout_ == Layout::kRate)) return;
  auto now = std::chrono::steady_clock::now();
  if (!last && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(done, in_flight, now);
  if (last && layout_ == Layout::kRate) {
    std::fputc('\n', stderr);
    finished_ = true;
  }
  std::fflush(stderr);
}

void ProgressBar::draw(size_t done, size_t in_flight, std::chrono::steady_clock::time_point now) const {
  double elapsed = std::chrono::duration<double>(now - start_).count();
  if (layout_ == Layout::kLevel) {
    std::fprintf(stderr, "\r[%zu/%zu] %-16s [%s] %zu/%zu done, %zu in flight, %.1f s   ", index_ + 1, count_,
                 label_.c_str(), cells(done, total_, 30, "#", ".").c_str(), done, total_, in_flight, elapsed);
    return;
  }
  double rate = elapsed > 0 ? done / elapsed : 0;
  double remaining = rate > 0 ? (total_ - done) / rate : 0;
  std::fprintf(stderr, "%s%s: %3d%% |%s| %zu/%zu [%s<%s, %.2fit/s]", interactive_ ? "\r" : "", label_.c_str(),
               total_ ? static_cast<int>(100 * done / total_) : 100, cells(done, total_, 20, "\u2588", " ").c_str(),
               done, total_, clock_text(elapsed).c_str(), clock_text(remaining).c_str(), rate);
}

void ProgressBar::finish(std::string_view summary) {
  if (!enabled_) return;
  if (layout_ == Layout::kRate) {
    if (!finished_) update(total_);
  } else if (interactive_) {
    std::fprintf(stderr, "\n");
  } else {
    std::fprintf(stderr, "[%zu/%zu] %s: %.*s\n", index_ + 1, count_, label_.c_str(), static_cast<int>(summary.size()),
                 summary.data());
  }
}

}  // namespace tessera
