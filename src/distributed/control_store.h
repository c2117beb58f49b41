// A rank process's connection to the head's bootstrap key-value store. One per rank
// process; it also tells the head which world rank it is, so that when a collective fails
// the survivors can ask which peers' processes are gone (their connection closed).
#pragma once
#include <mutex>

#include "distributed/connect.h"
#include "distributed/kv_store.h"
#include "distributed/wire.h"

namespace tessera::dist {

class ControlStoreClient : public KeyValueStore {
 public:
  // Connects (retrying until `connect_timeout`), authenticates and registers `world_rank`.
  ControlStoreClient(const HeadAddress& head, int world_rank, std::chrono::milliseconds connect_timeout,
                     std::chrono::milliseconds request_timeout = std::chrono::seconds(10));
  // An orderly end (no exception in flight) says `leave` first: the head tells a rank that
  // finished from one whose process died (its connection closes without it).
  ~ControlStoreClient() override;
  ControlStoreClient(const ControlStoreClient&) = delete;
  ControlStoreClient& operator=(const ControlStoreClient&) = delete;
  void set(const std::string& key, std::span<const uint8_t> value) override;
  std::optional<std::vector<uint8_t>> try_get(const std::string& key) override;
  std::vector<int> gone_ranks(const std::vector<int>& ranks) override;
  int world_rank() const { return world_rank_; }

 private:
  Frame request(MessageType type, std::span<const uint8_t> payload, MessageType reply);

  HeadAddress head_;
  int world_rank_;
  std::chrono::milliseconds request_timeout_;
  std::mutex mu_;  // one request in flight at a time
  Socket socket_;
};

}  // namespace tessera::dist
