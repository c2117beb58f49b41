#include "distributed/wire.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "distributed/messages.h"

namespace tessera::dist {
namespace {

using ::testing::HasSubstr;

NodeFingerprint sample_fingerprint() {
  NodeFingerprint f;
  f.version = "0.1.0 (abc)";
  f.config_sha256 = std::string(64, 'a');
  f.shards = {{"model-00001-of-00002.safetensors", 4'900'000'000ull, std::string(64, 'b')},
              {"model-00002-of-00002.safetensors", 1'000ull, std::string(64, 'c')}};
  f.dtype = "bfloat16";
  f.gpus = {"NVIDIA H200 (139 GiB)", "NVIDIA H200 (139 GiB)"};
  f.num_ranks = 2;
  f.hostname = "gpu-1";
  f.nic = "ens5";
  f.ip = "10.0.0.2";
  return f;
}

void expect_same(const NodeFingerprint& a, const NodeFingerprint& b) {
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.config_sha256, b.config_sha256);
  EXPECT_EQ(a.shards, b.shards);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.gpus, b.gpus);
  EXPECT_EQ(a.num_ranks, b.num_ranks);
  EXPECT_EQ(a.hostname, b.hostname);
  EXPECT_EQ(a.nic, b.nic);
  EXPECT_EQ(a.ip, b.ip);
}

TEST(Frame, RoundTrip) {
  std::vector<uint8_t> payload = {1, 2, 3, 4, 5};
  std::vector<uint8_t> bytes = encode_frame(MessageType::kStatusReply, payload);
  ASSERT_EQ(bytes.size(), kFrameHeaderBytes + payload.size());
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 4), "TSRA");
  size_t consumed = 0;
  std::optional<Frame> f = decode_frame(bytes, kMaxFrame, &consumed);
  ASSERT_TRUE(f);
  EXPECT_EQ(consumed, bytes.size());
  EXPECT_EQ(f->type, MessageType::kStatusReply);
  EXPECT_EQ(f->payload, payload);
}

TEST(Frame, TruncatedNeedsMoreBytes) {
  std::vector<uint8_t> bytes = encode_frame(MessageType::kHeartbeat, encode_u64(7));
  for (size_t n = 0; n < bytes.size(); ++n) {
    size_t consumed = 99;
    EXPECT_FALSE(decode_frame(std::span(bytes).first(n), kMaxFrame, &consumed)) << n;
    EXPECT_EQ(consumed, 0u);
  }
}

TEST(Frame, RejectsBadHeaders) {
  std::vector<uint8_t> good = encode_frame(MessageType::kHeartbeat, encode_u64(7));
  size_t consumed;
  auto expect_refused = [&](std::vector<uint8_t> bytes, const char* why) {
    try {
      decode_frame(bytes, kMaxFrame, &consumed);
      ADD_FAILURE() << "accepted: " << why;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
      EXPECT_THAT(e.what(), HasSubstr(why));
    }
  };
  auto bad = good;
  bad[0] ^= 0xff;
  expect_refused(bad, "bad frame magic");
  bad = good;
  bad[4] = 9;
  expect_refused(bad, "wire version 9");
  bad = good;
  bad[5] = 0;
  expect_refused(bad, "unknown message type");
  bad[5] = 200;
  expect_refused(bad, "unknown message type");
  bad = good;
  bad[6] = 1;
  expect_refused(bad, "reserved");
  bad = good;
  bad[8] = bad[9] = bad[10] = bad[11] = 0xff;  // 4 GiB payload claimed
  expect_refused(bad, "exceeds");
  // The unauthenticated limit is much smaller.
  std::vector<uint8_t> big = encode_frame(MessageType::kJoin, std::vector<uint8_t>(kMaxUnauthenticatedFrame + 1));
  EXPECT_THROW(decode_frame(big, kMaxUnauthenticatedFrame, &consumed), Error);
}

TEST(Frame, RandomBytesNeverCrash) {
  std::mt19937 rng(42);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> bytes(rng() % 64);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    if (i % 2 && bytes.size() >= 4) bytes[0] = 'T', bytes[1] = 'S', bytes[2] = 'R', bytes[3] = 'A';
    size_t consumed;
    try {
      if (auto f = decode_frame(bytes, kMaxFrame, &consumed)) {
        ++accepted;
        try {
          decode_any(f->type, f->payload);
        } catch (const Error&) {
        }
      }
    } catch (const Error&) {
    }
  }
  EXPECT_LT(accepted, 100);
}

TEST(Messages, JoinRoundTrip) {
  JoinRequest j{3, 4, sample_fingerprint()};
  JoinRequest back = decode_join(encode(j));
  EXPECT_EQ(back.node_rank, 3);
  EXPECT_EQ(back.nnodes, 4);
  expect_same(back.fingerprint, j.fingerprint);
}

TEST(Messages, ClusterTableAndStatusRoundTrip) {
  ClusterTable t;
  t.world_size = 4;
  t.nodes = {{0, 0, sample_fingerprint()}, {1, 2, sample_fingerprint()}};
  ClusterTable back = decode_cluster_table(encode(t));
  ASSERT_EQ(back.nodes.size(), 2u);
  EXPECT_EQ(back.nodes[1].first_rank, 2);
  EXPECT_EQ(back.describe_rank(3), "rank 3 (node 1, 10.0.0.2)");
  EXPECT_EQ(back.node_of_rank(1), 0);

  ClusterStatus s;
  s.nnodes = 2;
  s.world_size = 4;
  s.formed = true;
  s.nodes = {{0, 0, true, 0, 1, sample_fingerprint()}, {1, 2, false, 12000, 2, sample_fingerprint()}};
  ClusterStatus sb = decode_cluster_status(encode(s));
  ASSERT_EQ(sb.nodes.size(), 2u);
  EXPECT_FALSE(sb.nodes[1].alive);
  EXPECT_EQ(sb.nodes[1].ms_since_heartbeat, 12000);
  EXPECT_EQ(sb.nodes[1].joins, 2);
}

TEST(Messages, SmallOnesRoundTrip) {
  RankFailure f{1, 4, 4, "node 1 (10.0.0.2), ranks 4-7: no heartbeat"};
  EXPECT_EQ(decode_rank_failure(encode(f)).reason, f.reason);
  StoreEntry e{"gloo/world/rank_0", {1, 2}};
  EXPECT_EQ(decode_store_entry(encode(e)).value, e.value);
  std::vector<uint8_t> v;
  EXPECT_TRUE(decode_store_value(encode_store_value(true, e.value), &v));
  EXPECT_EQ(v, e.value);
  EXPECT_EQ(decode_ranks(encode_ranks({0, 5, 9})), (std::vector<int32_t>{0, 5, 9}));
  EXPECT_EQ(decode_text(encode_text("why")), "why");
}

TEST(Messages, EveryTruncationOfAJoinIsRefused) {
  std::vector<uint8_t> bytes = encode(JoinRequest{1, 2, sample_fingerprint()});
  for (size_t n = 0; n < bytes.size(); ++n) EXPECT_THROW(decode_join(std::span(bytes).first(n)), Error) << n;
  bytes.push_back(0);
  EXPECT_THROW(decode_join(bytes), Error);  // trailing byte
}

TEST(Messages, JobsRoundTripAndTruncationsAreRefused) {
  JobSubmit js;
  js.nodes = {3, 1};
  js.job.nnodes = 3;
  js.job.master_addr = "10.0.0.1";
  js.job.master_port = 40001;
  js.job.args = {"serve", "/models/x", "--tensor-parallel-size", "3"};
  JobSubmit back = decode_job_submit(encode(js));
  EXPECT_EQ(back.nodes, js.nodes);
  EXPECT_EQ(back.job.args, js.job.args);
  EXPECT_EQ(back.job.master_port, 40001);
  JobStart start = decode_job_start(encode(js.job));
  EXPECT_EQ(start.master_addr, "10.0.0.1");
  std::vector<uint8_t> bytes = encode(js);
  for (size_t n = 0; n < bytes.size(); ++n) EXPECT_THROW(decode_job_submit(std::span(bytes).first(n)), Error) << n;
  js.nodes = {1};  // two nodes named for a job of three
  EXPECT_THROW(decode_job_submit(encode(js)), Error);
  // A persistent cluster's join: rank -1 with nnodes 0, and nothing else with nnodes 0.
  EXPECT_EQ(decode_join(encode(JoinRequest{-1, 0, sample_fingerprint()})).node_rank, -1);
  EXPECT_THROW(decode_join(encode(JoinRequest{-1, 2, sample_fingerprint()})), Error);
}

TEST(Messages, LyingCountsAreRefusedBeforeAllocating) {
  WireWriter w;
  w.i32(4);
  w.u32(0x7fffffff);  // nodes claimed
  EXPECT_THROW(decode_cluster_table(w.data()), Error);
  WireWriter s;
  s.u32(0xffffffff);  // a 4 GiB string in a 4-byte payload
  WireReader r(s.data());
  EXPECT_THROW(r.str(), Error);
  EXPECT_THROW(decode_join(std::vector<uint8_t>{1, 0, 0, 0, 0, 0, 0, 0}), Error);  // node rank 1 of nnodes 0
}

}  // namespace
}  // namespace tessera::dist
