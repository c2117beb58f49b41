#include "dist/kv_store.h"

#include <algorithm>
#include <thread>

#include "core/error.h"
#include "dist/socket.h"

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

}  // namespace tessera::dist
