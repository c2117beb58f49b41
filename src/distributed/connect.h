// Opening an authenticated control-channel connection to the head, retrying while the
// head is not up yet (nodes usually start before or after it in any order).
#pragma once
#include <chrono>
#include <string>

#include "distributed/socket.h"

namespace tessera::dist {

struct HeadAddress {
  std::string host;       // --master-addr
  uint16_t port = 0;      // --master-port
  std::string token;      // --cluster-token
  std::string source_ip;  // the chosen NIC's address; empty lets the kernel pick
};

// Retries refused/unreachable connections until `deadline`, then throws Error(kNetwork):
// "could not reach the head at 10.0.0.5:29500 within 30 s: connection refused; check ...".
// Authentication failures are not retried (a wrong token will not become right).
Socket connect_to_head(const HeadAddress& head, Deadline deadline, std::chrono::milliseconds handshake_timeout);

}  // namespace tessera::dist
