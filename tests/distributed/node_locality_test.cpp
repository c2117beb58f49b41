// Which ranks share a job node (dist/node_locality.h): the NCCL_HOSTID a rank process sets, NCCL's
// reading of NCCL_P2P_DISABLE, and where the custom all-reduce may run.
#include <gtest/gtest.h>

#include <cstdlib>

#include "distributed/custom_all_reduce_communicator.h"
#include "distributed/meta_communicator.h"
#include "distributed/node_locality.h"
#include "distributed/process_groups.h"

namespace tessera::dist {
namespace {

TEST(NcclHostId, OneValuePerNodeOfTheJob) {
  const NcclHostId n0 = nccl_host_id("gpu-host", "6f1d-boot", 0, nullptr);
  const NcclHostId n1 = nccl_host_id("gpu-host", "6f1d-boot", 1, nullptr);
  EXPECT_EQ(n0.value, "gpu-host:6f1d-boot/node0");
  EXPECT_EQ(n1.value, "gpu-host:6f1d-boot/node1");
  EXPECT_FALSE(n0.from_user);
  // Every rank of a node computes the same value; two nodes that share a hostname and a boot id
  // (two network namespaces of one machine) still differ, and so do two machines.
  EXPECT_EQ(nccl_host_id("gpu-host", "6f1d-boot", 1, nullptr).value, n1.value);
  EXPECT_NE(n0.value, n1.value);
  EXPECT_NE(nccl_host_id("other-host", "77aa-boot", 0, nullptr).value, n0.value);
  EXPECT_NE(nccl_host_id("gpu-host", "77aa-boot", 0, nullptr).value, n0.value);
}

TEST(NcclHostId, TheUsersValueIsKept) {
  const NcclHostId id = nccl_host_id("gpu-host", "6f1d-boot", 3, "rack7-host2");
  EXPECT_EQ(id.value, "rack7-host2");
  EXPECT_TRUE(id.from_user);
  // Set but empty: as unset (NCCL would hash an empty string for every host).
  EXPECT_EQ(nccl_host_id("h", "b", 2, "").value, "h:b/node2");
}

TEST(NcclHostId, ApplySetsTheVariableUnlessTheUserDid) {
  unsetenv("NCCL_HOSTID");
  const NcclHostId mine = apply_nccl_host_id(1);
  ASSERT_NE(std::getenv("NCCL_HOSTID"), nullptr);
  EXPECT_EQ(std::string(std::getenv("NCCL_HOSTID")), mine.value);
  EXPECT_TRUE(mine.value.ends_with("/node1")) << mine.value;
  EXPECT_FALSE(mine.from_user);
  setenv("NCCL_HOSTID", "chosen-by-the-user", 1);
  const NcclHostId kept = apply_nccl_host_id(2);
  EXPECT_TRUE(kept.from_user);
  EXPECT_EQ(std::string(std::getenv("NCCL_HOSTID")), "chosen-by-the-user");
  unsetenv("NCCL_HOSTID");
}

TEST(NcclEnvTrue, AsNcclReadsIt) {
  for (const char* on : {"1", "2", "-1", "0x1", "true", "TRUE", "True", "yes", "YES", " 1 "})
    EXPECT_TRUE(nccl_env_true(on)) << on;
  for (const char* off : {"0", "00", "", "false", "no", "off", "on", "maybe", "1x"})
    EXPECT_FALSE(nccl_env_true(off)) << off;
  EXPECT_FALSE(nccl_env_true(nullptr));
}

TEST(NodeOfRank, RanksArePlacedNodeByNode) {
  EXPECT_EQ(node_of_rank(0, 2), 0);
  EXPECT_EQ(node_of_rank(1, 2), 0);
  EXPECT_EQ(node_of_rank(2, 2), 1);
  EXPECT_EQ(node_of_rank(5, 2), 2);
  EXPECT_EQ(node_of_rank(7, 0), 0);  // one node
}

TEST(CustomAllReduceOff, OnlyWhereEveryRankOfTheGroupIsOnThisNode) {
  // TP 2 x PP 2 on two nodes of two ranks: each TP group inside a node, each PP group across.
  const ParallelLayout tp2pp2{2, 2};
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(custom_all_reduce_off_reason(tp2pp2.tp_group(rank), 2, nullptr), std::nullopt) << rank;
    EXPECT_EQ(custom_all_reduce_off_reason(tp2pp2.pp_group(rank), 2, nullptr), "its ranks span nodes") << rank;
  }
  // TP 2 on two nodes of one rank each (one GPU a node, or two nodes on one GPU): the TP group spans.
  const ParallelLayout tp2{2, 1};
  EXPECT_EQ(custom_all_reduce_off_reason(tp2.tp_group(0), 1, nullptr), "its ranks span nodes");
  EXPECT_EQ(custom_all_reduce_off_reason(tp2.tp_group(1), 1, nullptr), "its ranks span nodes");
  // TP 4 over two nodes of two ranks: spans.
  const ParallelLayout tp4{4, 1};
  EXPECT_EQ(custom_all_reduce_off_reason(tp4.tp_group(3), 2, nullptr), "its ranks span nodes");
  // One node (ranks_per_node 0 or the world): on.
  EXPECT_EQ(custom_all_reduce_off_reason(tp4.tp_group(2), 0, nullptr), std::nullopt);
  EXPECT_EQ(custom_all_reduce_off_reason(tp4.tp_group(2), 4, nullptr), std::nullopt);
}

TEST(CustomAllReduceOff, NcclP2pDisableTurnsItOff) {
  const GroupInfo tp = ParallelLayout{2, 1}.tp_group(0);
  EXPECT_EQ(custom_all_reduce_off_reason(tp, 2, "1"), "NCCL_P2P_DISABLE=1");
  EXPECT_EQ(custom_all_reduce_off_reason(tp, 2, "True"), "NCCL_P2P_DISABLE=True");
  EXPECT_EQ(custom_all_reduce_off_reason(tp, 2, "yes"), "NCCL_P2P_DISABLE=yes");
  EXPECT_EQ(custom_all_reduce_off_reason(tp, 2, "0"), std::nullopt);
  EXPECT_EQ(custom_all_reduce_off_reason(tp, 2, ""), std::nullopt);
  // Spanning nodes is the reason named first.
  EXPECT_EQ(custom_all_reduce_off_reason(tp, 1, "1"), "its ranks span nodes");
}

// The decorator takes its decision from the config before any exchange with the peers (a build
// with the custom all-reduce; a CPU build has nothing to accelerate).

TEST(CustomAllReduceOff, AGroupAcrossNodesKeepsItsCommunicatorWithoutAnExchange) {
  if (!custom_all_reduce_built()) GTEST_SKIP() << "this build has no custom all-reduce (CPU build)";
  CustomAllReduceConfig c;
  c.ranks_per_node = 1;  // TP 2 across two nodes
  c.stream = reinterpret_cast<void*>(0x1);
  bool exchanged = false;
  c.all_gather = [&](const std::vector<uint8_t>& mine) {
    exchanged = true;
    return std::vector<std::vector<uint8_t>>{mine, mine};
  };
  auto inner = std::make_unique<MetaCommunicator>(ParallelLayout{2, 1}.tp_group(0));
  Communicator* raw = inner.get();
  auto out = with_custom_all_reduce(std::move(inner), c);
  EXPECT_EQ(out.get(), raw);
  EXPECT_FALSE(exchanged);  // not tried: the peer is never waited for

  c.ranks_per_node = 2;
  c.nccl_p2p_disable = "1";
  auto inner2 = std::make_unique<MetaCommunicator>(ParallelLayout{2, 1}.tp_group(1));
  raw = inner2.get();
  EXPECT_EQ(with_custom_all_reduce(std::move(inner2), c).get(), raw);
  EXPECT_FALSE(exchanged);
}

}  // namespace
}  // namespace tessera::dist
