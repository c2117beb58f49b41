#include "distributed/messages.h"

#include "core/error.h"

namespace tessera::dist {

namespace {

constexpr int32_t kMaxNodes = 4096;
constexpr int32_t kMaxWorld = 1 << 20;

void check_range(int64_t v, int64_t lo, int64_t hi, const char* what) {
  if (v < lo || v > hi) fail(ErrorKind::kCorrupt, "{} {} outside [{}, {}]", what, v, lo, hi);
}

void encode_node(WireWriter& w, const ClusterNode& n) {
  w.i32(n.node_rank);
  w.i32(n.first_rank);
  encode_fingerprint(w, n.fingerprint);
}

ClusterNode decode_node(WireReader& r) {
  ClusterNode n;
  n.node_rank = r.i32();
  check_range(n.node_rank, 0, kMaxNodes - 1, "node rank");
  n.first_rank = r.i32();
  check_range(n.first_rank, 0, kMaxWorld, "first rank");
  n.fingerprint = decode_fingerprint(r);
  return n;
}

}  // namespace

int ClusterTable::node_of_rank(int rank) const {
  for (const ClusterNode& n : nodes)
    if (rank >= n.first_rank && rank < n.first_rank + n.fingerprint.num_ranks) return n.node_rank;
  return -1;
}

std::string ClusterTable::describe_rank(int rank) const {
  int node = node_of_rank(rank);
  if (node < 0) return fmt::format("rank {}", rank);
  for (const ClusterNode& n : nodes)
    if (n.node_rank == node)
      return n.fingerprint.ip.empty() ? fmt::format("rank {} (node {})", rank, node)
                                      : fmt::format("rank {} (node {}, {})", rank, node, n.fingerprint.ip);
  return fmt::format("rank {}", rank);
}

std::vector<uint8_t> encode(const JoinRequest& m) {
  WireWriter w;
  w.i32(m.node_rank);
  w.i32(m.nnodes);
  encode_fingerprint(w, m.fingerprint);
  return w.take();
}

JoinRequest decode_join(std::span<const uint8_t> p) {
  WireReader r(p, "join");
  JoinRequest m;
  m.node_rank = r.i32();
  m.nnodes = r.i32();
  check_range(m.nnodes, 0, kMaxNodes, "nnodes");
  if (m.nnodes == 0)  // a persistent cluster's node: the head assigns the rank
    check_range(m.node_rank, -1, -1, "node rank");
  else
    check_range(m.node_rank, 0, m.nnodes - 1, "node rank");
  m.fingerprint = decode_fingerprint(r);
  r.expect_end();
  return m;
}

std::vector<uint8_t> encode(const ClusterTable& m) {
  WireWriter w;
  w.i32(m.world_size);
  w.u32(static_cast<uint32_t>(m.nodes.size()));
  for (const ClusterNode& n : m.nodes) encode_node(w, n);
  return w.take();
}

ClusterTable decode_cluster_table(std::span<const uint8_t> p) {
  WireReader r(p, "welcome");
  ClusterTable m;
  m.world_size = r.i32();
  check_range(m.world_size, 1, kMaxWorld, "world size");
  uint32_t n = r.count(8, kMaxNodes);
  for (uint32_t i = 0; i < n; ++i) m.nodes.push_back(decode_node(r));
  r.expect_end();
  return m;
}

std::vector<uint8_t> encode(const ClusterStatus& m) {
  WireWriter w;
  w.i32(m.nnodes);
  w.i32(m.world_size);
  w.u8(m.formed ? 1 : 0);
  w.u32(static_cast<uint32_t>(m.nodes.size()));
  for (const NodeStatus& n : m.nodes) {
    w.i32(n.node_rank);
    w.i32(n.first_rank);
    w.u8(n.alive ? 1 : 0);
    w.i64(n.ms_since_heartbeat);
    w.i32(n.joins);
    encode_fingerprint(w, n.fingerprint);
  }
  return w.take();
}

ClusterStatus decode_cluster_status(std::span<const uint8_t> p) {
  WireReader r(p, "status reply");
  ClusterStatus m;
  m.nnodes = r.i32();
  check_range(m.nnodes, 0, kMaxNodes, "nnodes");
  m.world_size = r.i32();
  check_range(m.world_size, 0, kMaxWorld, "world size");
  m.formed = r.u8() != 0;
  uint32_t n = r.count(21, kMaxNodes);
  for (uint32_t i = 0; i < n; ++i) {
    NodeStatus s;
    s.node_rank = r.i32();
    check_range(s.node_rank, 0, kMaxNodes - 1, "node rank");
    s.first_rank = r.i32();
    s.alive = r.u8() != 0;
    s.ms_since_heartbeat = r.i64();
    s.joins = r.i32();
    s.fingerprint = decode_fingerprint(r);
    m.nodes.push_back(std::move(s));
  }
  r.expect_end();
  return m;
}

std::vector<uint8_t> encode(const RankFailure& m) {
  WireWriter w;
  w.i32(m.node_rank);
  w.i32(m.first_rank);
  w.i32(m.num_ranks);
  w.str(m.reason);
  return w.take();
}

RankFailure decode_rank_failure(std::span<const uint8_t> p) {
  WireReader r(p, "rank failed");
  RankFailure m;
  m.node_rank = r.i32();
  m.first_rank = r.i32();
  m.num_ranks = r.i32();
  check_range(m.node_rank, -1, kMaxNodes - 1, "node rank");
  check_range(m.num_ranks, 0, kMaxWorld, "rank count");
  m.reason = r.str(64 * 1024);
  r.expect_end();
  return m;
}

std::vector<uint8_t> encode(const StoreEntry& m) {
  WireWriter w;
  w.str(m.key);
  w.bytes(m.value);
  return w.take();
}

StoreEntry decode_store_entry(std::span<const uint8_t> p) {
  WireReader r(p, "store set");
  StoreEntry m;
  m.key = r.str(kMaxStoreKey);
  m.value = r.bytes(kMaxStoreValue);
  r.expect_end();
  return m;
}

namespace {

void encode_job(WireWriter& w, const JobStart& m) {
  w.i32(m.nnodes);
  w.i32(m.node_rank);
  w.str(m.master_addr);
  w.u16(m.master_port);
  w.u32(static_cast<uint32_t>(m.args.size()));
  for (const std::string& a : m.args) w.str(a);
}

JobStart decode_job(WireReader& r) {
  JobStart m;
  m.nnodes = r.i32();
  check_range(m.nnodes, 2, kMaxNodes, "nnodes");
  m.node_rank = r.i32();
  check_range(m.node_rank, 0, m.nnodes - 1, "node rank");
  m.master_addr = r.str(1024);
  m.master_port = r.u16();
  uint32_t n = r.count(4, kMaxJobArgs);
  for (uint32_t i = 0; i < n; ++i) m.args.push_back(r.str(64 * 1024));
  return m;
}

}  // namespace

std::vector<uint8_t> encode(const JobStart& m) {
  WireWriter w;
  encode_job(w, m);
  return w.take();
}

JobStart decode_job_start(std::span<const uint8_t> p) {
  WireReader r(p, "job start");
  JobStart m = decode_job(r);
  r.expect_end();
  return m;
}

std::vector<uint8_t> encode(const JobSubmit& m) {
  WireWriter w;
  w.u32(static_cast<uint32_t>(m.nodes.size()));
  for (int32_t n : m.nodes) w.i32(n);
  encode_job(w, m.job);
  return w.take();
}

JobSubmit decode_job_submit(std::span<const uint8_t> p) {
  WireReader r(p, "job submit");
  JobSubmit m;
  uint32_t n = r.count(4, kMaxNodes);
  for (uint32_t i = 0; i < n; ++i) {
    m.nodes.push_back(r.i32());
    check_range(m.nodes.back(), 1, kMaxNodes - 1, "node rank");
  }
  m.job = decode_job(r);
  r.expect_end();
  if (static_cast<int32_t>(m.nodes.size()) != m.job.nnodes - 1)
    fail(ErrorKind::kCorrupt, "job submit: {} nodes for a job of {} nodes", m.nodes.size(), m.job.nnodes);
  return m;
}

std::vector<uint8_t> encode_text(const std::string& s) {
  WireWriter w;
  w.str(s);
  return w.take();
}

std::string decode_text(std::span<const uint8_t> p, size_t max_len) {
  WireReader r(p, "text");
  std::string s = r.str(max_len);
  r.expect_end();
  return s;
}

std::vector<uint8_t> encode_u64(uint64_t v) {
  WireWriter w;
  w.u64(v);
  return w.take();
}

uint64_t decode_u64(std::span<const uint8_t> p) {
  WireReader r(p, "heartbeat");
  uint64_t v = r.u64();
  r.expect_end();
  return v;
}

std::vector<uint8_t> encode_ranks(const std::vector<int32_t>& ranks) {
  WireWriter w;
  w.u32(static_cast<uint32_t>(ranks.size()));
  for (int32_t v : ranks) w.i32(v);
  return w.take();
}

std::vector<int32_t> decode_ranks(std::span<const uint8_t> p) {
  WireReader r(p, "rank list");
  uint32_t n = r.count(4, kMaxWorld);
  std::vector<int32_t> out(n);
  for (uint32_t i = 0; i < n; ++i) {
    out[i] = r.i32();
    check_range(out[i], 0, kMaxWorld, "rank");
  }
  r.expect_end();
  return out;
}

std::vector<uint8_t> encode_store_value(bool found, std::span<const uint8_t> value) {
  WireWriter w;
  w.u8(found ? 1 : 0);
  w.bytes(value);
  return w.take();
}

bool decode_store_value(std::span<const uint8_t> p, std::vector<uint8_t>* value) {
  WireReader r(p, "store value");
  uint8_t found = r.u8();
  if (found > 1) fail(ErrorKind::kCorrupt, "store value: found flag {}", found);
  *value = r.bytes(kMaxStoreValue);
  r.expect_end();
  return found == 1;
}

void decode_any(MessageType type, std::span<const uint8_t> payload) {
  std::vector<uint8_t> scratch;
  switch (type) {
    case MessageType::kChallenge: {
      WireReader r(payload, "challenge");
      r.u16();
      uint8_t nonce[32];
      r.raw(nonce, 32);
      r.expect_end();
      return;
    }
    case MessageType::kAuthResponse: {
      WireReader r(payload, "auth response");
      uint8_t b[64];
      r.raw(b, 64);
      r.expect_end();
      return;
    }
    case MessageType::kAuthOk: {
      WireReader r(payload, "auth ok");
      uint8_t b[32];
      r.raw(b, 32);
      r.expect_end();
      return;
    }
    case MessageType::kJoin:
      decode_join(payload);
      return;
    case MessageType::kWelcome:
      decode_cluster_table(payload);
      return;
    case MessageType::kReject:
      decode_text(payload);
      return;
    case MessageType::kHeartbeat:
      decode_u64(payload);
      return;
    case MessageType::kStatusQuery:
      WireReader(payload, "status query").expect_end();
      return;
    case MessageType::kStatusReply:
      decode_cluster_status(payload);
      return;
    case MessageType::kRankFailed:
      decode_rank_failure(payload);
      return;
    case MessageType::kStoreSet:
      decode_store_entry(payload);
      return;
    case MessageType::kStoreGet:
      decode_text(payload, kMaxStoreKey);
      return;
    case MessageType::kStoreValue:
      decode_store_value(payload, &scratch);
      return;
    case MessageType::kStoreOk:
      WireReader(payload, "store ok").expect_end();
      return;
    case MessageType::kLeave:
      WireReader(payload, "leave").expect_end();
      return;
    case MessageType::kJobSubmit:
      decode_job_submit(payload);
      return;
    case MessageType::kJobStart:
      decode_job_start(payload);
      return;
    case MessageType::kJobAccepted:
      WireReader(payload, "job accepted").expect_end();
      return;
    case MessageType::kRankHello:
    case MessageType::kLivenessQuery:
    case MessageType::kLivenessReply:
      decode_ranks(payload);
      return;
  }
  fail(ErrorKind::kCorrupt, "unknown message type {}", static_cast<int>(type));
}

}  // namespace tessera::dist
