// The key-value store collective libraries bootstrap through (Gloo's addresses, NCCL's
// unique id). It lives on the head, behind the authenticated control channel, so no
// second unauthenticated port (like torch's TCPStore) is ever opened.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
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

// "rank 3 (node 1, 10.0.0.2) is gone (...)" for the ranks among `world_ranks` the head saw go,
// asking twice 250 ms apart because a peer that died a moment ago may not be noticed yet; "the
// head is gone: ..." when the store cannot be asked (the head holds it); "" when none is gone.
// Used by the communicators' error messages.
std::string describe_gone_ranks(KeyValueStore* store, const std::vector<int>& world_ranks,
                                const std::function<std::string(int)>& namer);

}  // namespace tessera::dist
