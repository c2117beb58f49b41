#include "distributed/kv_store.h"

#include <algorithm>
#include <thread>

#include "core/error.h"
#include "distributed/socket.h"

namespace tessera::dist {

std::vector<uint8_t> KeyValueStore::wait_get(const std::string& key, std::chrono::milliseconds timeout,
                                             const std::string& waiting_for) {
  Deadline deadline = deadline_after(timeout);
  auto pause = std::chrono::milliseconds(2);
  for (;;) {
    if (std::optional<std::vector<uint8_t>> v = try_get(key)) return std::move(*v);
    if (Clock::now() >= deadline)
      fail(ErrorKind::kNetwork, "timed out after {} ms waiting for {} (store key '{}')", timeout.count(), waiting_for,
           key);
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

std::string describe_gone_ranks(KeyValueStore* store, const std::vector<int>& world_ranks,
                                const std::function<std::string(int)>& namer) {
  if (!store || world_ranks.empty()) return "";
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      std::vector<int> gone = store->gone_ranks(world_ranks);
      if (!gone.empty()) {
        std::string names;
        for (int w : gone) names += (names.empty() ? "" : ", ") + (namer ? namer(w) : fmt::format("rank {}", w));
        return fmt::format("{} {} gone (process exited or lost its control connection)", names,
                           gone.size() == 1 ? "is" : "are");
      }
    } catch (const std::exception& e) {
      // The head answers these questions; when it cannot be asked, it is the one gone (its process
      // ended, so every peer's connections closed) or cut off, and no peer is to blame.
      return fmt::format(
          "the head is gone: its control channel does not answer ({}); its process ended or the link to it is cut, "
          "so the job cannot go on: start it again on every node",
          e.what());
    }
    if (attempt == 0) std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  return "";
}

}  // namespace tessera::dist
