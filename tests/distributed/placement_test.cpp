#include "distributed/placement.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace tessera::dist {
namespace {

using ::testing::HasSubstr;

std::vector<NodeSlots> two_nodes(int slots) {
  return {{0, slots, true, "10.0.0.1", "ens5"}, {1, slots, true, "10.0.0.2", "ens5"}};
}

TEST(PlaceRanks, FitsOnTheHeadAlone) {
  RankPlacement2D p = place_ranks(4, 1, two_nodes(4));
  EXPECT_EQ(p.nodes, std::vector<int>{0});
  EXPECT_EQ(p.ranks_per_node, 4);
  EXPECT_FALSE(p.tp_crosses_nodes);
}

TEST(PlaceRanks, TpInsideANodePpAcrossNodes) {
  RankPlacement2D p = place_ranks(4, 2, two_nodes(4));  // the seeds' rule: TP = GPUs per node, PP = nodes
  EXPECT_EQ(p.nodes, (std::vector<int>{0, 1}));
  EXPECT_EQ(p.ranks_per_node, 4);
  EXPECT_FALSE(p.tp_crosses_nodes);
  EXPECT_TRUE(p.warning.empty());
}

TEST(PlaceRanks, TpAcrossNodesIsNamedWithItsLink) {
  RankPlacement2D p = place_ranks(8, 1, two_nodes(4));  // seed 000: TP=8 on 2 x 4 GPUs
  EXPECT_EQ(p.nodes, (std::vector<int>{0, 1}));
  EXPECT_TRUE(p.tp_crosses_nodes);
  EXPECT_THAT(p.warning, HasSubstr("crosses the network link 10.0.0.1 on ens5 <-> 10.0.0.2 on ens5"));
  EXPECT_THAT(p.warning, HasSubstr("--tensor-parallel-size 4 --pipeline-parallel-size 2 keeps TP inside a node"));
}

TEST(PlaceRanks, SkipsDeadAndTooSmallNodes) {
  std::vector<NodeSlots> nodes = {
      {0, 2, true, "a", "x"}, {1, 2, false, "b", "x"}, {2, 1, true, "c", "x"}, {3, 2, true, "d", "x"}};
  RankPlacement2D p = place_ranks(2, 2, nodes);
  EXPECT_EQ(p.nodes, (std::vector<int>{0, 3}));
}

TEST(PlaceRanks, NothingFitsNamesEveryNode) {
  try {
    place_ranks(8, 1, {{0, 4, true, "10.0.0.1", "ens5"}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("= 8 ranks do not fit the cluster's nodes"));
    EXPECT_THAT(e.what(), HasSubstr("node 0 (10.0.0.1): 4 slot(s)"));
    EXPECT_THAT(e.what(), HasSubstr("tessera node start --address"));
  }
}

TEST(LocalGpus, ReadsTheDriversModelNames) {
  namespace fs = std::filesystem;
  fs::path root = fs::temp_directory_path() / ("placement_test_gpus_" + std::to_string(::getpid()));
  for (const char* bus : {"0000:1b:00.0", "0000:0a:00.0"}) {
    fs::create_directories(root / bus);
    std::ofstream(root / bus / "information") << "Model: \t\t NVIDIA H200\nIRQ:   10\n";
  }
  unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(local_gpu_names(root.string()), (std::vector<std::string>{"NVIDIA H200", "NVIDIA H200"}));
  setenv("CUDA_VISIBLE_DEVICES", "1", 1);
  EXPECT_EQ(local_gpu_names(root.string()).size(), 1u);
  unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_TRUE(local_gpu_names((root / "none").string()).empty());
  fs::remove_all(root);
}

}  // namespace
}  // namespace tessera::dist
