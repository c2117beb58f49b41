#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <future>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "distributed/auth.h"
#include "distributed/control_store.h"
#include "distributed/rendezvous_client.h"
#include "distributed/rendezvous_server.h"
#include "test_util.h"

namespace tessera::dist {
namespace {

using std::chrono::milliseconds;
using ::testing::AllOf;
using testing::FakeModelDir;
using ::testing::HasSubstr;

// Every log line of the process, kept in memory. Installed once before any thread exists
// (adding or removing sinks while server threads log would be a data race).
class CaptureSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::string text() {
    std::lock_guard<std::mutex> lock(mutex_);
    return text_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    text_.append(formatted.data(), formatted.size());
  }
  void flush_() override {}

 private:
  std::string text_;
};

CaptureSink& capture_sink() {
  static auto sink = [] {
    auto s = std::make_shared<CaptureSink>();
    spdlog::default_logger()->sinks().push_back(s);
    return s;
  }();
  return *sink;
}
const bool kCaptureInstalled = (capture_sink(), true);

// The log lines written since construction.
class LogCapture {
 public:
  LogCapture() : start_(capture_sink().text().size()) {}
  std::string text() { return capture_sink().text().substr(start_); }
  // Server threads log after answering; give them a moment.
  std::string wait_for(const std::string& needle, milliseconds limit = milliseconds(2000)) {
    auto deadline = Clock::now() + limit;
    while (text().find(needle) == std::string::npos && Clock::now() < deadline)
      std::this_thread::sleep_for(milliseconds(10));
    return text();
  }

 private:
  size_t start_;
};

constexpr const char* kToken = "test-token";

struct Cluster {
  explicit Cluster(int nnodes, milliseconds join_timeout = milliseconds(10000)) : model(2) {
    head_fp = compute_fingerprint(model.path());
    head_fp.ip = "127.0.0.1";
    RendezvousServerOptions o;
    o.token = kToken;
    o.nnodes = nnodes;
    o.head_fingerprint = head_fp;
    o.join_timeout = join_timeout;
    o.heartbeat_timeout = milliseconds(1500);
    server = std::make_unique<RendezvousServer>(o);
  }
  HeadAddress head(const std::string& token = kToken) const { return {"127.0.0.1", server->port(), token, ""}; }
  RendezvousClientOptions client_options(int node_rank, int nnodes, const NodeFingerprint& fp) const {
    RendezvousClientOptions o;
    o.head = head();
    o.node_rank = node_rank;
    o.nnodes = nnodes;
    o.fingerprint = fp;
    o.join_timeout = milliseconds(10000);
    o.heartbeat_interval = milliseconds(100);
    o.heartbeat_timeout = milliseconds(2000);
    return o;
  }
  // Joins on a thread (the constructor blocks until the cluster forms).
  std::future<std::unique_ptr<RendezvousClient>> join_async(int node_rank, int nnodes, NodeFingerprint fp) {
    RendezvousClientOptions o = client_options(node_rank, nnodes, fp);
    return std::async(std::launch::async, [o] { return std::make_unique<RendezvousClient>(o); });
  }

  FakeModelDir model;
  NodeFingerprint head_fp;
  std::unique_ptr<RendezvousServer> server;
};

NodeFingerprint node_fp(const Cluster& c, int ranks = 2) {
  NodeFingerprint f = c.head_fp;
  f.num_ranks = ranks;
  return f;
}

TEST(Rendezvous, FourNodesFormACluster) {
  Cluster c(4);
  auto n1 = c.join_async(1, 4, node_fp(c, 2));
  auto n2 = c.join_async(2, 4, node_fp(c, 2));
  auto n3 = c.join_async(3, 4, node_fp(c, 3));
  ClusterTable t = c.server->wait_for_nodes();
  EXPECT_EQ(t.world_size, 1 + 2 + 2 + 3);
  auto a = n1.get(), b = n2.get(), d = n3.get();
  EXPECT_EQ(d->cluster().world_size, 8);
  ASSERT_EQ(d->cluster().nodes.size(), 4u);
  EXPECT_EQ(d->cluster().nodes[3].first_rank, 5);
  EXPECT_EQ(d->cluster().describe_rank(6), "rank 6 (node 3, 127.0.0.1)");

  ClusterStatus s = query_cluster_status(c.head(), milliseconds(3000));
  EXPECT_TRUE(s.formed);
  ASSERT_EQ(s.nodes.size(), 4u);
  for (const NodeStatus& n : s.nodes) EXPECT_TRUE(n.alive) << n.node_rank;
}

TEST(Rendezvous, MismatchedShardRefusedNamingNodeAndFile) {
  Cluster c(2, milliseconds(3000));
  FakeModelDir other(2);
  other.write_shard(FakeModelDir::name(2, 2), 4096);
  NodeFingerprint fp = compute_fingerprint(other.path());
  fp.ip = "127.0.0.1";
  LogCapture log;
  try {
    RendezvousClient bad(c.client_options(1, 2, fp));
    FAIL() << "joined with a different shard";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("node 1 (127.0.0.1): model-00002-of-00002.safetensors differs from the head's"));
  }
  EXPECT_THAT(log.wait_for("safetensors differs"), HasSubstr("model-00002-of-00002.safetensors differs"));
  // A correct node still gets in.
  auto good = c.join_async(1, 2, node_fp(c));
  EXPECT_EQ(c.server->wait_for_nodes().world_size, 3);
  good.get();
}

TEST(Rendezvous, WrongTokenRefusedAndClusterKeepsWorking) {
  Cluster c(2);
  LogCapture log;
  RendezvousClientOptions o = c.client_options(1, 2, node_fp(c));
  o.head.token = "wrong";
  o.join_timeout = milliseconds(2000);
  EXPECT_THAT([&] { RendezvousClient bad(o); }, ::testing::ThrowsMessage<Error>(HasSubstr("cluster-token")));
  EXPECT_THAT(log.wait_for("failed authentication"), HasSubstr("failed authentication"));
  auto good = c.join_async(1, 2, node_fp(c));
  EXPECT_EQ(c.server->wait_for_nodes().nodes.size(), 2u);
  good.get();
}

TEST(Rendezvous, GarbagePeersAreDroppedWithALogLine) {
  Cluster c(2);
  LogCapture log;
  std::mt19937 rng(7);
  {  // random bytes instead of an auth response
    Socket s = connect_tcp("127.0.0.1", c.server->port(), deadline_after(milliseconds(2000)));
    std::vector<uint8_t> junk(300);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    write_all(s, junk.data(), junk.size(), deadline_after(milliseconds(2000)));
    std::this_thread::sleep_for(milliseconds(100));
  }
  {  // a well-formed header claiming a huge frame before authenticating
    Socket s = connect_tcp("127.0.0.1", c.server->port(), deadline_after(milliseconds(2000)));
    std::vector<uint8_t> header = encode_frame(MessageType::kAuthResponse, {});
    header[8] = header[9] = header[10] = 0xff;
    write_all(s, header.data(), header.size(), deadline_after(milliseconds(2000)));
    std::this_thread::sleep_for(milliseconds(100));
  }
  {  // authenticated, then a truncated frame and a hang-up
    Socket s = connect_tcp("127.0.0.1", c.server->port(), deadline_after(milliseconds(2000)));
    authenticate_to_server(s, kToken, deadline_after(milliseconds(2000)));
    std::vector<uint8_t> frame = encode_frame(MessageType::kJoin, std::vector<uint8_t>(100, 1));
    write_all(s, frame.data(), 40, deadline_after(milliseconds(2000)));
  }
  {  // authenticated, then a frame only the head may send
    Socket s = connect_tcp("127.0.0.1", c.server->port(), deadline_after(milliseconds(2000)));
    authenticate_to_server(s, kToken, deadline_after(milliseconds(2000)));
    send_frame(s, MessageType::kWelcome, std::vector<uint8_t>{1, 2, 3}, deadline_after(milliseconds(2000)));
    std::this_thread::sleep_for(milliseconds(100));
  }
  std::string text = log.wait_for("only the head sends");
  EXPECT_THAT(text, HasSubstr("dropping control-channel peer 127.0.0.1:"));
  EXPECT_THAT(text, HasSubstr("exceeds the 4096-byte limit"));
  EXPECT_THAT(text, HasSubstr("only the head sends"));
  auto good = c.join_async(1, 2, node_fp(c));
  EXPECT_EQ(c.server->wait_for_nodes().nodes.size(), 2u);
  good.get();
}

TEST(Rendezvous, MissingNodeTimesOutNamingIt) {
  Cluster c(3, milliseconds(800));
  auto start = Clock::now();
  auto n1 = std::async(std::launch::async, [&] {
    RendezvousClientOptions o = c.client_options(1, 3, node_fp(c));
    o.join_timeout = milliseconds(1000);
    RendezvousClient client(o);
  });
  EXPECT_THAT(
      [&] { c.server->wait_for_nodes(); },
      ::testing::ThrowsMessage<Error>(HasSubstr("node 2 never joined within 1 s (joined: node 0 (127.0.0.1), node 1")));
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  EXPECT_THAT([&] { n1.get(); }, ::testing::ThrowsMessage<Error>(HasSubstr("did not form within 1 s")));
  EXPECT_LT(Clock::now() - start, milliseconds(3000));
}

TEST(Rendezvous, UnreachableHeadIsAClearErrorInTime) {
  RendezvousClientOptions o;
  o.head = {"127.0.0.1", testing::free_port(), kToken, ""};
  o.join_timeout = milliseconds(500);
  auto start = Clock::now();
  EXPECT_THAT([&] { RendezvousClient client(o); },
              ::testing::ThrowsMessage<Error>(HasSubstr("could not reach the head at 127.0.0.1:")));
  EXPECT_LT(Clock::now() - start, milliseconds(1500));
}

TEST(Rendezvous, RejoinAfterCrashReplacesTheEntry) {
  Cluster c(3);
  std::promise<RankFailure> failed;
  auto once = std::make_shared<std::once_flag>();
  c.server->set_on_node_failure(
      [&, once](const RankFailure& f) { std::call_once(*once, [&] { failed.set_value(f); }); });
  auto f1 = c.join_async(1, 3, node_fp(c));
  auto f2 = c.join_async(2, 3, node_fp(c));
  c.server->wait_for_nodes();
  auto n1 = f1.get();
  auto n2 = f2.get();

  n2->simulate_crash();
  auto future = failed.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(3)), std::future_status::ready);
  RankFailure f = future.get();
  EXPECT_EQ(f.node_rank, 2);
  EXPECT_THAT(f.reason, HasSubstr("node 2 (127.0.0.1), ranks 3-4"));
  // The survivor hears about it.
  auto deadline = Clock::now() + std::chrono::seconds(3);
  while (!n1->failure() && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(n1->failure());
  EXPECT_EQ(n1->failure()->node_rank, 2);

  // The restarted node joins again with the same rank and is welcomed at once.
  auto again = c.join_async(2, 3, node_fp(c)).get();
  c.server->set_on_node_failure(nullptr);
  EXPECT_EQ(again->cluster().world_size, 5);
  ClusterStatus s = c.server->status();
  ASSERT_EQ(s.nodes.size(), 3u);
  EXPECT_TRUE(s.nodes[2].alive);
  EXPECT_EQ(s.nodes[2].joins, 2);
}

// A second process asking for a node rank that a live node holds (the same host, or another host
// once the job runs) is refused naming the rank and the holder; the holder stays, nothing fails.
TEST(Rendezvous, RankHeldByALiveNodeIsRefusedNamingTheHolder) {
  Cluster c(3);
  c.server->set_on_node_failure([](const RankFailure& f) { ADD_FAILURE() << "a refused join failed " << f.reason; });
  NodeFingerprint holder = node_fp(c);
  holder.hostname = "gnode10";
  LogCapture log;
  auto first = c.join_async(1, 3, holder);  // waits for the cluster: holds rank 1 before it forms
  log.wait_for("node 1 (127.0.0.1) joined");
  EXPECT_THAT([&] { RendezvousClient again(c.client_options(1, 3, holder)); },
              ::testing::ThrowsMessage<Error>(AllOf(
                  HasSubstr("the head refused this node: node rank 1 is held by node 1 (host gnode10, 127.0.0.1), "
                            "which is alive (joined "),
                  HasSubstr("waiting for the other nodes); refused host gnode10 (127.0.0.1) from 127.0.0.1:"),
                  HasSubstr("every node needs its own --node-rank (0..2)"))));
  auto second = c.join_async(2, 3, node_fp(c));
  c.server->wait_for_nodes();
  auto n1 = first.get();
  auto n2 = second.get();

  // The job runs: the same host again, then another host.
  EXPECT_THAT([&] { RendezvousClient again(c.client_options(1, 3, holder)); },
              ::testing::ThrowsMessage<Error>(
                  AllOf(HasSubstr("node rank 1 is held by node 1 (host gnode10, 127.0.0.1), which is alive (last "
                                  "heartbeat "),
                        HasSubstr(" s ago, in the running job)"))));
  NodeFingerprint other = node_fp(c);
  other.hostname = "gnode20";
  other.ip = "10.0.0.3";
  EXPECT_THAT([&] { RendezvousClient again(c.client_options(1, 3, other)); },
              ::testing::ThrowsMessage<Error>(
                  AllOf(HasSubstr("node rank 1 is held by node 1 (host gnode10, 127.0.0.1), which is alive"),
                        HasSubstr("refused host gnode20 (10.0.0.3)"))));
  EXPECT_THAT(log.wait_for("refused 127.0.0.1:"), HasSubstr("node rank 1 is held by node 1"));
  std::this_thread::sleep_for(milliseconds(300));  // several heartbeats
  EXPECT_FALSE(n1->failure()) << n1->failure()->reason;
  EXPECT_TRUE(n1->confirm_membership(milliseconds(2000)));
  ClusterStatus s = c.server->status();
  ASSERT_EQ(s.nodes.size(), 3u);
  EXPECT_TRUE(s.nodes[1].alive);
  EXPECT_EQ(s.nodes[1].joins, 1);
  EXPECT_EQ(s.nodes[1].fingerprint.hostname, "gnode10");
  EXPECT_THAT(log.text(), ::testing::Not(HasSubstr("closed by the node")));
  c.server->set_on_node_failure(nullptr);
}

// A node that stops answering (a hung or stopped process) is declared dead; the head tells the node
// itself before it closes the connection, so the node learns it was dropped when it wakes up.
TEST(Rendezvous, NodeDeclaredDeadIsToldSo) {
  Cluster c(2);
  std::promise<RankFailure> failed;
  auto once = std::make_shared<std::once_flag>();
  c.server->set_on_node_failure(
      [&, once](const RankFailure& f) { std::call_once(*once, [&] { failed.set_value(f); }); });
  LogCapture log;
  Socket s = connect_tcp("127.0.0.1", c.server->port(), deadline_after(milliseconds(2000)));
  authenticate_to_server(s, kToken, deadline_after(milliseconds(2000)));
  send_frame(s, MessageType::kJoin, encode(JoinRequest{1, 2, node_fp(c)}), deadline_after(milliseconds(2000)));
  ASSERT_EQ(recv_frame(s, kMaxFrame, deadline_after(milliseconds(2000)))->type, MessageType::kWelcome);
  auto future = failed.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(4)), std::future_status::ready);
  c.server->set_on_node_failure(nullptr);
  std::optional<Frame> notice = recv_frame(s, kMaxFrame, deadline_after(milliseconds(2000)));
  ASSERT_TRUE(notice);
  ASSERT_EQ(notice->type, MessageType::kRankFailed);
  RankFailure f = decode_rank_failure(notice->payload);
  EXPECT_EQ(f.node_rank, 1);
  EXPECT_THAT(f.reason, HasSubstr("node 1 (127.0.0.1), ranks 1-2: no heartbeat for 1."));
  EXPECT_FALSE(recv_frame(s, kMaxFrame, deadline_after(milliseconds(2000))));  // then the head closes it
  EXPECT_THAT(log.wait_for("no heartbeat for"), ::testing::Not(HasSubstr("closed by the node")));
}

// A stand-in head: authenticates one node, welcomes it, echoes its heartbeats until told to stop
// echoing, and can send it any frame.
class FakeHead {
 public:
  FakeHead() : listener_(listen_tcp("127.0.0.1", 0)) {}
  ~FakeHead() {
    done_ = true;
    conn_.shutdown();
    if (thread_.joinable()) thread_.join();
  }
  uint16_t port() const { return local_port(listener_); }
  void start(ClusterTable table) {
    thread_ = std::thread([this, table] {
      try {
        conn_ = accept_tcp(listener_, deadline_after(milliseconds(5000)));
        authenticate_client(conn_, kToken, deadline_after(milliseconds(2000)));
        recv_frame(conn_, kMaxFrame, deadline_after(milliseconds(2000)));  // the join
        send(MessageType::kWelcome, encode(table));
        while (!done_) {
          if (!wait_readable(conn_, milliseconds(50))) continue;
          std::optional<Frame> f = recv_frame(conn_, kMaxFrame, deadline_after(milliseconds(2000)));
          if (!f) return;
          if (f->type == MessageType::kHeartbeat && echo_) send(MessageType::kHeartbeat, f->payload);
        }
      } catch (const Error&) {
      }
    });
  }
  void send(MessageType type, std::span<const uint8_t> payload) {
    std::lock_guard<std::mutex> lock(mu_);
    send_frame(conn_, type, payload, deadline_after(milliseconds(2000)));
  }
  std::atomic<bool> echo_{true};

 private:
  Socket listener_, conn_;
  std::mutex mu_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

TEST(Rendezvous, NodeToldItWasDeclaredDeadSaysSoAndIsNoLongerAMember) {
  Cluster c(2);  // for its fingerprints
  FakeHead head;
  ClusterTable table;
  table.world_size = 2;
  table.nodes = {{0, 0, c.head_fp}, {1, 1, node_fp(c, 1)}};
  head.start(table);
  RendezvousClientOptions o = c.client_options(1, 2, node_fp(c, 1));
  o.head.port = head.port();
  RendezvousClient node(o);
  EXPECT_TRUE(node.confirm_membership(milliseconds(2000)));
  head.echo_ = false;  // the head no longer counts the node: it echoes nothing
  auto start = Clock::now();
  EXPECT_FALSE(node.confirm_membership(milliseconds(300)));
  EXPECT_GE(Clock::now() - start, milliseconds(300));
  head.send(MessageType::kRankFailed,
            encode(RankFailure{1, 1, 1, "node 1 (127.0.0.1), rank 1: no heartbeat for 10.0 s"}));
  auto deadline = Clock::now() + std::chrono::seconds(2);
  while (!node.failure() && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(node.failure());
  EXPECT_EQ(node.failure()->node_rank, 1);
  EXPECT_THAT(node.failure()->reason,
              HasSubstr("the head at 127.0.0.1:" + std::to_string(head.port()) +
                        " declared this node dead: node 1 (127.0.0.1), rank 1: no heartbeat for 10.0 s"));
}

TEST(Rendezvous, NodeWhoseHeadClosesSaysTheHeadIsGone) {
  Cluster c(2);
  auto n1 = c.join_async(1, 2, node_fp(c));
  c.server->wait_for_nodes();
  auto node = n1.get();
  EXPECT_TRUE(node->confirm_membership(milliseconds(2000)));
  c.server.reset();  // the head's process ends
  auto deadline = Clock::now() + std::chrono::seconds(2);
  while (!node->failure() && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(node->failure());
  EXPECT_EQ(node->failure()->node_rank, 0);
  EXPECT_THAT(node->failure()->reason, HasSubstr("is gone: it closed the control connection"));
  EXPECT_FALSE(node->confirm_membership(milliseconds(500)));
}

// Every node got the same rank (a rank computed once for the whole job, as an sbatch script that
// expands $SLURM_NODEID in the batch shell does): the second claimant is refused naming both
// hosts, and the head fails with the same message instead of waiting for nodes that never come.
TEST(Rendezvous, TwoHostsClaimingOneNodeRankAreRefusedNamingBoth) {
  Cluster c(3);
  NodeFingerprint a = node_fp(c), b = node_fp(c);
  a.hostname = "gnode10";
  a.ip = "10.0.0.2";
  b.hostname = "gnode20";
  b.ip = "10.0.0.3";
  auto first = c.join_async(1, 3, a);  // waits for the cluster
  LogCapture log;
  log.wait_for("node 1 (10.0.0.2) joined");
  auto head = std::async(std::launch::async, [&] { c.server->wait_for_nodes(); });
  EXPECT_THAT([&] { c.join_async(1, 3, b).get(); },
              ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("two nodes claim node rank 1: host gnode10 (10.0.0.2) "
                                                              "joined first, host gnode20 (10.0.0.3) now"),
                                                    HasSubstr("$SLURM_NODEID in the batch shell"))));
  ASSERT_EQ(head.wait_for(std::chrono::seconds(3)), std::future_status::ready);
  EXPECT_THAT([&] { head.get(); }, ::testing::ThrowsMessage<Error>(HasSubstr("two nodes claim node rank 1")));
  c.server.reset();  // the first claimant's wait ends with the head
  EXPECT_THROW(first.get(), Error);
}

TEST(Rendezvous, SilentNodeMissesHeartbeats) {
  Cluster c(2);
  std::promise<RankFailure> failed;
  auto once = std::make_shared<std::once_flag>();
  c.server->set_on_node_failure(
      [&, once](const RankFailure& f) { std::call_once(*once, [&] { failed.set_value(f); }); });
  // A node that joins by hand and then never sends a heartbeat (hung process, cut cable).
  Socket s = connect_tcp("127.0.0.1", c.server->port(), deadline_after(milliseconds(2000)));
  authenticate_to_server(s, kToken, deadline_after(milliseconds(2000)));
  send_frame(s, MessageType::kJoin, encode(JoinRequest{1, 2, node_fp(c)}), deadline_after(milliseconds(2000)));
  ASSERT_EQ(recv_frame(s, kMaxFrame, deadline_after(milliseconds(2000)))->type, MessageType::kWelcome);
  auto start = Clock::now();
  auto future = failed.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(4)), std::future_status::ready);
  EXPECT_THAT(future.get().reason, HasSubstr("no heartbeat for 1."));
  EXPECT_LT(Clock::now() - start, milliseconds(3000));
  c.server->set_on_node_failure(nullptr);
}

TEST(Rendezvous, NnodesAndRankZeroChecked) {
  Cluster c(2, milliseconds(2000));
  EXPECT_THAT([&] { RendezvousClient bad(c.client_options(1, 3, node_fp(c))); },
              ::testing::ThrowsMessage<Error>(HasSubstr("--nnodes 3 but the head has --nnodes 2")));
  EXPECT_THAT([&] { RendezvousClient bad(c.client_options(0, 2, node_fp(c))); },
              ::testing::ThrowsMessage<Error>(HasSubstr("node rank 0 is the head")));
}

// `tessera node start`: a head whose nodes join at any time, numbered by the head.
struct PersistentCluster {
  PersistentCluster() {
    RendezvousServerOptions o;
    o.token = kToken;
    o.persistent = true;
    o.head_fingerprint.version = "v1";
    o.head_fingerprint.num_ranks = 1;
    o.head_fingerprint.ip = "127.0.0.1";
    o.heartbeat_timeout = milliseconds(1500);
    server = std::make_unique<RendezvousServer>(o);
  }
  std::unique_ptr<RendezvousClient> join(const std::string& host, int slots) {
    RendezvousClientOptions o;
    o.head = {"127.0.0.1", server->port(), kToken, ""};
    o.node_rank = -1;
    o.nnodes = 0;
    o.fingerprint.version = "v1";
    o.fingerprint.hostname = host;
    o.fingerprint.ip = "127.0.0.1";
    o.fingerprint.num_ranks = slots;
    o.fingerprint.gpus = std::vector<std::string>(static_cast<size_t>(slots), "NVIDIA H200");
    o.join_timeout = milliseconds(5000);
    o.heartbeat_interval = milliseconds(100);
    return std::make_unique<RendezvousClient>(o);
  }
  std::unique_ptr<RendezvousServer> server;
};

TEST(PersistentCluster, NodesJoinOneByOneAndGetRanks) {
  PersistentCluster c;
  auto a = c.join("host-a", 4);
  EXPECT_EQ(a->node_rank(), 1);
  auto b = c.join("host-b", 2);
  EXPECT_EQ(b->node_rank(), 2);
  ClusterStatus s = query_cluster_status({"127.0.0.1", c.server->port(), kToken, ""}, milliseconds(3000));
  EXPECT_EQ(s.nnodes, 0);  // persistent
  ASSERT_EQ(s.nodes.size(), 3u);
  EXPECT_EQ(s.nodes[1].fingerprint.gpus.size(), 4u);
  EXPECT_EQ(s.nodes[2].fingerprint.hostname, "host-b");
  // host-b restarts: same rank again, not a third node.
  b->simulate_crash();
  auto deadline = Clock::now() + std::chrono::seconds(3);
  while (c.server->status().nodes[2].alive && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_FALSE(c.server->status().nodes[2].alive);
  EXPECT_FALSE(a->failure()) << "a persistent cluster's nodes do not fail with each other";
  auto b2 = c.join("host-b", 2);
  EXPECT_EQ(b2->node_rank(), 2);
  EXPECT_EQ(c.server->status().nodes.size(), 3u);
  EXPECT_TRUE(c.server->status().nodes[2].alive);
}

// A second `node start` on a host whose node is alive is refused naming it; the first stays.
TEST(PersistentCluster, ASecondNodeOnALiveNodesHostIsRefused) {
  PersistentCluster c;
  auto a = c.join("host-a", 1);
  EXPECT_THAT([&] { c.join("host-a", 1); },
              ::testing::ThrowsMessage<Error>(HasSubstr(
                  "this host (host-a, 127.0.0.1) is node 1 of the cluster already, and that node is alive (last "
                  "heartbeat ")));
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_FALSE(a->failure());
  EXPECT_TRUE(a->confirm_membership(milliseconds(2000)));
  ClusterStatus s = c.server->status();
  ASSERT_EQ(s.nodes.size(), 2u);
  EXPECT_TRUE(s.nodes[1].alive);
  EXPECT_EQ(s.nodes[1].joins, 1);
}

TEST(PersistentCluster, JobsReachTheNamedNodesWithTheirJobRanks) {
  PersistentCluster c;
  auto a = c.join("host-a", 1);
  auto b = c.join("host-b", 1);
  HeadAddress head{"127.0.0.1", c.server->port(), kToken, ""};
  JobSubmit job;
  job.nodes = {2, 1};
  job.job.nnodes = 3;
  job.job.master_addr = "127.0.0.1";
  job.job.master_port = 4242;
  job.job.args = {"serve", "/models/x", "--tensor-parallel-size", "3"};
  submit_job(head, job, milliseconds(3000));
  std::optional<JobStart> ja = a->wait_job(milliseconds(2000)), jb = b->wait_job(milliseconds(2000));
  ASSERT_TRUE(ja && jb);
  EXPECT_EQ(jb->node_rank, 1);
  EXPECT_EQ(ja->node_rank, 2);
  EXPECT_EQ(ja->nnodes, 3);
  EXPECT_EQ(ja->master_port, 4242);
  EXPECT_EQ(ja->args, job.job.args);
  // A dead node is refused by name, and the job reaches nobody.
  b->simulate_crash();
  auto deadline = Clock::now() + std::chrono::seconds(3);
  while (c.server->status().nodes[2].alive && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(10));
  job.nodes = {1, 2};
  EXPECT_THAT([&] { submit_job(head, job, milliseconds(3000)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("node 2 is not joined and alive")));
  EXPECT_FALSE(a->wait_job(milliseconds(200)));
}

TEST(PersistentCluster, PerJobNodesAndPersistentNodesDoNotMix) {
  PersistentCluster c;
  RendezvousClientOptions o;
  o.head = {"127.0.0.1", c.server->port(), kToken, ""};
  o.node_rank = 1;
  o.nnodes = 2;
  o.fingerprint.version = "v1";
  o.join_timeout = milliseconds(3000);
  EXPECT_THAT([&] { RendezvousClient bad(o); },
              ::testing::ThrowsMessage<Error>(HasSubstr("is a persistent cluster (`tessera node start --head`)")));
  Cluster job(2, milliseconds(2000));
  o.head = job.head();
  o.node_rank = -1;
  o.nnodes = 0;
  o.fingerprint = node_fp(job);
  EXPECT_THAT([&] { RendezvousClient bad(o); },
              ::testing::ThrowsMessage<Error>(HasSubstr("runs one job with --nnodes 2, not a persistent cluster")));
  JobSubmit js;
  js.nodes = {1};
  js.job.args = {"serve"};
  EXPECT_THAT([&] { submit_job(job.head(), js, milliseconds(3000)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("takes no job submissions")));
}

TEST(Rendezvous, ListeningRules) {
  RendezvousServerOptions o;
  o.bind_ip = "0.0.0.0";
  o.token = "t";
  EXPECT_THAT([&] { RendezvousServer s(o); },
              ::testing::ThrowsMessage<Error>(HasSubstr("refusing to listen on 0.0.0.0")));
  o.bind_ip = "10.255.255.1";
  o.token = "";
  EXPECT_THAT([&] { RendezvousServer s(o); }, ::testing::ThrowsMessage<Error>(HasSubstr("cluster token is required")));
}

TEST(BootstrapStore, SetGetAndGoneRanks) {
  Cluster c(1);
  auto a = std::make_unique<ControlStoreClient>(c.head(), 0, milliseconds(2000));
  ControlStoreClient b(c.head(), 1, milliseconds(2000));
  std::vector<uint8_t> v = {1, 2, 3};
  a->set("k", v);
  EXPECT_EQ(b.wait_get("k", milliseconds(1000), "k"), v);
  EXPECT_FALSE(b.try_get("missing"));
  auto start = Clock::now();
  EXPECT_THAT([&] { b.wait_get("missing", milliseconds(200), "rank 7's address"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("waiting for rank 7's address")));
  EXPECT_LT(Clock::now() - start, milliseconds(1000));
  EXPECT_EQ(b.gone_ranks({0, 1, 2}), std::vector<int>{2});  // 2 never connected
  a.reset();
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(b.gone_ranks({0, 1}), std::vector<int>{0});
  EXPECT_THAT(describe_gone_ranks(&b, {0, 1}, nullptr), HasSubstr("rank 0 is gone"));
  // The head itself gone: nobody can say which peer is, and the message says the head is gone.
  c.server.reset();
  std::string head_gone = describe_gone_ranks(&b, {0}, nullptr);
  EXPECT_THAT(head_gone, HasSubstr("the head is gone: its control channel does not answer ("));
  EXPECT_THAT(head_gone, HasSubstr("start it again on every node"));
  EXPECT_THAT(head_gone, ::testing::Not(HasSubstr("still connected")));
}

}  // namespace
}  // namespace tessera::dist
