#include "dist/launch_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"

namespace tessera::dist {
namespace {

using ::testing::HasSubstr;

EnvLookup env(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

TEST(LaunchEnv, SingleNodeByDefault) {
  LaunchFacts f = resolve_launch({}, env({}));
  EXPECT_EQ(f.source, LaunchSource::kSingleNode);
  EXPECT_EQ(f.nnodes, 1);
  EXPECT_EQ(f.node_rank, 0);
  EXPECT_EQ(f.rank, -1);
}

TEST(LaunchEnv, Flags) {
  LaunchFacts f = resolve_launch({2, 1, "10.0.0.1", 29501}, env({}));
  EXPECT_EQ(f.source, LaunchSource::kFlags);
  EXPECT_EQ(f.nnodes, 2);
  EXPECT_EQ(f.node_rank, 1);
  EXPECT_EQ(f.master_addr, "10.0.0.1");
  EXPECT_EQ(f.master_port, 29501);
  EXPECT_FALSE(f.is_head());
}

TEST(LaunchEnv, FlagErrors) {
  EXPECT_THAT(
      [] {
        resolve_launch({2, 2, "10.0.0.1", {}}, env({}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("--node-rank 2 must be in [0, 2)")));
  EXPECT_THAT(
      [] {
        resolve_launch({2, 1, {}, {}}, env({}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("no master address; pass --master-addr")));
  EXPECT_THROW(resolve_launch({1, 0, {}, 70000}, env({})), Error);
}

TEST(LaunchEnv, Mpirun) {
  LaunchFacts f = resolve_launch({{}, {}, "10.0.0.1", {}}, env({{"OMPI_COMM_WORLD_RANK", "5"},
                                                                {"OMPI_COMM_WORLD_SIZE", "8"},
                                                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
  EXPECT_EQ(f.source, LaunchSource::kMpi);
  EXPECT_EQ(f.rank, 5);
  EXPECT_EQ(f.world_size, 8);
  EXPECT_EQ(f.local_rank, 1);
  EXPECT_EQ(f.nnodes, 2);
  EXPECT_EQ(f.node_rank, 1);
}

TEST(LaunchEnv, PmixRank) {
  LaunchFacts f = resolve_launch({}, env({{"PMIX_RANK", "0"}, {"PMIX_SIZE", "1"}}));
  EXPECT_EQ(f.source, LaunchSource::kMpi);
  EXPECT_EQ(f.rank, 0);
}

TEST(LaunchEnv, FlagDisagreeingWithLauncherIsAnError) {
  EXPECT_THAT(
      [] {
        resolve_launch(
            {{}, 0, "10.0.0.1", {}},
            env({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "8"}, {"SLURM_NODEID", "1"}, {"SLURM_NNODES", "2"}}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("--node-rank 0 disagrees with SLURM_NODEID=1")));
}

TEST(LaunchEnv, Slurm) {
  LaunchFacts f = resolve_launch({{}, {}, {}, 29600}, env({{"SLURM_PROCID", "4"},
                                                           {"SLURM_NTASKS", "8"},
                                                           {"SLURM_LOCALID", "0"},
                                                           {"SLURM_NODEID", "1"},
                                                           {"SLURM_NNODES", "2"},
                                                           {"MASTER_ADDR", "10.0.0.1"}}));
  EXPECT_EQ(f.source, LaunchSource::kSlurm);
  EXPECT_EQ(f.node_rank, 1);
  EXPECT_EQ(f.nnodes, 2);
  EXPECT_EQ(f.rank, 4);
  EXPECT_EQ(f.local_world_size, 4);
  EXPECT_EQ(f.master_addr, "10.0.0.1");
  EXPECT_EQ(f.master_port, 29600);
}

TEST(LaunchEnv, LeaderWorkerSet) {
  LaunchFacts f = resolve_launch(
      {}, env({{"LWS_LEADER_ADDRESS", "llm-0.llm"}, {"LWS_GROUP_SIZE", "2"}, {"LWS_WORKER_INDEX", "1"}}));
  EXPECT_EQ(f.source, LaunchSource::kLeaderWorkerSet);
  EXPECT_EQ(f.nnodes, 2);
  EXPECT_EQ(f.node_rank, 1);
  EXPECT_EQ(f.master_addr, "llm-0.llm");
  EXPECT_THROW(resolve_launch({}, env({{"LWS_LEADER_ADDRESS", "x"}})), Error);
}

TEST(LaunchEnv, MpiTakesPrecedenceOverSlurm) {
  LaunchFacts f = resolve_launch({}, env({{"OMPI_COMM_WORLD_RANK", "0"},
                                          {"OMPI_COMM_WORLD_SIZE", "1"},
                                          {"SLURM_PROCID", "3"},
                                          {"SLURM_NTASKS", "4"}}));
  EXPECT_EQ(f.source, LaunchSource::kMpi);
}

TEST(LaunchEnv, GarbageNumbers) {
  EXPECT_THAT(
      [] {
        resolve_launch({}, env({{"SLURM_PROCID", "x1"}}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("SLURM_PROCID='x1' is not a non-negative integer")));
}

}  // namespace
}  // namespace tessera::dist
