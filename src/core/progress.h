// A tqdm-style progress bar on stderr, as vLLM prints while loading weights:
//   Loading safetensors checkpoint shards:  42% |████▏     | 123/291 [00:03<00:04, 38.1it/s]
#pragma once
#include <chrono>
#include <string>

namespace tessera {

class ProgressBar {
 public:
  ProgressBar(std::string label, size_t total);
  void update(size_t done, const std::string& suffix = "");
  void finish(const std::string& suffix = "");

 private:
  std::string label_;
  size_t total_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool tty_;
  bool finished_ = false;
};

}  // namespace tessera
