// The cluster probes (tessera doctor across nodes): a listener on an ephemeral port of each
// node's chosen NIC, the pair test another node runs against it (connect, latency, one TCP
// stream), a Gloo all-reduce among all nodes, and the head's checks of their results.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "distributed/socket.h"
#include "doctor/doctor.h"

namespace tessera::dist {
class ControlStoreClient;
}

namespace tessera::doctor {

// Answers probes on an ephemeral port of `ip` until destroyed: 'P' echoes one byte; 'B' + u64 n
// reads n bytes then answers 'K'.
class ProbeServer {
 public:
  explicit ProbeServer(const std::string& ip);
  ~ProbeServer();
  uint16_t port() const { return port_; }

 private:
  void loop();
  void serve(const dist::Socket& s);
  dist::Socket listener_;
  uint16_t port_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<std::thread> conns_;
};

struct PairResult {
  int from = 0, to = 0;
  bool reachable = false;
  std::string error;
  double rtt_ms = -1, gbps = -1;
};

// node `me` probes `peer`'s probe server: connect, 20 one-byte round trips (the median), one
// stream of o.stream_bytes. Never throws: a failure is the result's error.
PairResult probe(const NodeFacts& me, const NodeFacts& peer, const DoctorOptions& o);

// One node's results for the head: its probes, and its all-reduce's bus bandwidth or error.
std::vector<uint8_t> encode_pairs(const std::vector<PairResult>& v, double allreduce_gbps, const std::string& ar_error);
std::vector<PairResult> decode_pairs(std::span<const uint8_t> b, double* allreduce_gbps, std::string* ar_error);

// Bus bandwidth of a Gloo all-reduce among the nodes (nccl-tests' busbw: 2(n-1)/n x bytes / time).
double all_reduce_busbw(const std::shared_ptr<dist::ControlStoreClient>& store, const std::string& ip, int rank, int n,
                        size_t bytes);

// The head's checks of every link (reachability, latency, one TCP stream) and of the
// all-reduce's bus bandwidth `bw` (or its error).
std::vector<Check> link_checks(const std::vector<NodeFacts>& all, const std::vector<PairResult>& pairs, double bw,
                               const std::string& err, const DoctorOptions& o);

}  // namespace tessera::doctor
