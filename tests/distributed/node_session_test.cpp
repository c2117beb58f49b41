#include "distributed/node_session.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <future>

#include "core/error.h"
#include "test_util.h"

namespace tessera::dist {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

TEST(NodeSession, SingleNodeStaysOnLoopback) {
  testing::FakeModelDir model(2);
  NodeSessionOptions o;
  o.launch.master_port = testing::free_port();
  o.model_dir = model.path();
  o.local_ranks = 4;
  NodeSession s(o);
  EXPECT_TRUE(s.is_head());
  EXPECT_EQ(s.nic().ip, "127.0.0.1");
  EXPECT_EQ(s.cluster().world_size, 4);
  EXPECT_EQ(s.first_rank(), 0);
  EXPECT_EQ(s.fingerprint().shards.size(), 2u);
}

TEST(NodeSession, TwoNodesOverLoopback) {
  testing::FakeModelDir model(2);
  uint16_t port = testing::free_port();
  auto options = [&](int node_rank) {
    NodeSessionOptions o;
    o.launch = resolve_launch({2, node_rank, "127.0.0.1", port}, [](const char*) -> const char* { return nullptr; });
    o.token = "tok";
    o.model_dir = model.path();
    o.local_ranks = 2;
    o.gpus = {"CPU"};
    o.join_timeout = milliseconds(5000);
    return o;
  };
  auto head = std::async(std::launch::async, [&] { return std::make_unique<NodeSession>(options(0)); });
  auto worker = std::async(std::launch::async, [&] { return std::make_unique<NodeSession>(options(1)); });
  auto h = head.get();
  auto w = worker.get();
  EXPECT_EQ(h->cluster().world_size, 4);
  EXPECT_EQ(w->first_rank(), 2);
  EXPECT_FALSE(w->is_head());
  EXPECT_EQ(w->rank_namer()(3), "rank 3 (node 1, 127.0.0.1)");
  EXPECT_EQ(w->head().port, port);
}

TEST(NodeSession, WrongNicFailsBeforeAnyNetworking) {
  NodeSessionOptions o;
  o.launch = resolve_launch({2, 1, "127.0.0.1", 29999}, [](const char*) -> const char* { return nullptr; });
  o.nic = "eth9";
  EXPECT_THAT([&] { NodeSession s(o); }, ::testing::ThrowsMessage<Error>(HasSubstr("interface eth9 does not exist")));
}

}  // namespace
}  // namespace tessera::dist
