#include "distributed/launch_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"

namespace tessera::dist {
namespace {

using ::testing::AllOf;
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
  EXPECT_EQ(f.source, LaunchSource::kOpenMpi);
  EXPECT_EQ(f.rank, 5);
  EXPECT_EQ(f.world_size, 8);
  EXPECT_EQ(f.local_rank, 1);
  EXPECT_EQ(f.nnodes, 2);
  EXPECT_EQ(f.node_rank, 1);
  EXPECT_TRUE(f.one_process_per_rank);
  EXPECT_THAT(f.describe(), HasSubstr("launch from Open MPI: node 1 of 2, rank 5 of 8 (local 1 of 4), one process "
                                      "per rank, master 10.0.0.1:29500 (from --master-addr)"));
}

TEST(LaunchEnv, PmixRank) {
  LaunchFacts f = resolve_launch({}, env({{"PMIX_RANK", "0"}, {"PMIX_SIZE", "1"}}));
  EXPECT_EQ(f.source, LaunchSource::kOpenMpi);
  EXPECT_EQ(f.rank, 0);
}

// The trap of an sbatch script that writes "--node-rank $SLURM_NODEID" inside double quotes: the
// batch shell expands it once, and every node gets --node-rank 0.
TEST(LaunchEnv, EveryNodeGotTheSameRankFromTheBatchShell) {
  EXPECT_THAT(
      [] {
        resolve_launch(
            {{}, 0, "10.0.0.1", {}},
            env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODEID", "1"}, {"SLURM_NNODES", "2"}}));
      },
      ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("--node-rank 0 contradicts SLURM_NODEID=1"),
                                            HasSubstr("expands it once in the batch shell and gives every node the "
                                                      "same rank"))));
  EXPECT_THAT(
      [] {
        resolve_launch({3, {}, {}, {}},
                       env({{"LWS_LEADER_ADDRESS", "a"}, {"LWS_GROUP_SIZE", "2"}, {"LWS_WORKER_INDEX", "0"}}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("--nnodes 3 contradicts LWS_GROUP_SIZE=2")));
}

TEST(LaunchEnv, FlagsAgreeingWithTheLauncherAreFine) {
  LaunchFacts f = resolve_launch({2, 1, "10.0.0.1", 29501}, env({{"SLURM_PROCID", "1"},
                                                                 {"SLURM_NTASKS", "2"},
                                                                 {"SLURM_NODEID", "1"},
                                                                 {"SLURM_NNODES", "2"},
                                                                 {"MASTER_ADDR", "10.0.0.1"},
                                                                 {"MASTER_PORT", "29501"}}));
  EXPECT_EQ(f.source, LaunchSource::kSlurm);
  EXPECT_EQ(f.node_rank, 1);
}

TEST(LaunchEnv, MasterFlagContradictingTheEnvironment) {
  EXPECT_THAT(
      [] {
        resolve_launch({{}, {}, "10.0.0.9", {}},
                       env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("--master-addr 10.0.0.9 contradicts MASTER_ADDR=10.0.0.1")));
  EXPECT_THAT(
      [] {
        resolve_launch({{}, {}, {}, 29511}, env({{"MASTER_PORT", "29512"}}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("--master-port 29511 contradicts MASTER_PORT=29512")));
  EXPECT_THAT(
      [] {
        resolve_launch({{}, {}, "10.0.0.9", {}},
                       env({{"LWS_LEADER_ADDRESS", "llm-0.llm"}, {"LWS_GROUP_SIZE", "2"}, {"LWS_WORKER_INDEX", "1"}}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("--master-addr 10.0.0.9 contradicts LWS_LEADER_ADDRESS=llm-0.llm")));
}

TEST(LaunchEnv, SlurmOneTaskPerNodeFindsTheMasterInACompressedNodeList) {
  LaunchFacts f = resolve_launch({}, env({{"SLURM_PROCID", "1"},
                                          {"SLURM_NTASKS", "2"},
                                          {"SLURM_LOCALID", "0"},
                                          {"SLURM_NODEID", "1"},
                                          {"SLURM_NNODES", "2"},
                                          {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"},
                                          {"SLURM_JOB_NODELIST", "gnode[10,20]"}}));
  EXPECT_EQ(f.source, LaunchSource::kSlurm);
  EXPECT_EQ(f.nnodes, 2);
  EXPECT_EQ(f.node_rank, 1);
  EXPECT_FALSE(f.one_process_per_rank);
  EXPECT_EQ(f.master_addr, "gnode10");
  EXPECT_EQ(f.master_port, 29500);
  EXPECT_THAT(f.describe(), HasSubstr("master gnode10:29500 (from the first node of SLURM_JOB_NODELIST=gnode[10,20])"));
  // The step's own list comes first (a step may run on part of the allocation); MASTER_ADDR before either.
  LaunchFacts g = resolve_launch({}, env({{"SLURM_PROCID", "0"},
                                          {"SLURM_NTASKS", "2"},
                                          {"SLURM_NODEID", "0"},
                                          {"SLURM_NNODES", "2"},
                                          {"SLURM_STEP_NODELIST", "n[03-04]"},
                                          {"SLURM_JOB_NODELIST", "n[01-04,7]"}}));
  EXPECT_EQ(g.master_addr, "n03");
  LaunchFacts h = resolve_launch({}, env({{"SLURM_PROCID", "0"},
                                          {"SLURM_NTASKS", "2"},
                                          {"SLURM_NODEID", "0"},
                                          {"SLURM_NNODES", "2"},
                                          {"SLURM_JOB_NODELIST", "n[01-04,7]"},
                                          {"MASTER_ADDR", "10.1.1.1"}}));
  EXPECT_EQ(h.master_addr, "10.1.1.1");
  EXPECT_EQ(h.master_from, "MASTER_ADDR");
}

TEST(LaunchEnv, SlurmOneTaskPerGpu) {
  LaunchFacts f = resolve_launch({{}, {}, {}, {}, 8}, env({{"SLURM_PROCID", "6"},
                                                           {"SLURM_NTASKS", "8"},
                                                           {"SLURM_LOCALID", "2"},
                                                           {"SLURM_NODEID", "1"},
                                                           {"SLURM_NNODES", "2"},
                                                           {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
                                                           {"SLURM_STEP_NODELIST", "gpu[1-2]"}}));
  EXPECT_EQ(f.nnodes, 2);
  EXPECT_EQ(f.node_rank, 1);
  EXPECT_EQ(f.rank, 6);
  EXPECT_EQ(f.local_rank, 2);
  EXPECT_EQ(f.local_world_size, 4);
  EXPECT_TRUE(f.one_process_per_rank);
  EXPECT_EQ(f.master_addr, "gpu1");
}

TEST(LaunchEnv, OneTaskPerGpuMustMatchTheRanks) {
  // 8 tasks, 4 per node, but TP x PP = 2: neither one per node nor one per rank.
  EXPECT_THAT(
      [] {
        resolve_launch({{}, {}, {}, {}, 2}, env({{"SLURM_PROCID", "0"},
                                                 {"SLURM_NTASKS", "8"},
                                                 {"SLURM_LOCALID", "0"},
                                                 {"SLURM_NODEID", "0"},
                                                 {"SLURM_NNODES", "2"},
                                                 {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
                                                 {"SLURM_STEP_NODELIST", "gpu[1-2]"}}));
      },
      ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("Slurm started 8 processes, 4 per node"),
                                            HasSubstr("= 2 rank(s)"), HasSubstr("srun --ntasks-per-node=1"))));
  // Several per node on one node: tessera starts a node's ranks itself.
  EXPECT_THAT(
      [] {
        resolve_launch({{}, {}, {}, {}, 2}, env({{"OMPI_COMM_WORLD_RANK", "0"},
                                                 {"OMPI_COMM_WORLD_SIZE", "2"},
                                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("Open MPI started 2 processes on one node")));
}

TEST(LaunchEnv, WorldThatDoesNotDivideIntoNodes) {
  EXPECT_THAT(
      [] {
        resolve_launch({}, env({{"RANK", "0"}, {"WORLD_SIZE", "3"}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}));
      },
      ::testing::ThrowsMessage<Error>(
          HasSubstr("WORLD_SIZE=3 processes do not divide into nodes of LOCAL_WORLD_SIZE=2")));
  EXPECT_THAT(
      [] {
        resolve_launch({}, env({{"SLURM_PROCID", "0"},
                                {"SLURM_NTASKS", "3"},
                                {"SLURM_NODEID", "0"},
                                {"SLURM_NNODES", "2"},
                                {"SLURM_STEP_TASKS_PER_NODE", "2,1"}}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("SLURM_STEP_TASKS_PER_NODE=2,1: Slurm put a different number of tasks "
                                                "on each node")));
  // Cyclic distribution: rank 1 on node 1 with 2 per node.
  EXPECT_THAT(
      [] {
        resolve_launch({}, env({{"SLURM_PROCID", "1"},
                                {"SLURM_NTASKS", "4"},
                                {"SLURM_LOCALID", "0"},
                                {"SLURM_NODEID", "1"},
                                {"SLURM_NNODES", "2"},
                                {"SLURM_STEP_NODELIST", "a,b"}}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("--distribution=block")));
}

TEST(LaunchEnv, Torchrun) {
  LaunchFacts f = resolve_launch({}, env({{"RANK", "1"},
                                          {"WORLD_SIZE", "2"},
                                          {"LOCAL_RANK", "0"},
                                          {"LOCAL_WORLD_SIZE", "1"},
                                          {"MASTER_ADDR", "10.0.0.1"},
                                          {"MASTER_PORT", "29555"}}));
  EXPECT_EQ(f.source, LaunchSource::kTorchrun);
  EXPECT_EQ(f.nnodes, 2);
  EXPECT_EQ(f.node_rank, 1);
  EXPECT_EQ(f.master_addr, "10.0.0.1");
  EXPECT_EQ(f.master_port, 29555);
  EXPECT_THROW(resolve_launch({}, env({{"RANK", "1"}})), Error);
  // Under torchrun itself, its agent holds MASTER_PORT on node 0.
  LaunchFacts g = resolve_launch({}, env({{"RANK", "0"},
                                          {"WORLD_SIZE", "2"},
                                          {"MASTER_ADDR", "10.0.0.1"},
                                          {"MASTER_PORT", "29555"},
                                          {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
  EXPECT_EQ(g.master_port, 29556);
  ASSERT_EQ(g.notes.size(), 1u);
  EXPECT_THAT(g.notes[0], HasSubstr("the control channel uses 29556"));
}

TEST(LaunchEnv, Mpich) {
  LaunchFacts f = resolve_launch({}, env({{"PMI_RANK", "3"},
                                          {"PMI_SIZE", "4"},
                                          {"MPI_LOCALRANKID", "1"},
                                          {"MPI_LOCALNRANKS", "2"},
                                          {"MASTER_ADDR", "10.0.0.1"}}));
  EXPECT_EQ(f.source, LaunchSource::kPmi);
  EXPECT_EQ(f.node_rank, 1);
  EXPECT_EQ(f.nnodes, 2);
}

TEST(LaunchEnv, LeaderWorkerSet) {
  LaunchFacts f = resolve_launch(
      {}, env({{"LWS_LEADER_ADDRESS", "llm-0.llm"}, {"LWS_GROUP_SIZE", "2"}, {"LWS_WORKER_INDEX", "1"}}));
  EXPECT_EQ(f.source, LaunchSource::kLeaderWorkerSet);
  EXPECT_EQ(f.nnodes, 2);
  EXPECT_EQ(f.node_rank, 1);
  EXPECT_EQ(f.rank, -1);
  EXPECT_EQ(f.master_addr, "llm-0.llm");
  EXPECT_THAT(
      [] {
        resolve_launch({}, env({{"LWS_LEADER_ADDRESS", "x"}}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("LWS_GROUP_SIZE=(unset)")));
}

// The documented order: LeaderWorkerSet, torchrun, Open MPI, Slurm, MPICH; each lower one noted.
TEST(LaunchEnv, Precedence) {
  std::map<std::string, std::string> all = {{"LWS_LEADER_ADDRESS", "lws"},
                                            {"LWS_GROUP_SIZE", "2"},
                                            {"LWS_WORKER_INDEX", "1"},
                                            {"RANK", "0"},
                                            {"WORLD_SIZE", "2"},
                                            {"MASTER_ADDR", "10.0.0.1"},
                                            {"OMPI_COMM_WORLD_RANK", "1"},
                                            {"OMPI_COMM_WORLD_SIZE", "2"},
                                            {"SLURM_PROCID", "0"},
                                            {"SLURM_NTASKS", "2"},
                                            {"SLURM_NODEID", "0"},
                                            {"SLURM_NNODES", "2"},
                                            {"PMI_RANK", "1"},
                                            {"PMI_SIZE", "2"}};
  LaunchFacts f = resolve_launch({}, env(all));
  EXPECT_EQ(f.source, LaunchSource::kLeaderWorkerSet);
  EXPECT_EQ(f.node_rank, 1);
  EXPECT_EQ(f.notes.size(), 4u);
  for (const char* k : {"LWS_LEADER_ADDRESS", "LWS_GROUP_SIZE", "LWS_WORKER_INDEX"}) all.erase(k);
  f = resolve_launch({}, env(all));
  EXPECT_EQ(f.source, LaunchSource::kTorchrun);
  EXPECT_EQ(f.node_rank, 0);
  for (const char* k : {"RANK", "WORLD_SIZE"}) all.erase(k);
  f = resolve_launch({}, env(all));
  EXPECT_EQ(f.source, LaunchSource::kOpenMpi);
  EXPECT_EQ(f.node_rank, 1);
  for (const char* k : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}) all.erase(k);
  f = resolve_launch({}, env(all));
  EXPECT_EQ(f.source, LaunchSource::kSlurm);
  EXPECT_EQ(f.node_rank, 0);
  all.erase("SLURM_PROCID");
  f = resolve_launch({}, env(all));
  EXPECT_EQ(f.source, LaunchSource::kPmi);
  EXPECT_EQ(f.node_rank, 1);
}

// mpirun inside a Slurm allocation: Slurm's variables describe the job (SLURM_PROCID 0 on every
// process of the batch step), Open MPI's the rank.
TEST(LaunchEnv, MpirunInsideASlurmAllocationUsesOpenMpisRanks) {
  LaunchFacts f = resolve_launch({}, env({{"OMPI_COMM_WORLD_RANK", "1"},
                                          {"OMPI_COMM_WORLD_SIZE", "2"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                                          {"SLURM_PROCID", "0"},
                                          {"SLURM_NTASKS", "1"},
                                          {"SLURM_NODEID", "0"},
                                          {"SLURM_NNODES", "2"},
                                          {"SLURM_JOB_NODELIST", "gnode[10,20]"},
                                          {"MASTER_ADDR", "gnode10"}}));
  EXPECT_EQ(f.source, LaunchSource::kOpenMpi);
  EXPECT_EQ(f.rank, 1);
  EXPECT_EQ(f.node_rank, 1);
  EXPECT_EQ(f.nnodes, 2);
  ASSERT_EQ(f.notes.size(), 1u);
  EXPECT_THAT(f.notes[0], HasSubstr("Slurm's variables are set too and ignored: Open MPI comes first"));
}

TEST(LaunchEnv, ExpandHostlist) {
  using V = std::vector<std::string>;
  EXPECT_EQ(expand_hostlist("gnode[10,20]"), (V{"gnode10", "gnode20"}));
  EXPECT_EQ(expand_hostlist("n[01-04,7]"), (V{"n01", "n02", "n03", "n04", "n7"}));
  EXPECT_EQ(expand_hostlist("a[1-2]-b[08-09]"), (V{"a1-b08", "a1-b09", "a2-b08", "a2-b09"}));
  EXPECT_EQ(expand_hostlist("head,gpu[1-2],x"), (V{"head", "gpu1", "gpu2", "x"}));
  EXPECT_EQ(expand_hostlist("n[8-11]"), (V{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expand_hostlist("node1"), (V{"node1"}));
  for (const char* bad : {"n[1-", "n[]", "n[3-1]", "n[a-b]", "a,,b", "n[1-2]]", "n[[1]]", "n[0-99999999]"})
    EXPECT_THROW(expand_hostlist(bad), Error) << bad;
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
