// Payloads of the control-channel messages (the frame around them is in wire.h).
// Each struct has an encode function producing the payload bytes and a decode function
// that refuses anything malformed with Error(kCorrupt), including trailing bytes.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "distributed/fingerprint.h"
#include "distributed/wire.h"

namespace tessera::dist {

// node_rank -1 with nnodes 0: a node of a persistent cluster (`tessera node start --address`);
// the head assigns its rank.
struct JoinRequest {
  int32_t node_rank = 0;
  int32_t nnodes = 1;
  NodeFingerprint fingerprint;
};

struct ClusterNode {
  int32_t node_rank = 0;
  int32_t first_rank = 0;  // world ranks [first_rank, first_rank + fingerprint.num_ranks)
  NodeFingerprint fingerprint;
};

// What every node learns once all have joined.
struct ClusterTable {
  int32_t world_size = 0;
  std::vector<ClusterNode> nodes;  // by node rank
  // "rank 5 (node 1, 10.0.0.2)".
  std::string describe_rank(int rank) const;
  int node_of_rank(int rank) const;  // -1 if out of range
};

struct NodeStatus {
  int32_t node_rank = 0;
  int32_t first_rank = 0;
  bool alive = false;
  int64_t ms_since_heartbeat = -1;  // -1: never
  int32_t joins = 0;                // > 1 after a rejoin
  NodeFingerprint fingerprint;
};

struct ClusterStatus {
  int32_t nnodes = 0;
  int32_t world_size = 0;
  bool formed = false;  // every node has joined at least once
  std::vector<NodeStatus> nodes;
};

struct RankFailure {
  int32_t node_rank = -1;
  int32_t first_rank = -1;
  int32_t num_ranks = 0;
  std::string reason;
};

// A job for a node of a persistent cluster: run `tessera ARGS` as node `node_rank` of
// `nnodes`, the job's head at master_addr:master_port (the per-node --nnodes launch).
struct JobStart {
  int32_t nnodes = 2;
  int32_t node_rank = 1;
  std::string master_addr;
  uint16_t master_port = 0;
  std::vector<std::string> args;  // the verb and its flags, without the per-node ones
};

// To the head of a persistent cluster: start `job` on these nodes (their cluster node
// ranks); nodes[i] becomes the job's node rank i + 1 (the submitter is node 0).
struct JobSubmit {
  std::vector<int32_t> nodes;
  JobStart job;
};

inline constexpr size_t kMaxJobArgs = 4096;

struct StoreEntry {
  std::string key;
  std::vector<uint8_t> value;
};

inline constexpr size_t kMaxStoreKey = 1024;
inline constexpr size_t kMaxStoreValue = 1 << 20;

std::vector<uint8_t> encode(const JoinRequest& m);
std::vector<uint8_t> encode(const ClusterTable& m);
std::vector<uint8_t> encode(const ClusterStatus& m);
std::vector<uint8_t> encode(const RankFailure& m);
std::vector<uint8_t> encode(const StoreEntry& m);
std::vector<uint8_t> encode(const JobStart& m);
std::vector<uint8_t> encode(const JobSubmit& m);
std::vector<uint8_t> encode_text(const std::string& s);                // reject reasons, store keys
std::vector<uint8_t> encode_u64(uint64_t v);                           // heartbeats
std::vector<uint8_t> encode_ranks(const std::vector<int32_t>& ranks);  // liveness query/reply, rank hello
std::vector<uint8_t> encode_store_value(bool found, std::span<const uint8_t> value);

JoinRequest decode_join(std::span<const uint8_t> p);
ClusterTable decode_cluster_table(std::span<const uint8_t> p);
ClusterStatus decode_cluster_status(std::span<const uint8_t> p);
RankFailure decode_rank_failure(std::span<const uint8_t> p);
StoreEntry decode_store_entry(std::span<const uint8_t> p);
JobStart decode_job_start(std::span<const uint8_t> p);
JobSubmit decode_job_submit(std::span<const uint8_t> p);
std::string decode_text(std::span<const uint8_t> p, size_t max_len = 64 * 1024);
uint64_t decode_u64(std::span<const uint8_t> p);
std::vector<int32_t> decode_ranks(std::span<const uint8_t> p);
// Returns found; fills value.
bool decode_store_value(std::span<const uint8_t> p, std::vector<uint8_t>* value);

// Decodes the payload with the decoder its type calls for (the fuzz target's entry point).
void decode_any(MessageType type, std::span<const uint8_t> payload);

}  // namespace tessera::dist
