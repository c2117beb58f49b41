// The key-value store collective libraries bootstrap through (Gloo's addresses, NCCL's
// unique id). It lives on the head, behind the authenticated control channel, so no
// second unauthenticated port (like torch's TCPStore) is ever opened.
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tessera::dist {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual void set(const std::string& key, std::span<const uint8_t> value) = 0;
  virtual std::optional<std::vector<uint8_t>> try_get(const std::string& key) = 0;
  // World ranks among `ranks` whose processes are known to be gone (their control
  // connection closed). Used to name the culprit when a collective fails.
  virtual std::vector<int> gone_ranks(const std::vector<int>& ranks) { return {}; }

  // Polls try_get until the key appears; throws Error(kNetwork) after `timeout`, with
  // `waiting_for` in the message ("rank 3's Gloo address").
  std::vector<uint8_t> wait_get(const std::string& key, std::chrono::milliseconds timeout,
                                const std::string& waiting_for);
};

}  // namespace tessera::dist
