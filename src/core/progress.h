// A one-line progress bar on stderr, redrawn in place at most ten times a second while stderr is
// a terminal (always at the end), in one of two layouts:
//   kRate, weight loading, as vLLM's tqdm bar; where stderr is not a terminal, the finished line alone:
//     Loading safetensors checkpoint shards:  42% |████▏     | 123/291 [00:03<00:04, 38.1it/s]
//   kLevel, tessera bench, one bar a concurrency level; where stderr is not a terminal, finish's
//   summary alone:
//     [2/4] concurrency 5    [###########...................] 15/40 done, 5 in flight, 3.1 s
#pragma once
#include <chrono>
#include <string>
#include <string_view>

namespace tessera {

class ProgressBar {
 public:
  enum class Layout { kRate, kLevel };

  // `enabled` false: nothing is drawn.
  explicit ProgressBar(Layout layout, bool enabled = true);
  // A kRate bar, started.
  ProgressBar(std::string label, size_t total);

  // A new bar of `total` steps: `label` leads its line and its time counts from now. kLevel: the
  // bar is level `index` of `count` ("[index + 1/count]" before the label).
  void start(std::string label, size_t total, size_t index = 0, size_t count = 0);
  // `done` of the total; kLevel also shows `in_flight`.
  void update(size_t done, size_t in_flight = 0);
  // Ends the bar's line. kRate: draws the finished line unless update did. kLevel: where stderr
  // is not a terminal, writes "[index + 1/count] label: `summary`" instead.
  void finish(std::string_view summary = {});

 private:
  void draw(size_t done, size_t in_flight, std::chrono::steady_clock::time_point now) const;

  Layout layout_;
  bool enabled_;
  bool interactive_;
  std::string label_;
  size_t total_ = 0;
  size_t index_ = 0, count_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool finished_ = false;
};

}  // namespace tessera
